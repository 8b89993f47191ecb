#include "verify/tolerance.hpp"

#include <cmath>

namespace attn {

double accumulation_roundoff(DType dtype) {
  return dtype == DType::f64 ? unit_roundoff(DType::f64) : unit_roundoff(DType::f32);
}

namespace {
// Half the spacing of the dtype's subnormals: the absolute error of rounding a
// tiny result to the output type, which a relative term cannot cover.
double underflow_floor(DType dtype) {
  switch (dtype) {
    case DType::f64: return std::ldexp(1.0, -1075);
    case DType::f32: return std::ldexp(1.0, -150);
    case DType::f16: return std::ldexp(1.0, -25);
    case DType::bf16: return std::ldexp(1.0, -134);
  }
  return 0;
}
}  // namespace

Bounds derive_bounds(const FixtureHeader& header, const std::vector<double>& golden_out,
                     const std::vector<double>& golden_lse, const ReferenceStats& stats) {
  const Problem& p = header.problem;
  const double c = ToleranceConstants::safety_factor;
  const double u = unit_roundoff(p.dtype);             // inputs, P and out are rounded to dtype
  const double u_acc = accumulation_roundoff(p.dtype);  // dot products and sums
  const double sqrt_d = std::sqrt(static_cast<double>(p.head_dim));
  Bounds bounds;
  bounds.out.resize(golden_out.size());
  bounds.lse.resize(golden_lse.size());
  for (std::int64_t row = 0; row < p.rows(); ++row) {
    const auto r = static_cast<std::size_t>(row);
    const double n = static_cast<double>(stats.visible[r]);
    // Error of one score: a dot of length head_dim, the scale and the bias add.
    const double score_error = (sqrt_d + 2.0) * u_acc * stats.score_magnitude[r];
    // Accumulation error of the softmax denominator and of P V (root-n growth).
    const double sum_error = std::sqrt(std::max(n, 1.0)) * u_acc;
    bounds.lse[r] = c * (score_error + sum_error + u_acc * std::fabs(golden_lse[r]));
    for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
      const auto e = static_cast<std::size_t>(row * p.head_dim_v + d);
      const double out = std::fabs(golden_out[e]);
      const double weighted_v = stats.weighted_abs_v[e];   // sum_j p_j |v_j|
      const double spread_v = stats.weighted_dev_v[e];     // sum_j p_j |v_j - out|
      bounds.out[e] = c * (u * out                          // rounding out to dtype
                           + u * weighted_v                 // P rounded to dtype before P V
                           + sum_error * weighted_v         // accumulating P V and the denominator
                           + score_error * spread_v)        // score errors move weight between keys
                      + underflow_floor(p.dtype);
    }
  }
  if (header.atol || header.rtol) {
    bounds.from_fixture = true;
    const double atol = header.atol.value_or(0.0), rtol = header.rtol.value_or(0.0);
    for (std::size_t e = 0; e < golden_out.size(); ++e) bounds.out[e] = atol + rtol * std::fabs(golden_out[e]);
  }
  return bounds;
}

}  // namespace attn
