// A persistent pool of worker threads, each pinned to its own CPU, for the
// CPU backends. Threads are created once and parked between calls: this VM
// tends to pack short-lived threads onto one CPU, and creating threads per
// call would cost more than small attention problems take.
#pragma once

#include <cstdint>
#include <functional>

namespace attn {

// Threads a backend should use: `requested` when positive, else
// OMP_NUM_THREADS when set, else the CPUs this process may run on.
int resolve_threads(int requested);

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
