#include "core/detmath.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace attn::detmath {

namespace {
// ln 2 split so that k * kLn2Hi is exact for |k| < 2^11.
constexpr double kLn2Hi = 6.93147180369123816490e-01;
constexpr double kLn2Lo = 1.90821492927058770002e-10;
constexpr double kInvLn2 = 1.44269504088896338700e+00;
}  // namespace

double exp(double x) {
  if (std::isnan(x)) return x;
  if (x > 709.782712893384) return std::numeric_limits<double>::infinity();
  if (x < -745.2) return 0.0;
  // x = k ln2 + r, |r| <= ln2 / 2.
  double k = std::nearbyint(x * kInvLn2);
  double r = (x - k * kLn2Hi) - k * kLn2Lo;
  // Taylor series in Horner form: 1 + r (1 + r/2 (1 + r/3 (...))). With
  // |r| <= 0.35, 20 terms are far below half an ulp.
  double sum = 1.0;
  for (int n = 20; n >= 1; --n) sum = 1.0 + r * sum / n;
  // sum * 2^k: one multiplication by an exact power of two rounds once, as
  // ldexp does, so the two agree to the bit; ldexp only where 2^k itself is
  // not a normal double.
  const int e = static_cast<int>(k);
  if (e < -1022 || e > 1023) return std::ldexp(sum, e);
  return sum * std::bit_cast<double>(static_cast<std::uint64_t>(e + 1023) << 52);
}

namespace {

void exp_portable(const double* x, double* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = exp(x[i]);
}

#if defined(__x86_64__)
// exp() on four lanes: the same multiplications, subtractions, divisions and
// additions in the same order (no fused multiply-add: the target has none),
// nearbyint as a rounding in the current mode. A lane that exp() would send
// elsewhere (NaN, beyond the range, 2^k not a normal double) is redone by it.
__attribute__((target("avx2"))) void exp_avx2(const double* x, double* y, std::size_t n) {
  const __m256d inv_ln2 = _mm256_set1_pd(kInvLn2), ln2_hi = _mm256_set1_pd(kLn2Hi), ln2_lo = _mm256_set1_pd(kLn2Lo);
  const __m256d one = _mm256_set1_pd(1.0), lowest = _mm256_set1_pd(-745.2), highest = _mm256_set1_pd(709.782712893384);
  const __m256d k_min = _mm256_set1_pd(-1022.0), k_max = _mm256_set1_pd(1023.0);
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    alignas(32) double in[4];
    const __m256d v = _mm256_loadu_pd(x + i);
    _mm256_store_pd(in, v);
    const __m256d k = _mm256_round_pd(_mm256_mul_pd(v, inv_ln2), _MM_FROUND_CUR_DIRECTION | _MM_FROUND_NO_EXC);
    const __m256d r = _mm256_sub_pd(_mm256_sub_pd(v, _mm256_mul_pd(k, ln2_hi)), _mm256_mul_pd(k, ln2_lo));
    __m256d sum = one;
    for (int m = 20; m >= 1; --m) {
      sum = _mm256_add_pd(one, _mm256_div_pd(_mm256_mul_pd(r, sum), _mm256_set1_pd(static_cast<double>(m))));
    }
    __m256d main = _mm256_and_pd(_mm256_cmp_pd(v, lowest, _CMP_GE_OQ), _mm256_cmp_pd(v, highest, _CMP_LE_OQ));
    main = _mm256_and_pd(main, _mm256_and_pd(_mm256_cmp_pd(k, k_min, _CMP_GE_OQ), _mm256_cmp_pd(k, k_max, _CMP_LE_OQ)));
    const __m256d k_used = _mm256_blendv_pd(_mm256_setzero_pd(), k, main);  // exact integers in [-1022, 1023]
    const __m256i e = _mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(k_used));
    const __m256i scale = _mm256_slli_epi64(_mm256_add_epi64(e, _mm256_set1_epi64x(1023)), 52);
    _mm256_storeu_pd(y + i, _mm256_mul_pd(sum, _mm256_castsi256_pd(scale)));
    const int lanes = _mm256_movemask_pd(main);
    if (lanes != 0xF) {
      for (int l = 0; l < 4; ++l) {
        if (!(lanes & (1 << l))) y[i + static_cast<std::size_t>(l)] = exp(in[l]);
      }
    }
  }
  exp_portable(x + i, y + i, n - i);
}
#endif

}  // namespace

void exp_n(const double* x, double* y, std::size_t n) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return exp_avx2(x, y, n);
#endif
  exp_portable(x, y, n);
}

double log(double x) {
  if (std::isnan(x) || x < 0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0) return -std::numeric_limits<double>::infinity();
  if (std::isinf(x)) return x;
  int e = 0;
  double m = std::frexp(x, &e);  // x = m 2^e, m in [0.5, 1)
  if (m < 0.70710678118654752) {
    m *= 2;
    e -= 1;
  }
  // log(m) = 2 atanh(t), t = (m - 1) / (m + 1), |t| <= 0.1716.
  double t = (m - 1.0) / (m + 1.0);
  double t2 = t * t;
  double term = t, sum = 0.0;
  for (int n = 1; n <= 41; n += 2) {
    sum += term / n;
    term *= t2;
  }
  return (2.0 * sum + e * kLn2Lo) + e * kLn2Hi;
}

double tanh(double x) {
  if (x != x) return x;
  const double a = x < 0 ? -x : x;
  double t;
  if (a < 0.25) {
    // tanh a = sum c_n a^(2n+1); at a = 1/4 the terms shrink by about 40 each,
    // so eleven terms reach a double's precision.
    static const double c[] = {1.0,
                               -1.0 / 3.0,
                               2.0 / 15.0,
                               -17.0 / 315.0,
                               62.0 / 2835.0,
                               -1382.0 / 155925.0,
                               21844.0 / 6081075.0,
                               -929569.0 / 638512875.0,
                               6404582.0 / 10854718875.0,
                               -443861162.0 / 1856156927625.0,
                               18888466084.0 / 194896477400625.0};
    const double a2 = a * a;
    double sum = 0;
    for (int n = 10; n >= 0; --n) sum = sum * a2 + c[n];
    t = a * sum;
  } else if (a > 20) {
    t = 1.0;  // 1 - tanh(20) < 2^-57
  } else {
    const double e = exp(-2.0 * a);  // at most e^-0.5: 1 - e loses under 2 bits
    t = (1.0 - e) / (1.0 + e);
  }
  return x < 0 ? -t : t;
}

}  // namespace attn::detmath
