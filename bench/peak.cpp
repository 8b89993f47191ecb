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

// 16 independent accumulators: enough to cover the FMA latency on two pipes.
ATTN_AVX512 double fma_loop(std::int64_t iterations) {
  __m512 a0 = _mm512_set1_ps(0.1f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  __m512 a8 = a0, a9 = a0, a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0, a15 = a0;
  const __m512 b = _mm512_set1_ps(0.9999f), c = _mm512_set1_ps(1e-6f);
  for (std::int64_t n = 0; n < iterations; ++n) {
    a0 = _mm512_fmadd_ps(a0, b, c); a1 = _mm512_fmadd_ps(a1, b, c); a2 = _mm512_fmadd_ps(a2, b, c);
    a3 = _mm512_fmadd_ps(a3, b, c); a4 = _mm512_fmadd_ps(a4, b, c); a5 = _mm512_fmadd_ps(a5, b, c);
    a6 = _mm512_fmadd_ps(a6, b, c); a7 = _mm512_fmadd_ps(a7, b, c); a8 = _mm512_fmadd_ps(a8, b, c);
    a9 = _mm512_fmadd_ps(a9, b, c); a10 = _mm512_fmadd_ps(a10, b, c); a11 = _mm512_fmadd_ps(a11, b, c);
    a12 = _mm512_fmadd_ps(a12, b, c); a13 = _mm512_fmadd_ps(a13, b, c); a14 = _mm512_fmadd_ps(a14, b, c);
    a15 = _mm512_fmadd_ps(a15, b, c);
  }
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                           _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)),
                                     _mm512_add_ps(_mm512_add_ps(a12, a13), _mm512_add_ps(a14, a15))));
  return _mm512_reduce_add_ps(s);
}

ATTN_AVX512 double dot_loop(std::int64_t iterations) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  __m512 a8 = a0, a9 = a0, a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0, a15 = a0;
  const __m512bh b = (__m512bh)_mm512_set1_epi32(0x3C003C00);  // pairs of bf16 2^-7
  for (std::int64_t n = 0; n < iterations; ++n) {
    a0 = _mm512_dpbf16_ps(a0, b, b); a1 = _mm512_dpbf16_ps(a1, b, b); a2 = _mm512_dpbf16_ps(a2, b, b);
    a3 = _mm512_dpbf16_ps(a3, b, b); a4 = _mm512_dpbf16_ps(a4, b, b); a5 = _mm512_dpbf16_ps(a5, b, b);
    a6 = _mm512_dpbf16_ps(a6, b, b); a7 = _mm512_dpbf16_ps(a7, b, b); a8 = _mm512_dpbf16_ps(a8, b, b);
    a9 = _mm512_dpbf16_ps(a9, b, b); a10 = _mm512_dpbf16_ps(a10, b, b); a11 = _mm512_dpbf16_ps(a11, b, b);
    a12 = _mm512_dpbf16_ps(a12, b, b); a13 = _mm512_dpbf16_ps(a13, b, b); a14 = _mm512_dpbf16_ps(a14, b, b);
    a15 = _mm512_dpbf16_ps(a15, b, b);
  }
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                           _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)),
                                     _mm512_add_ps(_mm512_add_ps(a12, a13), _mm512_add_ps(a14, a15))));
  return _mm512_reduce_add_ps(s);
}

double portable_fma_loop(std::int64_t iterations) {
  float a[64];
  for (float& x : a) x = 0.1f;
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
  peak.isa = avx512 ? "avx512_bf16" : "portable";
  if (avx512) {
    peak.fp32_gflops = throughput(pool, seconds_per_test, 16.0 * 16 * 2, fma_loop) / 1e9;
    peak.bf16_gflops = throughput(pool, seconds_per_test, 16.0 * 16 * 4, dot_loop) / 1e9;
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
