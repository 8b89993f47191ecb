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

bool probabilities_from_lse(const Kernels& kernels, float* s, std::int64_t n, float hi, float lo, int lift) {
  if (hi == kNegInf) {  // no visible key
    std::fill_n(s, n, 0.0f);
    return false;
  }
  // The lowest weight that is not 0 for certain (a branch-free loop the
  // compiler vectorises).
  float lowest = 0.0f;
  for (std::int64_t j = 0; j < n; ++j) {
    s[j] -= hi;
    lowest = std::min(lowest, s[j] > -151.0f - static_cast<float>(lift) ? s[j] : 0.0f);
  }
  if (lift > 0 || lowest < -125.0f) {
    const double shift = static_cast<double>(lift) - static_cast<double>(lo);
    for (std::int64_t j = 0; j < n; ++j) {
      s[j] = s[j] == kNegInf ? 0.0f : static_cast<float>(std::exp2(static_cast<double>(s[j]) + shift));
    }
    return lowest + static_cast<float>(lift) < -125.0f;
  }
  kernels.exp2_sum(s, n, 1.0f, lo, 0);
  return false;
}

namespace {

// The largest |x| over batch entries [b0, b1) and heads [h0, h1) of a view.
double max_abs(const TensorView& v, std::int64_t b0, std::int64_t b1, std::int64_t h0, std::int64_t h1) {
  double m = 0;
  for (std::int64_t b = b0; b < b1; ++b)
    for (std::int64_t h = h0; h < h1; ++h)
      for (std::int64_t s = 0; s < v.shape[2]; ++s)
        for (std::int64_t c = 0; c < v.shape[3]; ++c) m = std::max(m, std::fabs(static_cast<double>(load_float(v, v.offset(b, h, s, c)))));
  return m;
}

GradientShifts shifts_from(const Problem& p, double dout, double v, double q, double k) {
  const double rows = static_cast<double>(p.seq_q * p.group_size()), scale = std::fabs(p.scale);
  const double a = dout * v * static_cast<double>(p.head_dim_v);
  const double largest = 2.0 * a * std::max({1.0, scale * k, scale * q * rows}) + dout * rows;
  // 2^120: room for a dropout's 1 / (1 - p) and the sums' last roundings.
  auto shift = [](double x) { return std::clamp(static_cast<int>(std::ceil(std::log2(std::max(x, 1.0)))) - 120, 1, 250); };
  return {shift(2.0 * a), shift(largest)};
}

}  // namespace

GradientShifts gradient_overflow_shifts(const Problem& p, const BackwardIO& io) {
  auto all = [](const TensorView& v) { return max_abs(v, 0, v.shape[0], 0, v.shape[1]); };
  return shifts_from(p, all(io.dout), all(io.forward.v), all(io.forward.q), all(io.forward.k));
}

GradientShifts gradient_overflow_shifts(const Problem& p, const BackwardIO& io, std::int64_t b, std::int64_t kv_head) {
  const std::int64_t g = p.group_size(), h0 = kv_head * g;
  return shifts_from(p, max_abs(io.dout, b, b + 1, h0, h0 + g), max_abs(io.forward.v, b, b + 1, kv_head, kv_head + 1),
                     max_abs(io.forward.q, b, b + 1, h0, h0 + g), max_abs(io.forward.k, b, b + 1, kv_head, kv_head + 1));
}

bool next_gradient_pass(GradientPass& pass, const GradientShifts& shifts) {
  constexpr int kLargestLift = 100;  // lifted weights stay far below float32's largest
  if (pass.dout_shift == 0 && shifts.scores <= kLargestLift) {
    pass = GradientPass{shifts.scores, shifts.scores};
    return true;
  }
  if (pass.weight_lift != 0 || pass.dout_shift == 0) {
    pass = GradientPass{shifts.all, 0};
    return true;
  }
  return false;
}

std::int64_t dbias_row(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t i) {
  const BroadcastShape& shape = p.bias;
  const std::int64_t bb = shape.batch == 1 ? 0 : b, bh = shape.heads == 1 ? 0 : h, bq = shape.rows == 1 ? 0 : i;
  return ((bb * shape.heads + bh) * shape.rows + bq) * p.seq_k;
}

bool store_rows(const MutableTensorView& view, std::int64_t b, std::int64_t h, std::int64_t first, const float* rows,
                std::int64_t seq, std::int64_t width, std::int64_t ld, int shift) {
  bool finite = true;
  for (std::int64_t s = 0; s < seq; ++s) {
    const float* row = rows + s * ld;
    for (std::int64_t c = 0; c < width; ++c) {
      finite = finite && std::isfinite(row[c]);
      // ldexp only when shifted: a library call per element otherwise costs 7% of a backward
      store_float(view, view.offset(b, h, first + s, c), shift == 0 ? row[c] : std::ldexp(row[c], shift));
    }
  }
  return finite;
}

bool store_dbias(const Problem& p, const MutableTensorView& dbias, const std::vector<double>& sums, int shift) {
  bool finite = true;
  const BroadcastShape& shape = p.bias;
  for (std::int64_t bb = 0; bb < shape.batch; ++bb)
    for (std::int64_t bh = 0; bh < shape.heads; ++bh)
      for (std::int64_t bq = 0; bq < shape.rows; ++bq)
        for (std::int64_t j = 0; j < p.seq_k; ++j) {
          const double sum = sums[static_cast<std::size_t>(((bb * shape.heads + bh) * shape.rows + bq) * p.seq_k + j)];
          finite = finite && std::isfinite(sum);
          store_float(dbias, dbias.offset(bb, bh, bq, j), static_cast<float>(std::ldexp(sum, shift)));
        }
  return finite;
}

}  // namespace attn::cpu
