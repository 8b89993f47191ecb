// AVX-512 micro-kernels (AVX512F/BW/VL + AVX512_BF16's vdpbf16ps). Compiled
// with target attributes so the rest of the build stays baseline x86-64; used
// only when the CPU reports these features. Compiled twice: the avx512_bf16
// set, and with ATTN_KERNELS_VBMI the avx512_vbmi set, the same kernels
// allowed AVX512_VBMI's byte permutes, with which the decode kernels turn
// fp8 codes into bfloat16 64 at a time (the same bits, in fewer instructions).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "core/cpu.hpp"
#include "impls/cpu_kernels/kernels.hpp"

#if defined(ATTN_KERNELS_VBMI)
#define ATTN_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,fma")))
#else
#define ATTN_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")))
#endif

namespace attn::cpu {

namespace {

constexpr int kRowsPerStep = 6;  // 6 rows x 4 vectors = 24 accumulators

// S rows [0, NR), columns [0, 16 NC) of a 64-key tile: NR x NC accumulators
// over head_dim, and each row's maximum taken from the accumulators before
// they leave registers.
template <int NR, int NC>
ATTN_AVX512 void qk_f32_rows(const float* q, std::int64_t head_dim, const float* kp, float* s, float* row_max) {
  __m512 acc[NR][NC];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_setzero_ps();
  for (std::int64_t d = 0; d < head_dim; ++d) {
    const float* k = kp + d * kKeyBlock;
    __m512 kv[NC];
#pragma GCC unroll 4
    for (int c = 0; c < NC; ++c) kv[c] = _mm512_loadu_ps(k + 16 * c);
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      __m512 qb = _mm512_set1_ps(q[r * head_dim + d]);
#pragma GCC unroll 4
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_fmadd_ps(qb, kv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) {
    __m512 m = acc[r][0];
#pragma GCC unroll 4
    for (int c = 0; c < NC; ++c) {
      _mm512_storeu_ps(s + r * kKeyBlock + 16 * c, acc[r][c]);
      m = _mm512_max_ps(m, acc[r][c]);
    }
    row_max[r] = _mm512_reduce_max_ps(m);
  }
}

template <int NR, int NC>
ATTN_AVX512 void qk_bf16_rows(const bf16* q, std::int64_t pairs, const bf16* kp, float* s, float* row_max) {
  __m512 acc[NR][NC];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_setzero_ps();
  for (std::int64_t dp = 0; dp < pairs; ++dp) {
    const bf16* k = kp + dp * kKeyBlock * 2;
    __m512bh kv[NC];
#pragma GCC unroll 4
    for (int c = 0; c < NC; ++c) kv[c] = (__m512bh)_mm512_loadu_si512(k + 32 * c);
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      std::int32_t pair;
      std::memcpy(&pair, q + r * pairs * 2 + 2 * dp, sizeof pair);
      __m512bh qb = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 4
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], qb, kv[c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(s + r * kKeyBlock + 16 * c, acc[r][c]);
  if (!row_max) return;
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) {
    __m512 m = acc[r][0];
#pragma GCC unroll 4
    for (int c = 1; c < NC; ++c) m = _mm512_max_ps(m, acc[r][c]);
    row_max[r] = _mm512_reduce_max_ps(m);
  }
}

// O rows [0, NR), columns [0, 16 NV): += P V over `keys` keys.
template <int NR, int NV>
ATTN_AVX512 void pv_f32_block(const float* p, std::int64_t keys, const float* v, std::int64_t ldv, std::int64_t dv_pad,
                              float* o) {
  // Fully unrolled, so the accumulators live in registers from load to store
  // (without the pragmas GCC keeps a copy of the array on the stack).
  __m512 acc[NR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_loadu_ps(o + r * dv_pad + 16 * c);
  for (std::int64_t j = 0; j < keys; ++j) {
    __m512 vj[NV];
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) vj[c] = _mm512_loadu_ps(v + j * ldv + 16 * c);
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      __m512 pb = _mm512_set1_ps(p[r * kKeyBlock + j]);
#pragma GCC unroll 4
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_fmadd_ps(pb, vj[c], acc[r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) _mm512_storeu_ps(o + r * dv_pad + 16 * c, acc[r][c]);
}

template <int NR, int NV>
ATTN_AVX512 void pv_bf16_block(const bf16* p, std::int64_t keys, const bf16* vp, std::int64_t dv_pad, float* o) {
  __m512 acc[NR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_loadu_ps(o + r * dv_pad + 16 * c);
  for (std::int64_t jp = 0; jp < keys / 2; ++jp) {
    __m512bh vj[NV];
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) vj[c] = (__m512bh)_mm512_loadu_si512(vp + jp * dv_pad * 2 + 32 * c);
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      std::int32_t pair;
      std::memcpy(&pair, p + r * kKeyBlock + 2 * jp, sizeof pair);
      __m512bh pb = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 8
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], pb, vj[c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) _mm512_storeu_ps(o + r * dv_pad + 16 * c, acc[r][c]);
}

template <typename Fn, std::size_t... I>
constexpr auto make_table(Fn fn, std::index_sequence<I...>) {
  return std::array{fn(std::integral_constant<int, static_cast<int>(I) + 1>{})...};
}

// Kernel tables by column vectors (1 to 4) and rows (1 to kRowsPerStep).
template <int NC> struct QkTables {
  using F32 = void (*)(const float*, std::int64_t, const float*, float*, float*);
  using BF16 = void (*)(const bf16*, std::int64_t, const bf16*, float*, float*);
  static constexpr auto f32 = make_table([](auto n) -> F32 { return &qk_f32_rows<decltype(n)::value, NC>; },
                                         std::make_index_sequence<kRowsPerStep>{});
  static constexpr auto b16 = make_table([](auto n) -> BF16 { return &qk_bf16_rows<decltype(n)::value, NC>; },
                                         std::make_index_sequence<kRowsPerStep>{});
};

template <typename Table>
const auto& pick(std::int64_t nv, const Table& t1, const Table& t2, const Table& t3, const Table& t4) {
  return nv == 1 ? t1 : nv == 2 ? t2 : nv == 3 ? t3 : t4;
}

ATTN_AVX512 void qk_f32(const float* q, std::int64_t rows, std::int64_t head_dim, const float* kp, float* s,
                        float* row_max, std::int64_t cols) {
  const auto& table = pick(cols / 16, QkTables<1>::f32, QkTables<2>::f32, QkTables<3>::f32, QkTables<4>::f32);
  for (std::int64_t r = 0; r < rows; r += kRowsPerStep) {
    std::int64_t n = std::min<std::int64_t>(kRowsPerStep, rows - r);
    table[static_cast<std::size_t>(n - 1)](q + r * head_dim, head_dim, kp, s + r * kKeyBlock, row_max + r);
  }
}

ATTN_AVX512 void qk_bf16(const bf16* q, std::int64_t rows, std::int64_t pairs, const bf16* kp, float* s, float* row_max,
                         std::int64_t cols) {
  const auto& table = pick(cols / 16, QkTables<1>::b16, QkTables<2>::b16, QkTables<3>::b16, QkTables<4>::b16);
  for (std::int64_t r = 0; r < rows; r += kRowsPerStep) {
    std::int64_t n = std::min<std::int64_t>(kRowsPerStep, rows - r);
    table[static_cast<std::size_t>(n - 1)](q + r * pairs * 2, pairs, kp, s + r * kKeyBlock, row_max ? row_max + r : nullptr);
  }
}

template <int NV> struct PvTables {
  using F32 = void (*)(const float*, std::int64_t, const float*, std::int64_t, std::int64_t, float*);
  using BF16 = void (*)(const bf16*, std::int64_t, const bf16*, std::int64_t, float*);
  static constexpr auto f32 = make_table([](auto n) -> F32 { return &pv_f32_block<decltype(n)::value, NV>; },
                                         std::make_index_sequence<kRowsPerStep>{});
  static constexpr auto b16 = make_table([](auto n) -> BF16 { return &pv_bf16_block<decltype(n)::value, NV>; },
                                         std::make_index_sequence<kRowsPerStep>{});
};

ATTN_AVX512 void pv_f32(const float* p, std::int64_t rows, std::int64_t keys, const float* v, std::int64_t ldv,
                        std::int64_t dv_pad, float* o) {
  for (std::int64_t c0 = 0; c0 < dv_pad; c0 += 64) {
    std::int64_t nv = std::min<std::int64_t>(4, (dv_pad - c0) / 16);
    const auto& table = pick(nv, PvTables<1>::f32, PvTables<2>::f32, PvTables<3>::f32, PvTables<4>::f32);
    for (std::int64_t r = 0; r < rows; r += kRowsPerStep) {
      std::int64_t n = std::min<std::int64_t>(kRowsPerStep, rows - r);
      table[static_cast<std::size_t>(n - 1)](p + r * kKeyBlock, keys, v + c0, ldv, dv_pad, o + r * dv_pad + c0);
    }
  }
}

ATTN_AVX512 void pv_bf16(const bf16* p, std::int64_t rows, std::int64_t keys, const bf16* vp, std::int64_t dv_pad,
                         float* o) {
  for (std::int64_t c0 = 0; c0 < dv_pad; c0 += 64) {
    std::int64_t nv = std::min<std::int64_t>(4, (dv_pad - c0) / 16);
    const auto& table = pick(nv, PvTables<1>::b16, PvTables<2>::b16, PvTables<3>::b16, PvTables<4>::b16);
    for (std::int64_t r = 0; r < rows; r += kRowsPerStep) {
      std::int64_t n = std::min<std::int64_t>(kRowsPerStep, rows - r);
      table[static_cast<std::size_t>(n - 1)](p + r * kKeyBlock, keys, vp + c0 * 2, dv_pad, o + r * dv_pad + c0);
    }
  }
}

// 2^t for t = scale * x - m > -126 (one FMA), exactly 0 below (where the
// true value is under 2^-126 of the row's largest weight, 1) and for hidden
// keys (-inf). vscalefps scales by 2^floor(t), and f = t - floor(t) in [0, 1)
// (vreduceps) goes through a degree-6 polynomial with p(0) = 1, fitted to 2^f
// on [0, 1) for relative error: at most 7.4e-8 against exp2 in double over
// 2^22 points of (-126, 0] (a test holds it under 1e-7; a degree-5 fit gave
// 1.6e-7 in a float32 simulation). The masked vscalefps writes the zeros:
// letting vscalefps underflow (from -inf, or from a large finite negative
// bias) costs a microcode assist per vector, and causal runs spent a quarter
// of their time there. 10 instructions a vector, where rounding, a separate
// fraction, a degree-7 polynomial and the -inf masks took 13.
// A shift of the weights by 2^-shift goes into the coefficients (a power of
// two times each of them scales every Horner step exactly) and into the
// threshold, so no result is subnormal.
struct Exp2Constants {
  __m512 c[7];
  __m512 floor_t;  // t must be above this: -126 + shift
  ATTN_AVX512 explicit Exp2Constants(int shift) {
    static constexpr float kCoefficients[7] = {2.16138083e-04f, 1.24673767e-03f, 9.67553258e-03f, 5.54852188e-02f,
                                               2.40229324e-01f, 6.93147063e-01f, 1.0f};
    // (ldexp only for a shift: made per row, its library calls cost 5% of a backward)
    for (int i = 0; i < 7; ++i) c[i] = _mm512_set1_ps(shift == 0 ? kCoefficients[i] : std::ldexp(kCoefficients[i], -shift));
    floor_t = _mm512_set1_ps(static_cast<float>(-126 + shift));
  }
};

ATTN_AVX512 inline __m512 exp2_live(__m512 x, __m512 scale, __m512 m, const Exp2Constants& k) {
  const __m512 t = _mm512_fmsub_ps(x, scale, m);
  const __mmask16 live = _mm512_cmp_ps_mask(t, k.floor_t, _CMP_GT_OQ);
  const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = k.c[0];
  p = _mm512_fmadd_ps(p, f, k.c[1]);
  p = _mm512_fmadd_ps(p, f, k.c[2]);
  p = _mm512_fmadd_ps(p, f, k.c[3]);
  p = _mm512_fmadd_ps(p, f, k.c[4]);
  p = _mm512_fmadd_ps(p, f, k.c[5]);
  p = _mm512_fmadd_ps(p, f, k.c[6]);
  return _mm512_maskz_scalef_ps(live, p, t);
}

// Weights for n scores, two independent chains; Store(j, e, lanes) writes them.
template <typename Store>
ATTN_AVX512 inline float exp2_sum_with(const float* x, std::int64_t n, __m512 sv, __m512 mv, const Exp2Constants& k,
                                       Store store) {
  __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
  std::int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    const __m512 e0 = exp2_live(_mm512_loadu_ps(x + j), sv, mv, k);
    const __m512 e1 = exp2_live(_mm512_loadu_ps(x + j + 16), sv, mv, k);
    store(j, e0, static_cast<__mmask16>(0xFFFF));
    store(j + 16, e1, static_cast<__mmask16>(0xFFFF));
    sum0 = _mm512_add_ps(sum0, e0);
    sum1 = _mm512_add_ps(sum1, e1);
  }
  for (; j < n; j += 16) {
    const __mmask16 tail = static_cast<__mmask16>(n - j >= 16 ? 0xFFFF : (1u << (n - j)) - 1);
    const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), tail, x + j);
    const __m512 e = exp2_live(v, sv, mv, k);
    store(j, e, tail);
    sum0 = _mm512_add_ps(sum0, e);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
}

ATTN_AVX512 inline auto store_f32(float* x) {
  return [x](std::int64_t j, __m512 e, __mmask16 lanes) ATTN_AVX512 { _mm512_mask_storeu_ps(x + j, lanes, e); };
}
ATTN_AVX512 inline auto store_bf16(bf16* out) {
  return [out](std::int64_t j, __m512 e, __mmask16 lanes) ATTN_AVX512 {
    _mm256_mask_storeu_epi16(out + j, lanes, (__m256i)_mm512_cvtneps_pbh(e));
  };
}

ATTN_AVX512 float exp2_sum(float* x, std::int64_t n, float scale, float m, int shift) {
  return exp2_sum_with(x, n, _mm512_set1_ps(scale), _mm512_set1_ps(m), Exp2Constants(shift), store_f32(x));
}

// exp2_sum_with over rows of n, the constants set up once; row_store(r)
// makes row r's Store.
template <typename RowStore>
ATTN_AVX512 inline void exp2_rows_with(const float* x, std::int64_t rows, std::int64_t n, float scale, const float* m,
                                       int shift, float* sums, RowStore row_store) {
  const __m512 sv = _mm512_set1_ps(scale);
  const Exp2Constants k(shift);
  for (std::int64_t r = 0; r < rows; ++r) sums[r] = exp2_sum_with(x + r * n, n, sv, _mm512_set1_ps(m[r]), k, row_store(r));
}

ATTN_AVX512 void exp2_rows(float* x, std::int64_t rows, std::int64_t n, float scale, const float* m, int shift, float* sums) {
  exp2_rows_with(x, rows, n, scale, m, shift, sums, [x, n](std::int64_t r) ATTN_AVX512 { return store_f32(x + r * n); });
}

ATTN_AVX512 void exp2_rows_bf16(const float* x, std::int64_t rows, std::int64_t n, float scale, const float* m, int shift,
                                bf16* out, float* sums) {
  exp2_rows_with(x, rows, n, scale, m, shift, sums, [out, n](std::int64_t r) ATTN_AVX512 { return store_bf16(out + r * n); });
}

ATTN_AVX512 float max_of(const float* x, std::int64_t n) {
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (std::int64_t j = 0; j < n; j += 16) {
    const __mmask16 tail = static_cast<__mmask16>(n - j >= 16 ? 0xFFFF : (1u << (n - j)) - 1);
    m = _mm512_mask_max_ps(m, tail, m, _mm512_maskz_loadu_ps(tail, x + j));
  }
  return _mm512_reduce_max_ps(m);
}

// Sums each of 16 vectors across its lanes, all at once: four rounds of
// shuffles and adds halve the vector count each time (45 instructions where
// 16 separate reductions take about 130). Lane L of the result holds the sum
// of v[L]. The two rounds within 128-bit lanes (vshufps) come first, so only
// 6 of the shuffles cross lanes: on the AMD EPYC of docs/results those
// (vshuff32x4, like vpermps and vpermt2b) take the pipes vdpbf16ps and FMA
// use, while vshufps and vaddps run beside them.
ATTN_AVX512 inline __m512 reduce16(const __m512 (&v)[16]) {
  __m512 w[8], x[4], y[2];
  // w[i]: per 128-bit lane, [v[2i] lanes 0+2, 1+3, v[2i+1] lanes 0+2, 1+3]
  for (int i = 0; i < 8; ++i) {
    w[i] = _mm512_add_ps(_mm512_shuffle_ps(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_ps(v[2 * i], v[2 * i + 1], 0xEE));
  }
  // x[i]: per 128-bit lane, the lane's sums of v[4i], v[4i+1], v[4i+2], v[4i+3]
  for (int i = 0; i < 4; ++i) {
    x[i] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * i], w[2 * i + 1], 0x88), _mm512_shuffle_ps(w[2 * i], w[2 * i + 1], 0xDD));
  }
  // y[i]: 128-bit lanes of x[2i] (0+1, 2+3), then of x[2i+1]; the result: whole sums
  for (int i = 0; i < 2; ++i) {
    y[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0x88), _mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0xDD));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], 0x88), _mm512_shuffle_f32x4(y[0], y[1], 0xDD));
}

// 16 elements of a row of K or V in place, widened exactly to float32; lanes
// outside `m` read nothing and are 0.
ATTN_AVX512 inline __m512 load16(const float* x, __mmask16 m) { return _mm512_maskz_loadu_ps(m, x); }
ATTN_AVX512 inline __m512 load16(const bf16* x, __mmask16 m) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x)), 16));
}
ATTN_AVX512 inline __m512 load16(const f16* x, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x)); }

ATTN_AVX512 inline __mmask16 lanes_below(std::int64_t n) {
  return static_cast<__mmask16>(n >= 16 ? 0xFFFF : n <= 0 ? 0 : (1u << n) - 1);
}

// What a decode kernel reads a row of K or V in place through: elements
// [d, d + 16) of the row (d a multiple of 16) as float32 lanes, exactly, the
// lanes outside `m` reading nothing and 0; byte_of(e): where element e's
// bytes begin (for the prefetches).
template <typename T> struct Widen {  // float32, bfloat16, float16
  static std::int64_t byte_of(std::int64_t e) { return e * static_cast<std::int64_t>(sizeof(T)); }
  ATTN_AVX512 static __m512 load(const void* row, std::int64_t d, __mmask16 m) {
    return load16(static_cast<const T*>(row) + d, m);
  }
};

ATTN_AVX512 inline __m128i load_bytes(const void* row, std::int64_t at, __mmask16 m) {
  return _mm_maskz_loadu_epi8(m, static_cast<const std::uint8_t*>(row) + at);
}

// float8_e4m3fn: the code sign-extended to 16 bits and shifted left by 7
// puts its 7 magnitude bits at a half's exponent and top mantissa bits and
// its sign at the half's (bit 14, also a copy of the sign, masked off): the
// value times 2^-8 (exponent bias 15 against 7, subnormals included).
// S.1111.111 is NaN.
struct E4m3Codes {
  static std::int64_t byte_of(std::int64_t e) { return e; }
  ATTN_AVX512 static __m512 load(const void* row, std::int64_t d, __mmask16 m) {
    const __m256i b = _mm256_cvtepi8_epi16(load_bytes(row, d, m));
    const __m256i half = _mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16(static_cast<short>(0xBF80)));
    const __m512 x = _mm512_mul_ps(_mm512_cvtph_ps(half), _mm512_set1_ps(256.0f));
    // A NaN code is 0x7f80 or 0xff80 as a half's bits: its exponent and top mantissa bits all set.
    const __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_or_si256(half, _mm256_set1_epi16(static_cast<short>(0x8000))),
                                                  _mm256_set1_epi16(static_cast<short>(0xBF80)));
    return _mm512_mask_mov_ps(x, nan, _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
  }
};

// float8_e5m2: the top byte of a half.
struct E5m2Codes {
  static std::int64_t byte_of(std::int64_t e) { return e; }
  ATTN_AVX512 static __m512 load(const void* row, std::int64_t d, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(load_bytes(row, d, m)), 8));
  }
};

// A ggml block's d (a little-endian half at its first two bytes) in every lane.
ATTN_AVX512 inline __m512 block_d(const std::uint8_t* block) {
  std::uint16_t bits;
  std::memcpy(&bits, block, sizeof bits);
  return _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(bits)));
}

// ggml Q8_0: blocks of 34 bytes (d, 32 int8); d * q is exact in float32.
struct Q8_0Codes {
  static std::int64_t byte_of(std::int64_t e) { return e / 32 * 34; }
  ATTN_AVX512 static __m512 load(const void* row, std::int64_t d, __mmask16 m) {
    const auto* block = static_cast<const std::uint8_t*>(row) + d / 32 * 34;
    const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load_bytes(block, 2 + d % 32, m)));
    return _mm512_mul_ps(q, block_d(block));
  }
};

// ggml Q4_0: blocks of 18 bytes (d, 16 bytes); elements 0-15 are the low
// nibbles of the 16 bytes, 16-31 the high ones; d * (q - 8).
struct Q4_0Codes {
  static std::int64_t byte_of(std::int64_t e) { return e / 32 * 18; }
  ATTN_AVX512 static __m512 load(const void* row, std::int64_t d, __mmask16 m) {
    const auto* block = static_cast<const std::uint8_t*>(row) + d / 32 * 18;
    __m128i b = load_bytes(block, 2, m);
    if (d % 32 != 0) b = _mm_srli_epi16(b, 4);
    b = _mm_and_si128(b, _mm_set1_epi8(0x0f));
    const __m512i q = _mm512_sub_epi32(_mm512_cvtepu8_epi32(b), _mm512_set1_epi32(8));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(q), block_d(block));
  }
};

// R rows (1, 2 or 4; nr of them real; more go to the keys-as-lanes kernels
// below) against 16 / R keys per step: 16 accumulators v[row * 16/R + key],
// reduced together into one vector in row-major order, and stored row by row
// with masks (a scatter costs several times more on every AVX-512 CPU
// measured).

// A 16 x 16 transpose of 32-bit elements: r[p] lane c = the old r[c] lane p.
ATTN_AVX512 inline void transpose16(__m512i (&r)[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 2; ++i) {
    for (int c = 0; c < 4; ++c) {
      t[8 * i + c] = _mm512_shuffle_i32x4(r[8 * i + c], r[8 * i + 4 + c], 0x88);
      t[8 * i + 4 + c] = _mm512_shuffle_i32x4(r[8 * i + c], r[8 * i + 4 + c], 0xDD);
    }
  }
  for (int c = 0; c < 8; ++c) {
    r[c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0xDD);
  }
}

// Calls fn with the loader (Widen<T>, E4m3Codes ...) of a row format.
template <typename Fn> ATTN_AVX512 void with_loader(RowFormat format, Fn&& fn) {
  switch (format.encoding) {
    case Encoding::none: break;
    case Encoding::e4m3: return fn(E4m3Codes{});
    case Encoding::e5m2: return fn(E5m2Codes{});
    case Encoding::q8_0: return fn(Q8_0Codes{});
    case Encoding::q4_0: return fn(Q4_0Codes{});
    default: throw std::logic_error("the in-place kernels decode fp8 and ggml codes only");
  }
  switch (format.dtype) {
    case DType::f32: return fn(Widen<float>{});
    case DType::bf16: return fn(Widen<bf16>{});
    case DType::f16: return fn(Widen<f16>{});
    default: throw std::logic_error("the in-place kernels read float32, bfloat16 or float16 rows");
  }
}

// Q K^T for 5 to 8 rows, keys as lanes: the next 16 lanes of 32 bits of 16
// key rows transposed (lane L of vector e: key L's e-th lane), then each
// row's matching Q lane broadcast from memory against vector e. No
// horizontal reduction: the R-row kernels below need a 16-vector one every
// 2 keys at 8 rows, this a transpose every 16 keys (1.3 to 1.6x faster at
// head_dim 128 and 64 on one core of the AMD EPYC of docs/results). Lanes
// says what a lane holds: a float32 dim of K (widened) against a float32 Q
// dim, or a pair of bfloat16 dims against Q's pair.
template <typename Load> struct F32Lanes {
  using Q = float;
  static constexpr std::int64_t kDims = 1;  // dims a lane
  ATTN_AVX512 static __m512i load(const void* row, std::int64_t d, std::int64_t dims) {
    return _mm512_castps_si512(Load::load(row, d, lanes_below(dims)));
  }
  ATTN_AVX512 static __m512 madd(__m512 acc, __m512i k, const float* q, std::int64_t) {
    return _mm512_fmadd_ps(_mm512_castsi512_ps(k), _mm512_set1_ps(*q), acc);
  }
};
template <typename Load> struct Bf16PairLanes {
  using Q = bf16;
  static constexpr std::int64_t kDims = 2;
  ATTN_AVX512 static __m512i load(const void* row, std::int64_t d, std::int64_t dims) {
    return Load::load(row, d, dims >= 32 ? 0xFFFFFFFFu : (1u << dims) - 1);
  }
  // dims: Q's dims in this lane; with 1 (an odd head_dim's last pair) Q's
  // element past head_dim is taken as 0 (K's is 0 from the masked load; an
  // infinite one would make NaN).
  ATTN_AVX512 static __m512 madd(__m512 acc, __m512i k, const bf16* q, std::int64_t dims) {
    std::uint32_t pair = 0;
    std::memcpy(&pair, q, dims >= 2 ? 4 : 2);
    return _mm512_dpbf16_ps(acc, (__m512bh)k, (__m512bh)_mm512_set1_epi32(static_cast<std::int32_t>(pair)));
  }
};

// 16 keys from krow against 8 rows over dims [d, d + 16 kDims) of which
// `dims` are real; Full: all of them, known at compile time, so the
// transposed vectors stay in registers and Q's lanes are broadcast straight
// from memory (a loop to a run-time bound spilled the 16 vectors to the stack
// and broadcast Q through a general register: bfloat16 decode at 8 rows was
// about 25% slower).
template <typename L, bool Full>
ATTN_AVX512 inline void keys_as_lanes_chunk(const typename L::Q* (&qrow)[8], const void* (&krow)[16], std::int64_t d,
                                            std::int64_t dims, __m512 (&acc)[8]) {
  __m512i t[16];
#pragma GCC unroll 16
  for (int c = 0; c < 16; ++c) t[c] = L::load(krow[c], d, Full ? 16 * L::kDims : dims);
  transpose16(t);
#pragma GCC unroll 16
  for (int e = 0; e < 16; ++e) {
    const std::int64_t left = Full ? L::kDims : dims - e * L::kDims;
    if (!Full && left <= 0) break;
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) acc[r] = L::madd(acc[r], t[e], qrow[r] + d + e * L::kDims, left);
  }
}

template <typename L>
ATTN_AVX512 void qk_keys_as_lanes(const typename L::Q* q, std::int64_t nr, std::int64_t head_dim, std::int64_t ldq,
                                  KeyRows k, std::int64_t keys, float* s, const Ahead& ahead) {
  constexpr std::int64_t kChunk = 16 * L::kDims;
  const typename L::Q* qrow[8];
  for (int r = 0; r < 8; ++r) qrow[r] = q + std::min<std::int64_t>(r, nr - 1) * ldq;
  std::int64_t j = 0;
  for (; j < keys; j += 16) {
    prefetch_rows(ahead, j, j + 16);
    const void* krow[16];
    for (int c = 0; c < 16; ++c) krow[c] = k[std::min<std::int64_t>(j + c, keys - 1)];
    __m512 acc[8];
    for (__m512& a : acc) a = _mm512_setzero_ps();
    std::int64_t d = 0;
    for (; d + kChunk <= head_dim; d += kChunk) keys_as_lanes_chunk<L, true>(qrow, krow, d, kChunk, acc);
    if (d < head_dim) keys_as_lanes_chunk<L, false>(qrow, krow, d, head_dim - d, acc);
    const __mmask16 live = lanes_below(keys - j);
    for (int r = 0; r < 8 && r < nr; ++r) _mm512_mask_storeu_ps(s + r * kKeyBlock + j, live, acc[r]);
  }
  prefetch_rows(ahead, j, ahead.n);
}

template <int R, typename Load>
ATTN_AVX512 void qk_direct_rows(const float* q, std::int64_t nr, std::int64_t head_dim, KeyRows k, std::int64_t keys,
                                float* s, const Ahead& ahead) {
  constexpr int kKeys = 16 / R;
  const float* qrow[R];
  for (int r = 0; r < R; ++r) qrow[r] = q + std::min<std::int64_t>(r, nr - 1) * head_dim;
  std::int64_t j = 0;
  for (; j < keys; j += kKeys) {
    prefetch_rows(ahead, j, j + kKeys);
    const void* krow[kKeys];
    for (int c = 0; c < kKeys; ++c) krow[c] = k[std::min<std::int64_t>(j + c, keys - 1)];
    __m512 acc[16];
    for (__m512& a : acc) a = _mm512_setzero_ps();
    for (std::int64_t d = 0; d < head_dim; d += 16) {
      const __mmask16 m = lanes_below(head_dim - d);
      __m512 qv[R];
      for (int r = 0; r < R; ++r) qv[r] = _mm512_maskz_loadu_ps(m, qrow[r] + d);
      for (int c = 0; c < kKeys; ++c) {
        const __m512 kv = Load::load(krow[c], d, m);
        for (int r = 0; r < R; ++r) acc[r * kKeys + c] = _mm512_fmadd_ps(qv[r], kv, acc[r * kKeys + c]);
      }
    }
    const __m512 sums = reduce16(acc);
    const unsigned live_keys = (1u << std::min<std::int64_t>(kKeys, keys - j)) - 1;
    for (int r = 0; r < R && r < nr; ++r) {
      // Lanes [r * kKeys, (r + 1) * kKeys) land on s[r][j ...].
      _mm512_mask_storeu_ps(s + r * kKeyBlock + j - r * kKeys, static_cast<__mmask16>(live_keys << (r * kKeys)), sums);
    }
  }
  prefetch_rows(ahead, j, ahead.n);
}

template <typename Load>
ATTN_AVX512 void qk_direct_typed(const float* q, std::int64_t rows, std::int64_t head_dim, KeyRows k, std::int64_t keys,
                                 float* s, const Ahead& ahead) {
  for (std::int64_t r0 = 0; r0 < rows; r0 += 8) {
    const std::int64_t nr = std::min<std::int64_t>(8, rows - r0);
    const float* qr = q + r0 * head_dim;
    float* sr = s + r0 * kKeyBlock;
    const Ahead& a = r0 == 0 ? ahead : Ahead{};  // the first 8 rows ask for it
    if (nr == 1) qk_direct_rows<1, Load>(qr, nr, head_dim, k, keys, sr, a);
    else if (nr == 2) qk_direct_rows<2, Load>(qr, nr, head_dim, k, keys, sr, a);
    else if (nr <= 4) qk_direct_rows<4, Load>(qr, nr, head_dim, k, keys, sr, a);
    else qk_keys_as_lanes<F32Lanes<Load>>(qr, nr, head_dim, head_dim, k, keys, sr, a);
  }
}

ATTN_AVX512 void qk_direct(const float* q, std::int64_t rows, std::int64_t head_dim, KeyRows k, RowFormat format,
                           std::int64_t keys, float* s, const Ahead& ahead) {
  with_loader(format, [&](auto load) { qk_direct_typed<decltype(load)>(q, rows, head_dim, k, keys, s, ahead); });
}

// O rows [0, NR), columns [c0, c0 + 16 NV) of which those below `dv` are V's:
// += P V over `keys` rows of V in place (the last vector's lanes past dv
// read nothing); asks for the same columns of the ahead rows.
template <int NR, int NV, typename Load>
ATTN_AVX512 void pv_direct_block(const float* p, std::int64_t keys, KeyRows v, std::int64_t c0, std::int64_t dv,
                                 std::int64_t dv_pad, float* o, const Ahead& ahead) {
  const std::int64_t pf_begin = Load::byte_of(c0), pf_end = Load::byte_of(c0 + 16 * NV);
  __m512 acc[NR][NV];
  __mmask16 cols[NV];
#pragma GCC unroll 4
  for (int c = 0; c < NV; ++c) cols[c] = lanes_below(dv - c0 - 16 * c);
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_loadu_ps(o + r * dv_pad + c0 + 16 * c);
  for (std::int64_t j = 0; j < keys; ++j) {
    prefetch_rows(ahead, j, j + 1, pf_begin, pf_end);
    __m512 vj[NV];
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) vj[c] = Load::load(v[j], c0 + 16 * c, cols[c]);
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const __m512 pb = _mm512_set1_ps(p[r * kKeyBlock + j]);
#pragma GCC unroll 4
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_fmadd_ps(pb, vj[c], acc[r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) _mm512_storeu_ps(o + r * dv_pad + c0 + 16 * c, acc[r][c]);
  prefetch_rows(ahead, keys, ahead.n, pf_begin, pf_end);
}

template <typename Load> struct PvDirectTables {
  using Fn = void (*)(const float*, std::int64_t, KeyRows, std::int64_t, std::int64_t, std::int64_t, float*, const Ahead&);
  template <int NV>
  static constexpr auto rows = make_table([](auto n) -> Fn { return &pv_direct_block<decltype(n)::value, NV, Load>; },
                                          std::make_index_sequence<kRowsPerStep>{});
};

template <typename Load>
ATTN_AVX512 void pv_direct_typed(const float* p, std::int64_t rows, std::int64_t keys, KeyRows v, std::int64_t dv,
                                 std::int64_t dv_pad, float* o, const Ahead& ahead) {
  using Tables = PvDirectTables<Load>;
  for (std::int64_t c0 = 0; c0 < dv; c0 += 64) {
    const std::int64_t nv = std::min<std::int64_t>(4, (dv - c0 + 15) / 16);
    const auto& table = pick(nv, Tables::template rows<1>, Tables::template rows<2>, Tables::template rows<3>,
                             Tables::template rows<4>);
    for (std::int64_t r = 0; r < rows; r += kRowsPerStep) {
      const std::int64_t n = std::min<std::int64_t>(kRowsPerStep, rows - r);
      // Each pass over the keys asks for its own columns of the ahead rows.
      table[static_cast<std::size_t>(n - 1)](p + r * kKeyBlock, keys, v, c0, dv, dv_pad, o + r * dv_pad,
                                             r == 0 ? ahead : Ahead{});
    }
  }
}

ATTN_AVX512 void pv_direct(const float* p, std::int64_t rows, std::int64_t keys, KeyRows v, RowFormat format, std::int64_t dv,
                           std::int64_t dv_pad, float* o, const Ahead& ahead) {
  with_loader(format, [&](auto load) { pv_direct_typed<decltype(load)>(p, rows, keys, v, dv, dv_pad, o, ahead); });
}

// What the bfloat16 decode kernels read a row of K or V through: elements
// [d, d + 32) of the row (d a multiple of 32) as 32 bfloat16 lanes, lanes
// outside `m` 0. bfloat16 rows as they are; fp8 codes exactly (every e4m3
// and e5m2 value is a normal bfloat16); a ggml block's d * q rounded to
// nearest even (d has 11 significant bits: the one rounding per quantised
// element that the bound of a bfloat16 case allows). load64 and pairs32
// below read through load unless a loader has its own.
struct Bf16Rows {
  static std::int64_t byte_of(std::int64_t e) { return e * 2; }
  ATTN_AVX512 static __m512i load(const void* row, std::int64_t d, __mmask32 m) {
    return _mm512_maskz_loadu_epi16(m, static_cast<const bf16*>(row) + d);
  }
};

// The bfloat16 bits of each fp8 magnitude (a code's low 7 bits: exponent
// bits, then mantissa_bits of mantissa), at compile time: normals rebias the
// exponent, subnormals are normalised, e4m3's S.1111.111 is NaN, e5m2's
// exponent 31 infinity (mantissa 0) or NaN.
template <Encoding E> constexpr std::array<std::uint16_t, 128> fp8_bf16_table() {
  constexpr int kMantissa = E == Encoding::e4m3 ? 3 : 2, kBias = E == Encoding::e4m3 ? 7 : 15;
  std::array<std::uint16_t, 128> t{};
  for (int m = 0; m < 128; ++m) {
    const int exponent = m >> kMantissa, mantissa = m & ((1 << kMantissa) - 1);
    int bits = 0;
    if (E == Encoding::e4m3 && m == 127) bits = 0x7fc0;
    else if (E == Encoding::e5m2 && exponent == 31) bits = mantissa == 0 ? 0x7f80 : 0x7fc0;
    else if (exponent > 0) bits = (exponent - kBias + 127) << 7 | mantissa << (7 - kMantissa);
    else if (mantissa > 0) {  // mantissa * 2^(1 - bias - kMantissa): its top bit at position top
      int top = 0;
      while ((mantissa >> (top + 1)) != 0) ++top;
      bits = (top + 1 - kBias - kMantissa + 127) << 7 | ((mantissa - (1 << top)) << (7 - top));
    }
    t[static_cast<std::size_t>(m)] = static_cast<std::uint16_t>(bits);
  }
  return t;
}
template <Encoding E> alignas(64) constexpr std::array<std::uint16_t, 128> kFp8Bf16 = fp8_bf16_table<E>();

// fp8 codes by table: two two-register permutes cover the 128 magnitudes,
// bit 6 picks one, the sign bit goes to bit 15 (e4m3's NaN codes give NaN,
// e5m2's infinities infinity).
template <Encoding E> struct Fp8Bf16Codes {
  static std::int64_t byte_of(std::int64_t e) { return e; }
  ATTN_AVX512 static __m512i load(const void* row, std::int64_t d, __mmask32 m) {
    const std::uint16_t* t = kFp8Bf16<E>.data();
    const __m512i code = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(m, static_cast<const std::uint8_t*>(row) + d));
    const __m512i low = _mm512_permutex2var_epi16(_mm512_load_si512(t), code, _mm512_load_si512(t + 32));
    const __m512i high = _mm512_permutex2var_epi16(_mm512_load_si512(t + 64), code, _mm512_load_si512(t + 96));
    const __m512i magnitude = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(code, _mm512_set1_epi16(0x40)), low, high);
    // bit 15 from the code shifted left by 8 (its bit 7), the rest from the magnitude
    return _mm512_ternarylogic_epi32(magnitude, _mm512_slli_epi16(code, 8), _mm512_set1_epi16(static_cast<short>(0x8000)), 0xD8);
  }
};

// 16 int32 times d, and 16 more, rounded to 32 bfloat16 lanes in order.
ATTN_AVX512 inline __m512i scaled_bf16(__m512i first, __m512i second, __m512 d) {
  const __m512 a = _mm512_mul_ps(_mm512_cvtepi32_ps(first), d), b = _mm512_mul_ps(_mm512_cvtepi32_ps(second), d);
  return (__m512i)_mm512_cvtne2ps_pbh(b, a);
}

struct Q8_0Bf16Codes {
  static std::int64_t byte_of(std::int64_t e) { return e / 32 * 34; }
  ATTN_AVX512 static __m512i load(const void* row, std::int64_t d, __mmask32 m) {
    const auto* block = static_cast<const std::uint8_t*>(row) + d / 32 * 34;
    const __m256i q = _mm256_maskz_loadu_epi8(m, block + 2);
    return scaled_bf16(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)), _mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)),
                       block_d(block));
  }
};

struct Q4_0Bf16Codes {
  static std::int64_t byte_of(std::int64_t e) { return e / 32 * 18; }
  ATTN_AVX512 static __m512i load(const void* row, std::int64_t d, __mmask32 m) {
    const auto* block = static_cast<const std::uint8_t*>(row) + d / 32 * 18;
    const __m128i b = _mm_maskz_loadu_epi8(static_cast<__mmask16>(m | (m >> 16)), block + 2);
    const __m128i nibble = _mm_set1_epi8(0x0f);
    const __m512i eight = _mm512_set1_epi32(8);
    const __m512i low = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(b, nibble)), eight);
    const __m512i high = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), nibble)), eight);
    return scaled_bf16(low, high, block_d(block));
  }
};

#if defined(ATTN_KERNELS_VBMI)
// fp8 codes by byte table (AVX512_VBMI): one two-register byte permute looks
// up the low byte of each of 64 codes' bfloat16 (the index's bit 7, the sign,
// is ignored: 128 magnitudes), another the high byte, to which the sign goes;
// unpacking (or, for 32 codes in order, a third permute) makes the words. The
// bits are kFp8Bf16's: the same values as Fp8Bf16Codes, in 5 instructions per
// 64 codes where that takes 7 per 32, and 2 of them on vdpbf16ps's pipes.
template <Encoding E> struct Fp8ByteTables {
  std::array<std::uint8_t, 128> low{}, high{};
};
template <Encoding E> constexpr Fp8ByteTables<E> fp8_byte_tables() {
  Fp8ByteTables<E> t;
  for (std::size_t m = 0; m < 128; ++m) {
    t.low[m] = static_cast<std::uint8_t>(kFp8Bf16<E>[m] & 0xff);
    t.high[m] = static_cast<std::uint8_t>(kFp8Bf16<E>[m] >> 8);
  }
  return t;
}
template <Encoding E> alignas(64) constexpr Fp8ByteTables<E> kFp8Bytes = fp8_byte_tables<E>();

// Byte indexes for the two-register byte permutes (`from` the first register,
// 64 + from the second). Words: byte 2i of the first (low bytes), 2i + 1 of
// the second (high bytes), codes [from, from + 32): bfloat16 i of a vector.
constexpr std::array<std::uint8_t, 64> word_index(int from) {
  std::array<std::uint8_t, 64> x{};
  for (int i = 0; i < 32; ++i) {
    x[static_cast<std::size_t>(2 * i)] = static_cast<std::uint8_t>(from + i);
    x[static_cast<std::size_t>(2 * i + 1)] = static_cast<std::uint8_t>(64 + from + i);
  }
  return x;
}
alignas(64) constexpr std::array<std::uint8_t, 64> kWords0 = word_index(0), kWords32 = word_index(32);
// Pairs: 32 columns of two rows' codes (the first register's, the second's)
// as adjacent bytes, in the order unpacking two rows of 16-bit elements gives
// (pairs32): bytes [0, 32) the low pairs, lane t column 8 (t / 4) + t % 4,
// bytes [32, 64) the high ones, column 8 (t / 4) + 4 + t % 4.
constexpr std::array<std::uint8_t, 64> pair_index() {
  std::array<std::uint8_t, 64> x{};
  for (int t = 0; t < 16; ++t) {
    for (int half = 0; half < 2; ++half) {
      const int column = 8 * (t / 4) + 4 * half + t % 4;
      x[static_cast<std::size_t>(32 * half + 2 * t)] = static_cast<std::uint8_t>(column);
      x[static_cast<std::size_t>(32 * half + 2 * t + 1)] = static_cast<std::uint8_t>(64 + column);
    }
  }
  return x;
}
alignas(64) constexpr std::array<std::uint8_t, 64> kPairBytes = pair_index();

template <Encoding E> struct Fp8VbmiCodes {
  static std::int64_t byte_of(std::int64_t e) { return e; }
  // The bfloat16 of 64 codes, as two vectors of low and high bytes.
  ATTN_AVX512 static void bytes(__m512i code, __m512i& low, __m512i& high) {
    const auto& t = kFp8Bytes<E>;
    low = _mm512_permutex2var_epi8(_mm512_load_si512(t.low.data()), code, _mm512_load_si512(t.low.data() + 64));
    const __m512i magnitude = _mm512_permutex2var_epi8(_mm512_load_si512(t.high.data()), code, _mm512_load_si512(t.high.data() + 64));
    high = _mm512_ternarylogic_epi32(magnitude, code, _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);  // | code & 0x80
  }
  ATTN_AVX512 static __m512i words(__m512i low, const std::array<std::uint8_t, 64>& index, __m512i high) {
    return _mm512_permutex2var_epi8(low, _mm512_load_si512(index.data()), high);
  }
  ATTN_AVX512 static __m512i load(const void* row, std::int64_t d, __mmask32 m) {
    __m512i low, high;
    bytes(_mm512_zextsi256_si512(_mm256_maskz_loadu_epi8(m, static_cast<const std::uint8_t*>(row) + d)), low, high);
    return words(low, kWords0, high);
  }
  // 64 codes as words in unpacking's order (in-lane unpacks run beside
  // vdpbf16ps, byte permutes take its pipes): first holds codes 16L + {0..7}
  // in 128-bit lane L, second 16L + {8..15}; Q K^T puts Q in the same order
  // (kLaneWords).
  static constexpr bool kLaneWords = true;
  ATTN_AVX512 static void load64(const void* row, std::int64_t d, __mmask64 m, __m512i& first, __m512i& second) {
    __m512i low, high;
    bytes(_mm512_maskz_loadu_epi8(m, static_cast<const std::uint8_t*>(row) + d), low, high);
    first = _mm512_unpacklo_epi8(low, high);
    second = _mm512_unpackhi_epi8(low, high);
  }
  // Columns [c, c + 64) of two rows (row1 null: zeros) as bfloat16 pairs,
  // unpacked: p[k] holds in lane 4L + t column 16L + 4k + t.
  ATTN_AVX512 static void pairs64(const void* row0, const void* row1, std::int64_t c, __mmask64 m, __m512i (&p)[4]) {
    __m512i l0, h0, l1 = _mm512_setzero_si512(), h1 = _mm512_setzero_si512();  // code 0 is +0: both bytes 0
    bytes(_mm512_maskz_loadu_epi8(m, static_cast<const std::uint8_t*>(row0) + c), l0, h0);
    if (row1) bytes(_mm512_maskz_loadu_epi8(m, static_cast<const std::uint8_t*>(row1) + c), l1, h1);
    const __m512i w0lo = _mm512_unpacklo_epi8(l0, h0), w0hi = _mm512_unpackhi_epi8(l0, h0);
    const __m512i w1lo = _mm512_unpacklo_epi8(l1, h1), w1hi = _mm512_unpackhi_epi8(l1, h1);
    p[0] = _mm512_unpacklo_epi16(w0lo, w1lo);
    p[1] = _mm512_unpackhi_epi16(w0lo, w1lo);
    p[2] = _mm512_unpacklo_epi16(w0hi, w1hi);
    p[3] = _mm512_unpackhi_epi16(w0hi, w1hi);
  }
  ATTN_AVX512 static void pairs32(const void* row0, const void* row1, std::int64_t c, __mmask32 m, __m512i& lo, __m512i& hi) {
    const __m512i a = _mm512_zextsi256_si512(_mm256_maskz_loadu_epi8(m, static_cast<const std::uint8_t*>(row0) + c));
    const __m512i b = row1 ? _mm512_zextsi256_si512(_mm256_maskz_loadu_epi8(m, static_cast<const std::uint8_t*>(row1) + c))
                           : _mm512_setzero_si512();
    __m512i low, high;
    bytes(_mm512_permutex2var_epi8(a, _mm512_load_si512(kPairBytes.data()), b), low, high);
    lo = words(low, kWords0, high);
    hi = words(low, kWords32, high);
  }
};
#endif

ATTN_AVX512 inline __mmask32 lanes32_below(std::int64_t n) {
  return n >= 32 ? 0xFFFFFFFFu : n <= 0 ? 0u : (1u << n) - 1;
}

// Dims [d, d + 64) of a row as two vectors of 32 bfloat16 (dims from `dims`
// on 0), in dims order, or in unpacking's for a loader with kLaneWords: the
// loader's own load64 where it has one.
template <typename Load>
ATTN_AVX512 inline void load64(const void* row, std::int64_t d, std::int64_t dims, __m512i& first, __m512i& second) {
  if constexpr (requires { Load::load64(row, d, __mmask64{}, first, second); }) {
    Load::load64(row, d, dims >= 64 ? ~__mmask64{0} : (__mmask64{1} << dims) - 1, first, second);
  } else {
    first = Load::load(row, d, lanes32_below(dims));
    second = dims > 32 ? Load::load(row, d + 32, lanes32_below(dims - 32)) : _mm512_setzero_si512();
  }
}

// Columns [c, c + 32) of two rows (row1 null: zeros) as bfloat16 pairs
// (row0's element, row1's) for vdpbf16ps, in the order unpacking gives: lo
// holds columns 8L + {0..3} in lanes 4L + {0..3}, hi columns 8L + {4..7}.
template <typename Load>
ATTN_AVX512 inline void pairs32(const void* row0, const void* row1, std::int64_t c, __mmask32 m, __m512i& lo, __m512i& hi) {
  if constexpr (requires { Load::pairs32(row0, row1, c, m, lo, hi); }) {
    Load::pairs32(row0, row1, c, m, lo, hi);
  } else {
    const __m512i v0 = Load::load(row0, c, m), v1 = row1 ? Load::load(row1, c, m) : _mm512_setzero_si512();
    lo = _mm512_unpacklo_epi16(v0, v1);
    hi = _mm512_unpackhi_epi16(v0, v1);
  }
}

// Calls fn with the bfloat16 loader of a row format.
template <typename Fn> ATTN_AVX512 void with_bf16_loader(RowFormat format, Fn&& fn) {
  switch (format.encoding) {
    case Encoding::none:
      if (format.dtype != DType::bf16) throw std::logic_error("the bfloat16 in-place kernels read bfloat16 rows");
      return fn(Bf16Rows{});
#if defined(ATTN_KERNELS_VBMI)
    case Encoding::e4m3: return fn(Fp8VbmiCodes<Encoding::e4m3>{});
    case Encoding::e5m2: return fn(Fp8VbmiCodes<Encoding::e5m2>{});
#else
    case Encoding::e4m3: return fn(Fp8Bf16Codes<Encoding::e4m3>{});
    case Encoding::e5m2: return fn(Fp8Bf16Codes<Encoding::e5m2>{});
#endif
    case Encoding::q8_0: return fn(Q8_0Bf16Codes{});
    case Encoding::q4_0: return fn(Q4_0Bf16Codes{});
    default: throw std::logic_error("the in-place kernels decode fp8 and ggml codes only");
  }
}

// Dims [d, d + 64) of 16 / R keys against R rows, `dims` of them real (Full:
// all 64, known at compile time, so no mask and no branch), each vector of 32
// added in dims order.
// A loader whose load64 gives its words in unpacking's order (Fp8VbmiCodes).
template <typename Load> constexpr bool kLaneWords = requires { Load::kLaneWords; };

// Q's rows [0, R) in the order of such words, 64 dims at a time: dims 16L +
// {0..7} in 128-bit lane L of the first 32, 16L + {8..15} of the next (a
// shuffle of 128-bit lanes), zeros past head_dim; rows of round_up(head_dim,
// 64) in `buffer`, one per thread, grown when a head_dim needs it.
struct alignas(64) Line32 {  // 32 bfloat16, a cache line
  bf16 x[32];
};
template <int R>
ATTN_AVX512 void lane_ordered_q(const bf16* const (&qrow)[R], std::int64_t head_dim, std::vector<Line32>& buffer,
                                const bf16* (&out)[R]) {
  const std::int64_t chunks = (head_dim + 63) / 64;
  if (buffer.size() < static_cast<std::size_t>(R * chunks * 2)) buffer.resize(static_cast<std::size_t>(R * chunks * 2));
  for (int r = 0; r < R; ++r) {
    Line32* row = buffer.data() + r * chunks * 2;
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::int64_t d = 64 * c;
      const __m512i a = _mm512_maskz_loadu_epi16(lanes32_below(head_dim - d), qrow[r] + d);
      const __m512i b = _mm512_maskz_loadu_epi16(lanes32_below(head_dim - d - 32), qrow[r] + d + 32);
      _mm512_store_si512(row + 2 * c, _mm512_shuffle_i32x4(a, b, 0x88));
      _mm512_store_si512(row + 2 * c + 1, _mm512_shuffle_i32x4(a, b, 0xDD));
    }
    out[r] = row->x;
  }
}

template <int R, typename Load, bool Full>
ATTN_AVX512 inline void qk_bf16_direct_step(const bf16* const (&qrow)[R], const void* const (&krow)[16 / R], std::int64_t d,
                                            std::int64_t dims, __m512 (&acc)[16]) {
  // Lane-ordered Q (lane_ordered_q) is zero past head_dim already.
  const bool whole = Full || kLaneWords<Load>;
  const __mmask32 m0 = whole ? 0xFFFFFFFFu : lanes32_below(dims), m1 = whole ? 0xFFFFFFFFu : lanes32_below(dims - 32);
  const bool second = whole || dims > 32;  // lane-ordered words hold dims of both halves in each vector
  __m512bh q0[R], q1[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    q0[r] = (__m512bh)_mm512_maskz_loadu_epi16(m0, qrow[r] + d);
    q1[r] = (__m512bh)_mm512_maskz_loadu_epi16(m1, qrow[r] + d + 32);
  }
#pragma GCC unroll 16
  for (int c = 0; c < 16 / R; ++c) {
    __m512i k0, k1;
    load64<Load>(krow[c], d, dims, k0, k1);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r * (16 / R) + c] = _mm512_dpbf16_ps(acc[r * (16 / R) + c], q0[r], (__m512bh)k0);
    if (second) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r * (16 / R) + c] = _mm512_dpbf16_ps(acc[r * (16 / R) + c], q1[r], (__m512bh)k1);
    }
  }
}

// qk_direct_rows with bfloat16 dot products, no widening: 64 dims a step
// (load64).
template <int R, typename Load>
ATTN_AVX512 void qk_bf16_direct_rows(const bf16* q, std::int64_t nr, std::int64_t head_dim, std::int64_t ldq, KeyRows k,
                                     std::int64_t keys, float* s, const Ahead& ahead) {
  constexpr int kKeys = 16 / R;
  const bf16* qrow[R];
  for (int r = 0; r < R; ++r) qrow[r] = q + std::min<std::int64_t>(r, nr - 1) * ldq;
  if constexpr (kLaneWords<Load>) {
    thread_local std::vector<Line32> buffer;
    lane_ordered_q<R>(qrow, head_dim, buffer, qrow);
  }
  std::int64_t j = 0;
  for (; j < keys; j += kKeys) {
    prefetch_rows(ahead, j, j + kKeys);
    const void* krow[kKeys];
    for (int c = 0; c < kKeys; ++c) krow[c] = k[std::min<std::int64_t>(j + c, keys - 1)];
    __m512 acc[16];
    for (__m512& a : acc) a = _mm512_setzero_ps();
    std::int64_t d = 0;
    for (; d + 64 <= head_dim; d += 64) qk_bf16_direct_step<R, Load, true>(qrow, krow, d, 64, acc);
    if (d < head_dim) qk_bf16_direct_step<R, Load, false>(qrow, krow, d, head_dim - d, acc);
    const __m512 sums = reduce16(acc);
    const unsigned live_keys = (1u << std::min<std::int64_t>(kKeys, keys - j)) - 1;
    for (int r = 0; r < R && r < nr; ++r) {
      _mm512_mask_storeu_ps(s + r * kKeyBlock + j - r * kKeys, static_cast<__mmask16>(live_keys << (r * kKeys)), sums);
    }
  }
  prefetch_rows(ahead, j, ahead.n);
}

template <typename Load>
ATTN_AVX512 void qk_bf16_direct_typed(const bf16* q, std::int64_t rows, std::int64_t head_dim, std::int64_t ldq, KeyRows k,
                                      std::int64_t keys, float* s, const Ahead& ahead) {
  for (std::int64_t r0 = 0; r0 < rows; r0 += 8) {
    const std::int64_t nr = std::min<std::int64_t>(8, rows - r0);
    const bf16* qr = q + r0 * ldq;
    float* sr = s + r0 * kKeyBlock;
    const Ahead& a = r0 == 0 ? ahead : Ahead{};
    if (nr == 1) qk_bf16_direct_rows<1, Load>(qr, nr, head_dim, ldq, k, keys, sr, a);
    else if (nr == 2) qk_bf16_direct_rows<2, Load>(qr, nr, head_dim, ldq, k, keys, sr, a);
    else if (nr <= 4) qk_bf16_direct_rows<4, Load>(qr, nr, head_dim, ldq, k, keys, sr, a);
    else qk_keys_as_lanes<Bf16PairLanes<Load>>(qr, nr, head_dim, ldq, k, keys, sr, a);
  }
}

ATTN_AVX512 void qk_bf16_direct(const bf16* q, std::int64_t rows, std::int64_t head_dim, std::int64_t ldq, KeyRows k,
                                RowFormat format, std::int64_t keys, float* s, const Ahead& ahead) {
  with_bf16_loader(format, [&](auto load) { qk_bf16_direct_typed<decltype(load)>(q, rows, head_dim, ldq, k, keys, s, ahead); });
}

// The key pairs of a block for the P V kernels: step(j, next, pb) for keys
// j and j + 1, pb each row's pair of bfloat16 weights broadcast (an odd last
// key: next null, its partner's weight 0), asking for bytes [pf_begin,
// pf_end) of the ahead rows as it goes, and of the rest at the end.
template <int NR, typename Step>
ATTN_AVX512 inline void for_key_pairs(const bf16* p, std::int64_t keys, KeyRows v, const Ahead& ahead, std::int64_t pf_begin,
                                      std::int64_t pf_end, Step&& step) {
  std::int64_t j = 0;
  __m512bh pb[NR];
  for (; j + 2 <= keys; j += 2) {
    prefetch_rows(ahead, j, j + 2, pf_begin, pf_end);
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      std::int32_t pair;
      std::memcpy(&pair, p + r * kKeyBlock + j, sizeof pair);
      pb[r] = (__m512bh)_mm512_set1_epi32(pair);
    }
    step(j, v[j + 1], pb);
  }
  if (j < keys) {
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      std::uint16_t w;
      std::memcpy(&w, p + r * kKeyBlock + j, sizeof w);
      pb[r] = (__m512bh)_mm512_set1_epi32(static_cast<std::int32_t>(w));
    }
    step(j, nullptr, pb);
  }
  prefetch_rows(ahead, j, ahead.n, pf_begin, pf_end);
}

// O rows [0, NR), G groups of 32 columns from c0 of V's rows in place (those
// below dv V's): key pairs side by side (pairs32), so one vdpbf16ps adds both
// keys' products; each row's pair of weights is broadcast once for all G
// groups (G = 2 at up to 4 rows: half the passes over the keys, each with
// 16 accumulators). Pairs come in unpacking's order, within 128-bit lanes:
// the low half holds columns 8L + {0..3} of lane L, the high half
// 8L + {4..7}; O is permuted to that order on load and back on store.
template <int NR, int G, typename Load>
ATTN_AVX512 void pv_bf16_direct_block(const bf16* p, std::int64_t keys, KeyRows v, std::int64_t c0, std::int64_t dv,
                                      std::int64_t dv_pad, float* o, const Ahead& ahead) {
  alignas(64) static constexpr std::int32_t kLo[16] = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
  alignas(64) static constexpr std::int32_t kHi[16] = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
  // Back: column c of the first (second) 16 comes from lane c of lo/hi as kLo/kHi list them.
  alignas(64) static constexpr std::int32_t kBack0[16] = {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23};
  alignas(64) static constexpr std::int32_t kBack1[16] = {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};
  const __m512i lo_idx = _mm512_load_si512(kLo), hi_idx = _mm512_load_si512(kHi);
  const __m512i back0 = _mm512_load_si512(kBack0), back1 = _mm512_load_si512(kBack1);
  __mmask32 m[G];
  __mmask16 m0[G], m1[G];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    const std::int64_t cols = dv - c0 - 32 * g;
    m[g] = lanes32_below(cols);
    m0[g] = lanes_below(cols);
    m1[g] = lanes_below(cols - 16);
  }
  const std::int64_t pf_begin = Load::byte_of(c0), pf_end = Load::byte_of(c0 + 32 * G);  // this pass's bytes of the ahead rows
  float* const out = o + c0;
  __m512 lo[G][NR], hi[G][NR];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      float* const at = out + r * dv_pad + 32 * g;
      const __m512 a = _mm512_maskz_loadu_ps(m0[g], at), b = _mm512_maskz_loadu_ps(m1[g], at + 16);
      lo[g][r] = _mm512_permutex2var_ps(a, lo_idx, b);
      hi[g][r] = _mm512_permutex2var_ps(a, hi_idx, b);
    }
  // Keys j and j + 1 with each row's pair of weights pb (next null: an odd
  // last key, its partner 0 in V and in P).
  auto step = [&](std::int64_t j, const void* next, const __m512bh (&pb)[NR]) ATTN_AVX512 {
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      __m512i vlo, vhi;
      pairs32<Load>(v[j], next, c0 + 32 * g, m[g], vlo, vhi);
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) {
        lo[g][r] = _mm512_dpbf16_ps(lo[g][r], pb[r], (__m512bh)vlo);
        hi[g][r] = _mm512_dpbf16_ps(hi[g][r], pb[r], (__m512bh)vhi);
      }
    }
  };
  for_key_pairs<NR>(p, keys, v, ahead, pf_begin, pf_end, step);
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      float* const at = out + r * dv_pad + 32 * g;
      _mm512_mask_storeu_ps(at, m0[g], _mm512_permutex2var_ps(lo[g][r], back0, hi[g][r]));
      _mm512_mask_storeu_ps(at + 16, m1[g], _mm512_permutex2var_ps(lo[g][r], back1, hi[g][r]));
    }
}

// pv_bf16_direct_block's 64 columns a pass for a loader with pairs64 (two
// rows' codes decoded apart, then unpacked into pairs: in-lane unpacks where
// pairs32 takes byte permutes): O's 4 vectors of a row go to the pairs'
// order, p[k] lane 4L + t = column 16L + 4k + t, by a 4 x 4 transpose of
// their 128-bit lanes (its own inverse), on load and on store.
template <int NR, typename Load>
ATTN_AVX512 void pv_bf16_direct_block64(const bf16* p, std::int64_t keys, KeyRows v, std::int64_t c0, std::int64_t dv,
                                        std::int64_t dv_pad, float* o, const Ahead& ahead) {
  auto transpose = [](__m512 (&x)[4]) ATTN_AVX512 {
    const __m512 t0 = _mm512_shuffle_f32x4(x[0], x[1], 0x44), t1 = _mm512_shuffle_f32x4(x[0], x[1], 0xEE);
    const __m512 t2 = _mm512_shuffle_f32x4(x[2], x[3], 0x44), t3 = _mm512_shuffle_f32x4(x[2], x[3], 0xEE);
    x[0] = _mm512_shuffle_f32x4(t0, t2, 0x88);
    x[1] = _mm512_shuffle_f32x4(t0, t2, 0xDD);
    x[2] = _mm512_shuffle_f32x4(t1, t3, 0x88);
    x[3] = _mm512_shuffle_f32x4(t1, t3, 0xDD);
  };
  const std::int64_t cols = dv - c0;
  const __mmask64 m = cols >= 64 ? ~__mmask64{0} : (__mmask64{1} << cols) - 1;
  __mmask16 mv[4];
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) mv[k] = lanes_below(cols - 16 * k);
  const std::int64_t pf_begin = Load::byte_of(c0), pf_end = Load::byte_of(c0 + 64);
  float* const out = o + c0;
  __m512 acc[NR][4];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) acc[r][k] = _mm512_maskz_loadu_ps(mv[k], out + r * dv_pad + 16 * k);
    transpose(acc[r]);
  }
  auto step = [&](std::int64_t j, const void* next, const __m512bh (&pb)[NR]) ATTN_AVX512 {
    __m512i pairs[4];
    Load::pairs64(v[j], next, c0, m, pairs);
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) acc[r][k] = _mm512_dpbf16_ps(acc[r][k], pb[r], (__m512bh)pairs[k]);
  };
  for_key_pairs<NR>(p, keys, v, ahead, pf_begin, pf_end, step);
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) {
    transpose(acc[r]);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) _mm512_mask_storeu_ps(out + r * dv_pad + 16 * k, mv[k], acc[r][k]);
  }
}

template <typename Load> constexpr bool kPairs64 = requires { &Load::pairs64; };

// Up to 8 rows at a time; at up to 4 rows 64 columns a pass where 33 or more
// are left, else 32.
template <typename Load>
ATTN_AVX512 void pv_bf16_direct_typed(const bf16* p, std::int64_t rows, std::int64_t keys, KeyRows v, std::int64_t dv,
                                      std::int64_t dv_pad, float* o, const Ahead& ahead) {
  using Fn = void (*)(const bf16*, std::int64_t, KeyRows, std::int64_t, std::int64_t, std::int64_t, float*, const Ahead&);
  static constexpr auto one = make_table([](auto n) -> Fn { return &pv_bf16_direct_block<decltype(n)::value, 1, Load>; },
                                         std::make_index_sequence<8>{});
  static constexpr auto two = make_table(
      [](auto n) -> Fn {
        if constexpr (kPairs64<Load>) return &pv_bf16_direct_block64<decltype(n)::value, Load>;
        else return &pv_bf16_direct_block<decltype(n)::value, 2, Load>;
      },
      std::make_index_sequence<4>{});
  for (std::int64_t r = 0; r < rows; r += 8) {
    const std::int64_t n = std::min<std::int64_t>(8, rows - r);
    const auto i = static_cast<std::size_t>(n - 1);
    for (std::int64_t c0 = 0; c0 < dv;) {
      const bool wide = n <= 4 && dv - c0 > 32;
      (wide ? two[i] : one[i])(p + r * kKeyBlock, keys, v, c0, dv, dv_pad, o + r * dv_pad, r == 0 ? ahead : Ahead{});
      c0 += wide ? 64 : 32;
    }
  }
}

ATTN_AVX512 void pv_bf16_direct(const bf16* p, std::int64_t rows, std::int64_t keys, KeyRows v, RowFormat format,
                                std::int64_t dv, std::int64_t dv_pad, float* o, const Ahead& ahead) {
  with_bf16_loader(format, [&](auto load) { pv_bf16_direct_typed<decltype(load)>(p, rows, keys, v, dv, dv_pad, o, ahead); });
}

ATTN_AVX512 float scale_row(float* x, float scale, std::int64_t begin, std::int64_t end) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 sv = _mm512_set1_ps(scale);
  __m512 m = neg_inf;
  for (std::int64_t j = 0; j < kKeyBlock; j += 16) {
    const __mmask16 live = static_cast<__mmask16>(lanes_below(end - j) & ~lanes_below(begin - j));
    __m512 v = _mm512_mask_mul_ps(neg_inf, live, _mm512_loadu_ps(x + j), sv);
    _mm512_storeu_ps(x + j, v);
    m = _mm512_max_ps(m, v);
  }
  return _mm512_reduce_max_ps(m);
}

ATTN_AVX512 void scale(float* o, float a, std::int64_t n) {
  const __m512 av = _mm512_set1_ps(a);
  for (std::int64_t j = 0; j < n; j += 16) {
    const __mmask16 live = static_cast<__mmask16>(n - j >= 16 ? 0xFFFF : (1u << (n - j)) - 1);
    _mm512_mask_storeu_ps(o + j, live, _mm512_mul_ps(_mm512_maskz_loadu_ps(live, o + j), av));
  }
}

ATTN_AVX512 void add_scaled(float* o, const float* x, float w, std::int64_t n) {
  const __m512 wv = _mm512_set1_ps(w);
  for (std::int64_t j = 0; j < n; j += 16) {
    const __mmask16 live = static_cast<__mmask16>(n - j >= 16 ? 0xFFFF : (1u << (n - j)) - 1);
    // The explicitly rounded forms: the compiler may not fuse them into a
    // multiply-add (C++ contracts a * b + c by default where FMA exists).
    constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512 product = _mm512_mul_round_ps(wv, _mm512_maskz_loadu_ps(live, x + j), kNearest);
    _mm512_mask_storeu_ps(o + j, live, _mm512_add_round_ps(_mm512_maskz_loadu_ps(live, o + j), product, kNearest));
  }
}

ATTN_AVX512 void to_bf16(const float* x, std::int64_t n, bf16* out) {
  std::int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + j));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), (__m256i)v);
  }
  for (; j < n; ++j) out[j] = float_to_bf16(x[j]);
}

// float_to_bf16 on 16 lanes at a time, in integers: vcvtneps2bf16 would
// flush subnormals to zero.
ATTN_AVX512 void scaled_to_bf16(const float* x, float a, std::int64_t n, bf16* out) {
  const __m512 av = _mm512_set1_ps(a);
  const __m512i half = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1);
  for (std::int64_t j = 0; j < n; j += 16) {
    const __mmask16 live = lanes_below(n - j);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(live, x + j), av);
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), one);
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(half, odd)), 16);
    // NaN's top half as it is (rounding could carry into the sign): the
    // product is a quiet NaN already, as float_to_bf16 makes one.
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_srli_epi32(bits, 16));
    // (narrowed in a register, then stored: vpmovdw to memory is slow on Zen 4)
    _mm256_mask_storeu_epi16(out + j, live, _mm512_cvtepi32_epi16(rounded));
  }
}

ATTN_AVX512 void dequantise_bytes(const std::uint8_t* codes, bool is_signed, std::int64_t dim, const float* scale,
                                  const std::int32_t* zero, std::int64_t group, float* out) {
  // g: the group of elements [d, d + 16), stepped (a division a vector was
  // most of the time)
  for (std::int64_t d = 0, g = 0, next = group; d < dim; d += 16) {
    if (d >= next) ++g, next += group;
    const __mmask16 live = lanes_below(dim - d);
    const __m128i bytes = _mm_maskz_loadu_epi8(live, codes + d);
    __m512 x = _mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(bytes) : _mm512_cvtepu8_epi32(bytes));
    if (zero) x = _mm512_sub_ps(x, _mm512_set1_ps(static_cast<float>(zero[g])));
    if (scale) x = _mm512_mul_ps(x, _mm512_set1_ps(scale[g]));
    _mm512_mask_storeu_ps(out + d, live, x);
  }
}

ATTN_AVX512 void widen_f16(const f16* x, std::int64_t n, float* out) {
  for (std::int64_t j = 0; j < n; j += 16) {
    const __mmask16 live = static_cast<__mmask16>(n - j >= 16 ? 0xFFFF : (1u << (n - j)) - 1);
    const __m256i h = _mm256_maskz_loadu_epi16(live, x + j);
    _mm512_mask_storeu_ps(out + j, live, _mm512_cvtph_ps(h));
  }
}

// 16 rows at a time (the last group's missing rows read the last real one and
// are not stored), 16 words at a time (masked past `words`): transpose16.
ATTN_AVX512 void transpose32(const void* const* rows, std::int64_t n, std::int64_t words, void* out, std::int64_t ld) {
  auto* o = static_cast<std::uint32_t*>(out);
  for (std::int64_t r0 = 0; r0 < n; r0 += 16) {
    const __mmask16 live_rows = lanes_below(n - r0);
    const std::uint32_t* row[16];
    for (int c = 0; c < 16; ++c) row[c] = static_cast<const std::uint32_t*>(rows[std::min<std::int64_t>(r0 + c, n - 1)]);
    for (std::int64_t w0 = 0; w0 < words; w0 += 16) {
      const __mmask16 live_words = lanes_below(words - w0);
      __m512i t[16];
      for (int c = 0; c < 16; ++c) t[c] = _mm512_maskz_loadu_epi32(live_words, row[c] + w0);
      transpose16(t);
      for (std::int64_t e = 0; e < std::min<std::int64_t>(16, words - w0); ++e) {
        _mm512_mask_storeu_epi32(o + (w0 + e) * ld + r0, live_rows, t[e]);
      }
    }
  }
}

#if defined(ATTN_KERNELS_VBMI)
constexpr const char* kSetName = "avx512_vbmi";
#else
constexpr const char* kSetName = "avx512_bf16";
#endif

const Kernels kAvx512{kSetName, qk_f32, qk_bf16, pv_f32, pv_bf16, exp2_sum, exp2_rows, exp2_rows_bf16,
                      max_of, qk_direct, pv_direct, qk_bf16_direct, pv_bf16_direct, scale_row, scale, add_scaled,
                      to_bf16, scaled_to_bf16, dequantise_bytes, widen_f16, transpose32};

}  // namespace

#if defined(ATTN_KERNELS_VBMI)
const Kernels* avx512_vbmi_kernels() { return cpu_features().avx512_vbmi ? &kAvx512 : nullptr; }
#else
const Kernels* avx512_kernels() { return cpu_features().avx512_bf16 ? &kAvx512 : nullptr; }
#endif

}  // namespace attn::cpu
