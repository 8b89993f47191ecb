#include "core/detmath.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

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
