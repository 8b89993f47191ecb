// The CPU backends' thread pool: every task of every call runs exactly once,
// whether the workers catch the next call while they spin or have gone to
// sleep, in a pool that spins (no more threads than CPUs) and in one that
// never does (more threads than CPUs); an exception in a task reaches the
// caller and leaves the pool usable. The CPUs a container's cgroup quota
// allows cap the default thread count (and so whether workers spin).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/thread_pool.hpp"

using namespace attn;

namespace {

// Runs `calls` parallel_for calls of varying sizes on `pool`, pausing `idle`
// between them, and checks that each task ran once, on a valid worker.
void expect_each_task_once(ThreadPool& pool, int calls, std::chrono::microseconds idle) {
  const std::int64_t sizes[] = {1, 2, 3, 17, 1000};
  for (int call = 0; call < calls; ++call) {
    const std::int64_t tasks = sizes[call % 5];
    std::vector<std::atomic<int>> ran(static_cast<std::size_t>(tasks));
    std::atomic<int> bad_worker{0};
    pool.parallel_for(tasks, [&](std::int64_t t, int worker) {
      ran[static_cast<std::size_t>(t)].fetch_add(1);
      if (worker < 0 || worker >= pool.size()) bad_worker.fetch_add(1);
    });
    for (std::int64_t t = 0; t < tasks; ++t) ASSERT_EQ(ran[static_cast<std::size_t>(t)].load(), 1) << "call " << call << ", task " << t;
    ASSERT_EQ(bad_worker.load(), 0);
    std::vector<std::atomic<int>> each(static_cast<std::size_t>(pool.size()));
    pool.on_each_thread([&](int worker) { each[static_cast<std::size_t>(worker)].fetch_add(1); });
    for (int w = 0; w < pool.size(); ++w) ASSERT_EQ(each[static_cast<std::size_t>(w)].load(), 1) << "call " << call << ", worker " << w;
    if (idle.count() > 0) std::this_thread::sleep_for(idle);
  }
}

}  // namespace

TEST(ThreadPool, EveryTaskRunsOnceBackToBackAndAfterTheWorkersSlept) {
  const int cpus = resolve_threads(0);
  // Two threads (spinning where the machine has two CPUs), and more threads
  // than CPUs (never spinning): calls back to back, which spinning workers
  // catch, and calls 2 ms apart, past any spin, which wake sleeping ones.
  for (int threads : {2, 2 * cpus + 1}) {
    SCOPED_TRACE(threads);
    ThreadPool& pool = ThreadPool::get(threads);
    ASSERT_EQ(pool.size(), threads);
    expect_each_task_once(pool, 500, std::chrono::microseconds(0));
    expect_each_task_once(pool, 10, std::chrono::microseconds(2000));
  }
}

TEST(ThreadPool, AnExceptionInATaskReachesTheCallerAndThePoolGoesOn) {
  ThreadPool& pool = ThreadPool::get(2);
  for (std::int64_t thrower : {0, 1, 999}) {  // the caller's first task, a worker's likely one, the last
    EXPECT_THROW(pool.parallel_for(1000,
                                   [&](std::int64_t t, int) {
                                     if (t == thrower) throw std::runtime_error("task failed");
                                   }),
                 std::runtime_error);
    expect_each_task_once(pool, 5, std::chrono::microseconds(0));
  }
  EXPECT_THROW(pool.on_each_thread([](int worker) {
    if (worker == 1) throw std::runtime_error("worker failed");
  }),
               std::runtime_error);
  expect_each_task_once(pool, 5, std::chrono::microseconds(0));
}

TEST(ThreadPool, ACgroupQuotaCapsTheCpusAvailable) {
  EXPECT_EQ(cpu_quota_of("200000 100000"), 2.0);
  EXPECT_EQ(cpu_quota_of("150000 100000"), 1.5);
  EXPECT_EQ(cpu_quota_of("50000 100000\n"), 0.5);
  EXPECT_EQ(cpu_quota_of("max 100000"), 0.0);  // no limit
  EXPECT_EQ(cpu_quota_of("-1 100000"), 0.0);   // cgroup v1's "no limit"
  EXPECT_EQ(cpu_quota_of(""), 0.0);
  EXPECT_EQ(cpu_quota_of("200000"), 0.0);
  EXPECT_EQ(cpu_quota_of("2x 100000"), 0.0);
  EXPECT_EQ(cpu_quota_of("100000 0"), 0.0);
  const int cpus = available_cpus();
  EXPECT_GE(cpus, 1);
  EXPECT_LE(cpus, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}
