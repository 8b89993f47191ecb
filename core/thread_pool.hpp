// A persistent pool of worker threads, each pinned to its own CPU, for the
// CPU backends. Threads are created once and parked between calls: this VM
// tends to pack short-lived threads onto one CPU, and creating threads per
// call would cost more than small attention problems take.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

namespace attn {

// Threads a backend should use: `requested` when positive, else
// OMP_NUM_THREADS when set, else available_cpus().
int resolve_threads(int requested);

// The CPUs this process may run on (its affinity mask), fewer when its
// cgroup's CPU quota allows less time (a container limited to 2 CPUs on a
// 64-core host: 2). Asked once.
int available_cpus();

// The CPUs a cgroup v2 cpu.max line allows ("200000 100000": 2), 0 for no
// limit ("max 100000") or a line it cannot read. v1's "quota period" alike.
double cpu_quota_of(std::string_view cpu_max);

class ThreadPool {
 public:
  // The shared pool with `threads` workers (the caller counts as one).
  static ThreadPool& get(int threads);

  int size() const { return threads_; }
  // Calls fn(task, worker) for task in [0, tasks); tasks are handed out
  // dynamically. Returns when all are done. Exceptions from fn are rethrown.
  void parallel_for(std::int64_t tasks, const std::function<void(std::int64_t task, int worker)>& fn);
  // Calls fn(worker) once on each of the pool's threads.
  void on_each_thread(const std::function<void(int worker)>& fn);

  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

 private:
  explicit ThreadPool(int threads);
  struct State;
  State* state_;
  int threads_;
};

// Runs work(0) on the calling thread and work(1..workers-1) on new threads,
// joins them, and rethrows the first exception any of them threw (an
// exception escaping a std::thread would end the process: an allocation that
// fails in the verifier's reference must be an error, not an abort).
void run_on_new_threads(int workers, const std::function<void(int)>& work);

}  // namespace attn
