#include "bench/peak.hpp"

#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <vector>

#include "core/thread_pool.hpp"
#include "impls/cpu_kernels/kernels.hpp"

#define ATTN_AVX512 __attribute__((target("avx512f,avx512bw,avx512bf16,fma")))

namespace attn::bench {

namespace {

using Clock = std::chrono::steady_clock;

// N independent accumulator chains, enough to cover the latency on every
// pipe. Each chain starts from a value the compiler cannot see (the empty asm
// below), so it cannot prove the chains equal and fold them into one: an
// earlier version started them all from the same constant, GCC computed a
// single latency-bound chain while the count assumed 16, and the "peak" came
// out about twice the real one (600 GFLOP/s against 245-327 measured since).
template <int N> ATTN_AVX512 inline void opaque_start(__m512 (&acc)[N]) {
  for (int i = 0; i < N; ++i) {
    acc[i] = _mm512_set1_ps(0.001f * static_cast<float>(i + 1));
    __asm__("" : "+v"(acc[i]));
  }
}

template <int N> ATTN_AVX512 inline double reduce(__m512 (&acc)[N]) {
  __m512 s = acc[0];
  for (int i = 1; i < N; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

constexpr int kChains = 24;

ATTN_AVX512 double fma_loop(std::int64_t iterations) {
  __m512 acc[kChains];
  opaque_start(acc);
  const __m512 b = _mm512_set1_ps(0.9999f), c = _mm512_set1_ps(1e-6f);
  for (std::int64_t n = 0; n < iterations; ++n) {
#pragma GCC unroll 24
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], b, c);
  }
  return reduce(acc);
}

ATTN_AVX512 double dot_loop(std::int64_t iterations) {
  __m512 acc[kChains];
  opaque_start(acc);
  const __m512bh b = (__m512bh)_mm512_set1_epi32(0x3C003C00);  // pairs of bf16 2^-7
  for (std::int64_t n = 0; n < iterations; ++n) {
#pragma GCC unroll 24
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], b, b);
  }
  return reduce(acc);
}

double portable_fma_loop(std::int64_t iterations) {
  float a[64];
  for (int i = 0; i < 64; ++i) {
    a[i] = 0.001f * static_cast<float>(i + 1);
    __asm__("" : "+m"(a[i]));
  }
  for (std::int64_t n = 0; n < iterations; ++n)
    for (float& x : a) x = x * 0.9999f + 1e-6f;
  double s = 0;
  for (float x : a) s += x;
  return s;
}

// Runs `work(iterations)` on every thread at once until `seconds` have passed;
// returns operations per second given `ops_per_iteration` per thread.
template <typename Work>
double throughput(ThreadPool& pool, double seconds, double ops_per_iteration, Work work) {
  std::int64_t iterations = 1 << 16;
  for (;;) {
    std::atomic<double> sink{0};
    const auto start = Clock::now();
    pool.on_each_thread([&](int) { sink.store(work(iterations)); });
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (elapsed > seconds || iterations > (std::int64_t{1} << 40)) {
      return ops_per_iteration * static_cast<double>(iterations) * pool.size() / elapsed;
    }
    iterations *= elapsed > 0.01 ? static_cast<std::int64_t>(std::max(2.0, seconds / elapsed)) : 8;
  }
}

ATTN_AVX512 double read_avx512(const float* data, std::int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (std::int64_t i = 0; i + 64 <= n; i += 64) {
    s0 = _mm512_add_ps(s0, _mm512_load_ps(data + i));
    s1 = _mm512_add_ps(s1, _mm512_load_ps(data + i + 16));
    s2 = _mm512_add_ps(s2, _mm512_load_ps(data + i + 32));
    s3 = _mm512_add_ps(s3, _mm512_load_ps(data + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

double read_portable(const float* data, std::int64_t n) {
  double s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += data[i];
  return s;
}

}  // namespace

MachinePeak measure_peak(int threads, double seconds_per_test) {
  MachinePeak peak;
  peak.threads = resolve_threads(threads);
  ThreadPool& pool = ThreadPool::get(peak.threads);
  const bool avx512 = cpu::avx512_kernels() != nullptr;
  peak.isa = cpu::best_kernels().isa;
  if (avx512) {
    peak.fp32_gflops = throughput(pool, seconds_per_test, kChains * 16.0 * 2, fma_loop) / 1e9;
    peak.bf16_gflops = throughput(pool, seconds_per_test, kChains * 16.0 * 4, dot_loop) / 1e9;
    if (cpu::amx_kernels()) {
      peak.amx_bf16_gflops = throughput(pool, seconds_per_test, 4 * 16.0 * 16 * 32 * 2, cpu::amx_peak_loop) / 1e9;
    }
  } else {
    peak.fp32_gflops = throughput(pool, seconds_per_test, 64.0 * 2, portable_fma_loop) / 1e9;
  }
  // 1 GiB, far past every cache; each thread reads its half, several times.
  const std::int64_t n = std::int64_t{1} << 28;
  float* data = static_cast<float*>(std::aligned_alloc(64, static_cast<std::size_t>(n) * sizeof(float)));
  pool.on_each_thread([&](int worker) {
    const std::int64_t per = n / pool.size();
    std::memset(data + worker * per, 0, static_cast<std::size_t>(per) * sizeof(float));
  });
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    std::atomic<double> sink{0};
    const auto start = Clock::now();
    pool.on_each_thread([&](int worker) {
      const std::int64_t per = n / pool.size();
      sink.store(avx512 ? read_avx512(data + worker * per, per) : read_portable(data + worker * per, per));
    });
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::max(best, static_cast<double>(n) * sizeof(float) / elapsed / 1e9);
  }
  std::free(data);
  peak.bandwidth_gbs = best;
  return peak;
}

}  // namespace attn::bench
