#include "core/instruction_loops.hpp"

#include <immintrin.h>

#define ATTN_AVX512 __attribute__((target("avx512f,avx512bw,avx512bf16,fma")))

namespace attn::loops {

namespace {

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

ATTN_AVX512 double fma_avx512_impl(std::int64_t iterations) {
  __m512 acc[kChains];
  opaque_start(acc);
  const __m512 b = _mm512_set1_ps(0.9999f), c = _mm512_set1_ps(1e-6f);
  for (std::int64_t n = 0; n < iterations; ++n) {
#pragma GCC unroll 24
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], b, c);
  }
  return reduce(acc);
}

ATTN_AVX512 double dot_bf16_avx512_impl(std::int64_t iterations) {
  __m512 acc[kChains];
  opaque_start(acc);
  const __m512bh b = (__m512bh)_mm512_set1_epi32(0x3C003C00);  // pairs of bf16 2^-7
  for (std::int64_t n = 0; n < iterations; ++n) {
#pragma GCC unroll 24
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], b, b);
  }
  return reduce(acc);
}

}  // namespace

double fma_avx512(std::int64_t iterations) { return fma_avx512_impl(iterations); }
double dot_bf16_avx512(std::int64_t iterations) { return dot_bf16_avx512_impl(iterations); }

}  // namespace attn::loops
