#include "impls/cpu_kernels/gradients.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "impls/cpu_kernels/kernels.hpp"

namespace attn::cpu {

namespace {
constexpr double kLog2e = 1.4426950408889634;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}  // namespace

void split_lse2(double lse, float& hi, float& lo) {
  const double lse2 = lse * kLog2e;
  hi = static_cast<float>(lse2);
  lo = std::isfinite(lse2) ? static_cast<float>(lse2 - static_cast<double>(hi)) : 0.0f;
}

bool probabilities_from_lse(const Kernels& kernels, float* s, std::int64_t n, float hi, float lo) {
  if (hi == kNegInf) {  // no visible key
    std::fill_n(s, n, 0.0f);
    return false;
  }
  // The lowest weight that is not 0 for certain (a branch-free loop the
  // compiler vectorises).
  float lowest = 0.0f;
  for (std::int64_t j = 0; j < n; ++j) {
    s[j] -= hi;
    lowest = std::min(lowest, s[j] > -151.0f ? s[j] : 0.0f);
  }
  if (lowest < -125.0f) {
    for (std::int64_t j = 0; j < n; ++j) {
      s[j] = s[j] == kNegInf ? 0.0f : static_cast<float>(std::exp2(static_cast<double>(s[j]) - static_cast<double>(lo)));
    }
    return true;
  }
  kernels.exp2_sum(s, n, 1.0f, lo, 0);
  return false;
}

int gradient_overflow_shift(double max_dout, double max_v, double max_q, double max_k, std::int64_t head_dim_v,
                            double scale, double rows) {
  const double a = max_dout * max_v * static_cast<double>(head_dim_v);
  scale = std::fabs(scale);
  const double largest = 2.0 * a * std::max({1.0, scale * max_k, scale * max_q * rows}) + max_dout * rows;
  return std::clamp(static_cast<int>(std::ceil(std::log2(std::max(largest, 1.0)))) - 120, 1, 250);
}

}  // namespace attn::cpu
