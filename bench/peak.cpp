#include "bench/peak.hpp"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <vector>

#include "core/cpu.hpp"
#include "core/instruction_loops.hpp"
#include "core/thread_pool.hpp"

#define ATTN_AVX512 __attribute__((target("avx512f,avx512bw,avx512bf16,fma")))
#define ATTN_AVX2 __attribute__((target("avx2,fma")))
#define ATTN_AMX __attribute__((target("amx-tile,amx-bf16,avx512f")))

namespace attn::bench {

namespace {

using Clock = std::chrono::steady_clock;

using loops::kChains;

ATTN_AVX2 double avx2_fma_loop(std::int64_t iterations) {
  __m256 acc[kChains / 2];
  for (int i = 0; i < kChains / 2; ++i) {
    acc[i] = _mm256_set1_ps(0.001f * static_cast<float>(i + 1));
    __asm__("" : "+x"(acc[i]));
  }
  const __m256 b = _mm256_set1_ps(0.9999f), c = _mm256_set1_ps(1e-6f);
  for (std::int64_t n = 0; n < iterations; ++n) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains / 2; ++i) acc[i] = _mm256_fmadd_ps(acc[i], b, c);
  }
  __m256 s = acc[0];
  for (int i = 1; i < kChains / 2; ++i) s = _mm256_add_ps(s, acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  double total = 0;
  for (float x : lanes) total += x;
  return total;
}

// Four independent 16x16 accumulators against two A and two B tiles that stay
// in place: TDPBF16PS back to back, the AMX peak. 16 x 16 x 32 x 2 flops per
// instruction. The tile configuration is loaded and released inside, so no
// tile state outlives a call.
ATTN_AMX double amx_loop(std::int64_t iterations) {
  struct alignas(64) TileConfig {
    std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
    std::uint16_t colsb[16] = {};
    std::uint8_t rows[16] = {};
  } config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  alignas(64) static const std::uint16_t ones[16 * 32] = {};
  alignas(64) float out[16 * 16];
  _tile_loadconfig(&config);
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_loadd(6, ones, 64);
  _tile_loadd(7, ones, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (std::int64_t n = 0; n < iterations; ++n) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
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

// Runs `work(iterations)` on every thread at once, with iterations grown
// until a run takes `seconds`, then twice more at that count; returns the
// fastest run's operations per second given `ops_per_iteration` per thread.
// The fastest, as the bandwidth below: on a shared virtual machine one run
// now and then has a thread descheduled for part of it, which halved the
// bfloat16 peak of a benchmark run (docs/results, 2026-12-03).
template <typename Work>
double throughput(ThreadPool& pool, double seconds, double ops_per_iteration, Work work) {
  std::int64_t iterations = 1 << 16;
  auto timed = [&] {
    std::atomic<double> sink{0};
    const auto start = Clock::now();
    pool.on_each_thread([&](int) { sink.store(work(iterations)); });
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  for (;;) {
    const double elapsed = timed();
    if (elapsed > seconds || iterations > (std::int64_t{1} << 40)) {
      const double best = std::min({elapsed, timed(), timed()});
      return ops_per_iteration * static_cast<double>(iterations) * pool.size() / best;
    }
    iterations *= elapsed > 0.01 ? static_cast<std::int64_t>(std::max(2.0, seconds / elapsed)) : 8;
  }
}

// Sums n floats read as Streams equal runs side by side, a cache line of each
// in turn: over several streams a core keeps more lines in flight than over
// one; which count reads fastest moves with the machine's load, so the
// fastest of 1, 4 and 16 counts (2 threads here, the same minutes: 1 stream
// 28 to 42 GB/s, 4 streams 31 to 47, 16 streams 29 to 58, docs/results
// 2026-12-07; streaming's decode had read 133% of a one-stream figure).
template <int Streams>
ATTN_AVX512 double read_avx512(const float* data, std::int64_t n) {
  const std::int64_t per = n / Streams;
  __m512 sum[Streams];
  for (__m512& x : sum) x = _mm512_setzero_ps();
  for (std::int64_t i = 0; i + 64 <= per; i += 64) {
#pragma GCC unroll 8
    for (int k = 0; k < Streams; ++k) {
      const float* at = data + k * per + i;
      const __m512 line0 = _mm512_add_ps(_mm512_load_ps(at), _mm512_load_ps(at + 16));
      const __m512 line1 = _mm512_add_ps(_mm512_load_ps(at + 32), _mm512_load_ps(at + 48));
      sum[k] = _mm512_add_ps(sum[k], _mm512_add_ps(line0, line1));
    }
  }
  __m512 total = _mm512_setzero_ps();
  for (const __m512& x : sum) total = _mm512_add_ps(total, x);
  return _mm512_reduce_add_ps(total);
}

ATTN_AVX2 double read_avx2(const float* data, std::int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (std::int64_t i = 0; i + 32 <= n; i += 32) {
    s0 = _mm256_add_ps(s0, _mm256_load_ps(data + i));
    s1 = _mm256_add_ps(s1, _mm256_load_ps(data + i + 8));
    s2 = _mm256_add_ps(s2, _mm256_load_ps(data + i + 16));
    s3 = _mm256_add_ps(s3, _mm256_load_ps(data + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  double total = 0;
  for (float x : lanes) total += x;
  return total;
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
  const CpuFeatures& cpu = cpu_features();
  const bool avx512 = cpu.avx512_bf16, avx2 = cpu.avx2_fma;
  peak.isa = std::string(cpu_kernel_set());
  if (avx512) {
    peak.fp32_gflops = throughput(pool, seconds_per_test, loops::kFmaAvx512Flops, loops::fma_avx512) / 1e9;
    peak.bf16_gflops = throughput(pool, seconds_per_test, loops::kDotBf16Flops, loops::dot_bf16_avx512) / 1e9;
    if (cpu.amx_bf16) {
      peak.amx_bf16_gflops = throughput(pool, seconds_per_test, 4 * 16.0 * 16 * 32 * 2, amx_loop) / 1e9;
    }
  } else if (avx2) {
    peak.fp32_gflops = throughput(pool, seconds_per_test, kChains / 2 * 8.0 * 2, avx2_fma_loop) / 1e9;
  } else {
    peak.fp32_gflops = throughput(pool, seconds_per_test, 64.0 * 2, portable_fma_loop) / 1e9;
  }
  // 1 GiB, far past every cache; each thread reads its part, several times:
  // as one stream and (AVX-512) as 4 and 16 side by side, the fastest counts.
  // Each part a multiple of 16 streams' cache lines (so every run starts on
  // a line, whatever the thread count); what they hold is what is counted.
  const std::int64_t n = std::int64_t{1} << 28;
  const std::int64_t per = n / pool.size() / 1024 * 1024;
  float* data = static_cast<float*>(std::aligned_alloc(64, static_cast<std::size_t>(n) * sizeof(float)));
  pool.on_each_thread([&](int worker) {
    std::memset(data + worker * per, 0, static_cast<std::size_t>(per) * sizeof(float));
  });
  double best = 0;
  for (const int streams : avx512 ? std::vector<int>{1, 4, 16} : std::vector<int>{1}) {
    for (int pass = 0; pass < 3; ++pass) {
      std::atomic<double> sink{0};
      const auto start = Clock::now();
      pool.on_each_thread([&](int worker) {
        const float* part = data + worker * per;
        sink.store(avx512 ? (streams == 16  ? read_avx512<16>(part, per)
                             : streams == 4 ? read_avx512<4>(part, per)
                                            : read_avx512<1>(part, per))
                   : avx2 ? read_avx2(part, per)
                          : read_portable(part, per));
      });
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      best = std::max(best, static_cast<double>(per * pool.size()) * sizeof(float) / elapsed / 1e9);
    }
  }
  std::free(data);
  peak.bandwidth_gbs = best;
  return peak;
}

}  // namespace attn::bench
