#include "core/thread_pool.hpp"

#include "core/float_state.hpp"

#include <pthread.h>
#include <sched.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cfenv>
#include <condition_variable>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace attn {

double cpu_quota_of(std::string_view cpu_max) {
  std::istringstream in{std::string(cpu_max)};
  std::string quota;
  double period = 0;
  if (!(in >> quota >> period) || quota == "max" || period <= 0) return 0;
  char* end = nullptr;
  const double q = std::strtod(quota.c_str(), &end);
  return end && *end == '\0' && q > 0 ? q / period : 0;
}

namespace {

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// cgroup v1's quota and period in `dir` as a cpu.max line ("-1": none).
std::string v1_cpu_max(const std::string& dir) {
  const std::string quota = first_line(dir + "/cpu.cfs_quota_us");
  return quota.empty() || quota.front() == '-' ? std::string() : quota + " " + first_line(dir + "/cpu.cfs_period_us");
}

// The CPU time the process's cgroup may use, in CPUs (0: no limit found):
// its own group's (cgroup v2's cpu.max; v1's cfs quota and period), else
// the namespace root's (a container's own).
double cgroup_cpu_quota() {
  std::ifstream groups("/proc/self/cgroup");
  for (std::string line; std::getline(groups, line);) {
    const auto colon = line.find(':'), second = line.find(':', colon + 1);
    if (colon == std::string::npos || second == std::string::npos) continue;
    std::string controllers = ",";  // ",cpu,cpuacct," (v1), ",," (v2)
    controllers.append(line, colon + 1, second - colon - 1).append(",");
    const std::string path = line.substr(second + 1);
    double q = 0;
    if (controllers == ",,") q = cpu_quota_of(first_line("/sys/fs/cgroup" + path + "/cpu.max"));
    else if (controllers.find(",cpu,") != std::string::npos) q = cpu_quota_of(v1_cpu_max("/sys/fs/cgroup/cpu" + path));
    if (q > 0) return q;
  }
  if (const double q = cpu_quota_of(first_line("/sys/fs/cgroup/cpu.max")); q > 0) return q;
  return cpu_quota_of(v1_cpu_max("/sys/fs/cgroup/cpu"));
}

}  // namespace

int available_cpus() {
  static const int cpus = [] {
    int n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = std::max(1, CPU_COUNT(&set));
    if (const double quota = cgroup_cpu_quota(); quota > 0) n = std::clamp(static_cast<int>(std::ceil(quota)), 1, n);
    return n;
  }();
  return cpus;
}

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  return available_cpus();
}

namespace {
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

void pin_to(std::thread::native_handle_type handle, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(handle, sizeof set, &set);
}

// How long a thread spins on an atomic before it sleeps on the condition
// variable: a worker after its job (the next call often follows at once: a
// decode step, a benchmark's loop), the caller while the workers finish.
// Waking a sleeping thread takes tens of microseconds on these VMs, as long
// as a small decode takes whole: a second thread that wakes that late finds
// the tasks already taken. Only while the pool has no more threads than
// available_cpus() (affinity and cgroup quota): oversubscribed, a spinning
// thread would take the CPU, or the container's quota, from one that still
// computes.
constexpr auto kSpin = std::chrono::microseconds(200);

// Spins until done() or the spin's time is up; true when done().
template <class Done>
bool spin_until(Done done, bool spin) {
  if (!spin) return done();
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (done()) return true;
    cpu_relax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > until) return done();
  }
}
}  // namespace

struct ThreadPool::State {
  std::mutex mutex;
  std::condition_variable wake, done;
  std::atomic<std::uint64_t> generation{0};  // bumped (under mutex) for each job
  std::atomic<int> running{0};               // workers still in the current job
  bool stop = false;                         // under mutex
  bool spin = false;                         // no more threads than available_cpus()
  const std::function<void(int)>* job = nullptr;  // written before generation's bump
  std::vector<std::thread> workers;
  std::exception_ptr error;
};

ThreadPool::ThreadPool(int threads) : state_(new State), threads_(std::max(1, threads)) {
  std::vector<int> cpus = allowed_cpus();
  state_->spin = threads_ <= available_cpus();
  // Workers 1..n-1 are pool threads; worker 0 is whoever calls.
  for (int w = 1; w < threads_; ++w) {
    state_->workers.emplace_back([this, w] {
      // A new thread inherits its creator's floating-point state, which a
      // backend may have changed (flush-to-zero): start from the default.
      std::fesetenv(FE_DFL_ENV);
      std::uint64_t seen = 0;
      State& st = *state_;
      for (;;) {
        const std::function<void(int)>* job;
        if (!spin_until([&] { return st.generation.load(std::memory_order_acquire) != seen; }, st.spin)) {
          std::unique_lock lock(st.mutex);
          st.wake.wait(lock, [&] { return st.stop || st.generation.load(std::memory_order_acquire) != seen; });
          if (st.stop) return;
        }
        {
          std::lock_guard lock(st.mutex);  // job and stop are read under the mutex that wrote them
          if (st.stop) return;
          seen = st.generation.load(std::memory_order_acquire);
          job = st.job;
        }
        try {
          const FloatStateGuard floats;  // a job may set flush-to-zero: the next one must not inherit it
          (*job)(w);
        } catch (...) {
          std::lock_guard lock(st.mutex);
          if (!st.error) st.error = std::current_exception();
        }
        if (st.running.fetch_sub(1, std::memory_order_acq_rel) == 1) {
          std::lock_guard lock(st.mutex);  // the caller checks running under it before it sleeps
          st.done.notify_all();
        }
      }
    });
    if (cpus.size() >= static_cast<std::size_t>(threads_)) pin_to(state_->workers.back().native_handle(), cpus[static_cast<std::size_t>(w)]);
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(state_->mutex);
    state_->stop = true;
    state_->generation.fetch_add(1, std::memory_order_release);  // ends a spin
  }
  state_->wake.notify_all();
  for (auto& t : state_->workers) t.join();
  delete state_;
}

ThreadPool& ThreadPool::get(int threads) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  std::lock_guard lock(mutex);
  auto& pool = pools[threads];
  if (!pool) pool.reset(new ThreadPool(threads));
  return *pool;
}

void ThreadPool::on_each_thread(const std::function<void(int)>& fn) {
  if (threads_ == 1) {
    fn(0);
    return;
  }
  State& st = *state_;
  {
    std::lock_guard lock(st.mutex);
    st.job = &fn;
    st.running.store(threads_ - 1, std::memory_order_relaxed);
    st.error = nullptr;
    st.generation.fetch_add(1, std::memory_order_release);
  }
  st.wake.notify_all();
  std::exception_ptr mine;
  try {
    fn(0);
  } catch (...) {
    mine = std::current_exception();
  }
  if (!spin_until([&] { return st.running.load(std::memory_order_acquire) == 0; }, st.spin)) {
    std::unique_lock lock(st.mutex);
    st.done.wait(lock, [&] { return st.running.load(std::memory_order_acquire) == 0; });
  }
  std::lock_guard lock(st.mutex);  // error, written under it
  if (mine) std::rethrow_exception(mine);
  if (st.error) std::rethrow_exception(st.error);
}

void ThreadPool::parallel_for(std::int64_t tasks, const std::function<void(std::int64_t, int)>& fn) {
  if (tasks <= 0) return;
  if (threads_ == 1 || tasks == 1) {
    for (std::int64_t t = 0; t < tasks; ++t) fn(t, 0);
    return;
  }
  std::atomic<std::int64_t> next{0};
  on_each_thread([&](int worker) {
    for (std::int64_t t = next.fetch_add(1); t < tasks; t = next.fetch_add(1)) fn(t, worker);
  });
}

void run_on_new_threads(int workers, const std::function<void(int)>& work) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(std::max(workers, 1)));
  auto guarded = [&](int worker) {
    try {
      work(worker);
    } catch (...) {
      errors[static_cast<std::size_t>(worker)] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (int w = 1; w < workers; ++w) threads.emplace_back(guarded, w);
  guarded(0);
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace attn
