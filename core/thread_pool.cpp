#include "core/thread_pool.hpp"

#include "core/float_state.hpp"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <cfenv>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace attn {

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

namespace {
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
}  // namespace

struct ThreadPool::State {
  std::mutex mutex;
  std::condition_variable wake, done;
  std::uint64_t generation = 0;
  int running = 0;
  bool stop = false;
  const std::function<void(int)>* job = nullptr;
  std::vector<std::thread> workers;
  std::exception_ptr error;
};

ThreadPool::ThreadPool(int threads) : state_(new State), threads_(std::max(1, threads)) {
  std::vector<int> cpus = allowed_cpus();
  // Workers 1..n-1 are pool threads; worker 0 is whoever calls.
  for (int w = 1; w < threads_; ++w) {
    state_->workers.emplace_back([this, w] {
      // A new thread inherits its creator's floating-point state, which a
      // backend may have changed (flush-to-zero): start from the default.
      std::fesetenv(FE_DFL_ENV);
      std::uint64_t seen = 0;
      for (;;) {
        const std::function<void(int)>* job;
        {
          std::unique_lock lock(state_->mutex);
          state_->wake.wait(lock, [&] { return state_->stop || state_->generation != seen; });
          if (state_->stop) return;
          seen = state_->generation;
          job = state_->job;
        }
        try {
          const FloatStateGuard floats;  // a job may set flush-to-zero: the next one must not inherit it
          (*job)(w);
        } catch (...) {
          std::lock_guard lock(state_->mutex);
          if (!state_->error) state_->error = std::current_exception();
        }
        std::lock_guard lock(state_->mutex);
        if (--state_->running == 0) state_->done.notify_all();
      }
    });
    if (cpus.size() >= static_cast<std::size_t>(threads_)) pin_to(state_->workers.back().native_handle(), cpus[static_cast<std::size_t>(w)]);
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(state_->mutex);
    state_->stop = true;
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
  {
    std::lock_guard lock(state_->mutex);
    state_->job = &fn;
    state_->running = threads_ - 1;
    state_->error = nullptr;
    ++state_->generation;
  }
  state_->wake.notify_all();
  std::exception_ptr mine;
  try {
    fn(0);
  } catch (...) {
    mine = std::current_exception();
  }
  std::unique_lock lock(state_->mutex);
  state_->done.wait(lock, [&] { return state_->running == 0; });
  if (mine) std::rethrow_exception(mine);
  if (state_->error) std::rethrow_exception(state_->error);
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
