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

}  // namespace attn
