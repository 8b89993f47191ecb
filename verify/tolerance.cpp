#include "verify/tolerance.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace attn {

double accumulation_roundoff(DType dtype) {
  return dtype == DType::f64 ? unit_roundoff(DType::f64) : unit_roundoff(DType::f32);
}

double underflow_floor(DType dtype) {
  switch (dtype) {
    case DType::f64: return std::ldexp(1.0, -1074);
    case DType::f32: return std::ldexp(1.0, -149);
    case DType::f16: return std::ldexp(1.0, -24);
    case DType::bf16: return std::ldexp(1.0, -133);
  }
  return 0;
}

// The absolute error of one attention weight that underflows: computed in the
// accumulation type and rounded to the dtype before P V, a weight below the
// dtype's smallest normal keeps only the subnormal spacing (bfloat16 hardware
// flushes it to zero). No relative term covers it: a sink or a score far above
// the rest puts every other weight there, and |v| can be as large as the dtype
// allows. In float32 a weight below 2^-126 (of the row's largest, 1) may be
// flushed too: the exp2 of fused kernels does (CUDA's ex2.approx.ftz; the
// AVX-512 exp2 here, which so avoids vscalefps' microcode assist), and it
// shows where the weights that stay normal carry values of exactly 0 (integer
// codes of V, format version 4).
double weight_underflow(DType dtype) {
  switch (dtype) {
    case DType::f64: return std::ldexp(1.0, -1074);
    case DType::f32: return std::ldexp(1.0, -126);
    case DType::f16: return std::ldexp(1.0, -24);
    case DType::bf16: return std::ldexp(1.0, -126);
  }
  return 0;
}

namespace {

// How far a weight may move, relative to itself, when each score may be off
// by `score_error`: p' / p lies within exp(+-2 score_error), so |p' - p| <=
// expm1(2 score_error) p / 2 times 2. That is score_error to first order (the
// model everywhere else), and grows as it must once score errors pass 1 (a
// 16-bit dequantised K under logits in the thousands), where a first-order
// term would let a weight's factor of e^2 pass as 2.
double weight_shift(double score_error) {
  return score_error < 1e-3 ? score_error : std::expm1(std::min(2.0 * score_error, 700.0)) / 2.0;
}

}  // namespace

double subnormal_allowance(DType dtype, double n) {
  // Each of the row's products and sums may round a subnormal intermediate to
  // the accumulation type's subnormal spacing (absolute, unlike every other term).
  const double spacing = dtype == DType::f64 ? std::ldexp(1.0, -1074) : std::ldexp(1.0, -149);
  // bfloat16's dot-product instructions (AVX512_BF16, AMX, tensor cores) treat
  // subnormal inputs as zero and flush subnormal results, each product's and
  // each sum's (VDPBF16PS is FTZ on every step): allowed (README), up to the
  // smallest normal per term. Two products of normal weights and gradients
  // each below 2^-126 vanish where their sum, -1.7e-38, is a normal (fuzz
  // seed 1 case 341, blocked's bfloat16 dV).
  if (dtype == DType::bf16) return std::max(n, 1.0) * std::ldexp(1.0, -126);
  return n * spacing;
}

std::vector<double> underflow_allowance(const Problem& p, const ReferenceStats& stats) {
  std::vector<double> allowance(stats.weighted_abs_v.size(), 0.0);
  if (stats.hull_lo.size() != allowance.size() || stats.hull_hi.size() != allowance.size() ||
      stats.tiny_weighted_v.size() != allowance.size()) {
    return allowance;
  }
  const auto width = static_cast<std::size_t>(std::max<std::int64_t>(p.head_dim_v, 1));
  for (std::size_t e = 0; e < allowance.size(); ++e) {
    const double n = static_cast<double>(stats.visible[e / width]);
    const double v_max = std::max(std::fabs(stats.hull_lo[e]), std::fabs(stats.hull_hi[e]));
    allowance[e] = std::min(stats.tiny_weighted_v[e], n * weight_underflow(p.dtype) * v_max);
  }
  return allowance;
}

Bounds derive_bounds(const Problem& p, const std::vector<double>& golden_out,
                     const std::vector<double>& golden_lse, const ReferenceStats& stats) {
  const double c = ToleranceConstants::safety_factor;
  const double u = unit_roundoff(p.dtype);             // inputs, P and out are rounded to dtype
  const double u_acc = accumulation_roundoff(p.dtype);  // dot products and sums
  const double sqrt_d = std::sqrt(static_cast<double>(p.head_dim));
  Bounds bounds;
  bounds.out.resize(golden_out.size());
  bounds.lse.resize(golden_lse.size());
  const bool hull = stats.hull_lo.size() == golden_out.size() && stats.hull_hi.size() == golden_out.size();
  if (hull) {
    bounds.hull_lo = stats.hull_lo;
    bounds.hull_hi = stats.hull_hi;
    bounds.hull_slack.resize(golden_out.size());
  }
  // Format version 4: a kernel may dequantise q, k and v into the dtype (one
  // rounding of each element, relative u) before computing as for the other
  // dtypes; a product of q and k so rounded moves by up to u_q + u_k of
  // its magnitude, and a weighted sum of values by u_v of sum p |v|.
  const double u_qk = (p.q_quant.quantised() ? u : 0.0) + (p.k_quant.quantised() ? u : 0.0);
  const double u_v = p.v_quant.quantised() ? u : 0.0;
  const std::vector<double> underflowed_out = underflow_allowance(p, stats);
  for (std::int64_t row = 0; row < p.rows(); ++row) {
    const auto r = static_cast<std::size_t>(row);
    const double n = static_cast<double>(stats.visible[r]);
    // Error of one score: a dot of length head_dim, the scale and the bias add.
    // With a sink every formulation subtracts it from each score (as the
    // row's maximum, or inside lse), rounding at their distance, at most
    // |s_j| + |lse| (a sink far above the scores is lse; one far below
    // moves nothing): weights near e^-82 off by 2.5e-6 relative in float32.
    const double sink_error = p.sinks && std::isfinite(golden_lse[r]) ? u_acc * std::fabs(golden_lse[r]) : 0.0;
    const double score_error = ((sqrt_d + 2.0) * u_acc + u_qk) * stats.score_magnitude[r] + sink_error;
    // Accumulation error of the softmax denominator and of P V (root-n growth).
    const double sum_error = std::sqrt(std::max(n, 1.0)) * u_acc;
    // The denominator's terms that are equal in the arithmetic type round
    // alike (a sink above n equal scores: 1928 equal terms made naive's
    // float64 lse 50 ulp off, fuzz seed 920300 case 4): its growth is the
    // root of each distinct weight's count squared, as the probe's.
    const double repeats = r < stats.weight_repeats.size() ? stats.weight_repeats[r] : 0.0;
    const double denominator_error = std::max(std::sqrt(std::max(n, 1.0)), repeats) * u_acc;
    bounds.lse[r] = c * (score_error + denominator_error + u_acc * std::fabs(golden_lse[r]));
    for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
      const auto e = static_cast<std::size_t>(row * p.head_dim_v + d);
      const double out = std::fabs(golden_out[e]);
      const double weighted_v = stats.weighted_abs_v[e];   // sum_j p_j |v_j|
      const double spread_v = stats.weighted_dev_v[e];     // sum_j p_j |v_j - out|
      // Underflowed weights: each loses at most its spacing and at most itself,
      // so all together at most sum_j min(p_j, spacing) |v_j|.
      const double underflowed = underflowed_out[e];
      const double rounding = c * (u * out                  // rounding out to dtype
                                   + (u + u_v) * weighted_v  // P (and dequantised V) rounded to dtype before P V
                                   + sum_error * weighted_v)  // accumulating P V and the denominator
                              + underflow_floor(p.dtype) + subnormal_allowance(p.dtype, n)
                              + underflowed;
      bounds.out[e] = rounding + c * weight_shift(score_error) * spread_v;  // score errors move weight between keys
      if (!hull) continue;
      bounds.hull_slack[e] = rounding;
      // Inside the hull, no result is farther from the truth than its width.
      const double width = stats.hull_hi[e] - stats.hull_lo[e];
      if (width + rounding < bounds.out[e]) bounds.out[e] = width + rounding;
    }
  }
  return bounds;
}

std::vector<double> fixture_tolerance(const FixtureHeader& header, const std::vector<double>& golden) {
  if (!header.atol && !header.rtol) return {};
  const double atol = header.atol.value_or(0.0), rtol = header.rtol.value_or(0.0);
  std::vector<double> tolerance(golden.size());
  for (std::size_t e = 0; e < golden.size(); ++e) tolerance[e] = atol + rtol * std::fabs(golden[e]);
  return tolerance;
}

ErrorNorms error_norms(const std::vector<double>& truth, const std::vector<double>& got, std::int64_t width,
                       const std::vector<char>& counts) {
  ErrorNorms norms;
  double squares = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    if (!counts[r]) continue;
    for (std::int64_t d = 0; d < width; ++d) {
      const auto e = r * static_cast<std::size_t>(width) + static_cast<std::size_t>(d);
      const double error = std::fabs(got[e] - truth[e]);
      norms.max = std::max(norms.max, error);
      squares += error * error;
      ++norms.elements;
    }
  }
  if (norms.elements > 0) norms.rms = std::sqrt(squares / static_cast<double>(norms.elements));
  return norms;
}

MeasuredLimit measured_limit(DType dtype, const std::vector<double>& truth,
                             const std::vector<std::vector<double>>& baselines, const std::vector<double>& magnitude,
                             std::int64_t width, const std::vector<char>& counts, std::int64_t longest_row) {
  const std::vector<double> zero(truth.size(), 0.0);
  ErrorNorms base;
  for (const auto& baseline : baselines) {
    const ErrorNorms e = error_norms(truth, baseline, width, counts);
    base.max = std::max(base.max, e.max);
    base.rms = std::max(base.rms, e.rms);
  }
  const ErrorNorms scale = error_norms(zero, magnitude, width, counts);  // max and RMS of |magnitude|
  const double floor = ToleranceConstants::baseline_floor * unit_roundoff(dtype);
  // The absolute allowance for subnormal intermediates, at the longest row.
  const double absolute = subnormal_allowance(dtype, static_cast<double>(longest_row));
  return {ToleranceConstants::baseline_factor(dtype), base.max, base.rms, std::max(floor * scale.max, absolute),
          std::max(floor * scale.rms, absolute)};
}

MeasuredLimit gradient_measured_limit(DType dtype, const std::vector<double>& truth, const std::vector<double>& summed,
                                      const std::vector<const std::vector<double>*>& plain, std::int64_t terms,
                                      bool rounded_terms) {
  const double ratio = rounded_terms ? 1.0 : accumulation_roundoff(dtype) / unit_roundoff(dtype);
  std::vector<double> magnitude(truth.size());
  for (std::size_t e = 0; e < truth.size(); ++e) {
    magnitude[e] = std::fabs(truth[e]) + (e < summed.size() ? ratio * summed[e] : 0.0);
  }
  std::vector<std::vector<double>> baselines;
  bool finite = true;
  for (const std::vector<double>* x : plain) {
    for (double v : *x) finite = finite && std::isfinite(v);
    if (x->size() == truth.size()) baselines.push_back(*x);
  }
  MeasuredLimit m = measured_limit(dtype, truth, baselines, magnitude, 1, std::vector<char>(truth.size(), 1), terms);
  if (!finite) m.baseline_max = m.baseline_rms = std::numeric_limits<double>::infinity();
  return m;
}

std::vector<double> forward_floor_magnitude(const Problem& p, const ReferenceStats& stats) {
  std::vector<double> magnitude = stats.weighted_abs_v;
  const double ratio = accumulation_roundoff(p.dtype) / unit_roundoff(p.dtype);
  const auto width = static_cast<std::size_t>(std::max<std::int64_t>(p.head_dim_v, 1));
  // A float64 case's truth rounds its scores to float64 as every
  // implementation does (no wider type holds them): a weight is then known
  // only to about |s| u, and the output to that times sum p |v - out|
  // (py-numpy, attn fuzz --seed 3, case 710: scores near 10, its RMS error
  // 4.2x baselines that sat at one unit roundoff by luck). A float32 or
  // 16-bit case's truth holds its scores far beyond the dtype: nothing added.
  const bool scores_rounded = p.dtype == DType::f64;
  for (std::size_t e = 0; e < magnitude.size() && e < stats.weighted_dev_v.size(); ++e) {
    const std::size_t row = e / width;
    if (row >= stats.added_magnitude.size()) continue;
    const double score = scores_rounded && row < stats.score_magnitude.size() ? stats.score_magnitude[row] : 0.0;
    magnitude[e] += ratio * (stats.added_magnitude[row] + score) * stats.weighted_dev_v[e];
  }
  return magnitude;
}

MeasuredJudgement judge_measured(const ErrorNorms& errors, const MeasuredLimit& m, std::string_view what,
                                 std::string_view of_what) {
  MeasuredJudgement j;
  j.over_max = errors.max / m.reference_max();
  j.over_rms = errors.rms / m.reference_rms();
  j.budget = std::max(j.over_max / ToleranceConstants::baseline_max_share, j.over_rms);
  const double k = m.factor, max_limit = ToleranceConstants::baseline_max_share * k;
  if (j.over_rms > k) {
    j.failure = fmt::format("{}RMS error {:.3g} is {:.1f}x the least accurate {} {:.3g} (limit {}x)", what, errors.rms,
                            j.over_rms, of_what, m.reference_rms(), k);
  } else if (j.over_max > max_limit) {
    j.failure = fmt::format("{}max error {:.3g} is {:.1f}x the least accurate {} {:.3g} (limit {}x)", what, errors.max,
                            j.over_max, of_what, m.reference_max(), max_limit);
  }
  return j;
}

std::vector<double> probe_bounds(const CaseData& data, const ReferenceStats& stats, const std::vector<double>& kept) {
  const Problem& p = data.problem;
  const double u = unit_roundoff(p.dtype), u_acc = accumulation_roundoff(p.dtype);
  const double c = ToleranceConstants::safety_factor;
  const double sqrt_d = std::sqrt(static_cast<double>(p.head_dim));
  const double u_qk = (p.q_quant.quantised() ? u : 0.0) + (p.k_quant.quantised() ? u : 0.0);
  std::vector<double> bounds(stats.visible.size());
  for (std::size_t r = 0; r < bounds.size(); ++r) {
    const double n = static_cast<double>(stats.visible[r]);
    // Rounding errors of equal terms do not cancel: root-n growth over
    // distinct weights, linear within each group of weights the arithmetic
    // type holds equal (n for a uniform row; a saturated softcap or the few
    // codes of an fp8 K leave a long row a handful of distinct weights).
    const double repeats = r < stats.weight_repeats.size() ? stats.weight_repeats[r] : 0.0;
    const double growth = std::max(std::sqrt(std::max(n, 1.0)), repeats);
    bounds[r] = u + ToleranceConstants::probe_factor * (u * stats.weight_norm[r] + growth * u_acc);
    if (kept.empty() || stats.visible[r] == 0) continue;
    // The scores' error as the forward bound has it, with the sink's own
    // magnitude beside the keys' (a kernel scales it as it scales them:
    // log2(e) for exp2); seed 2 case 516: sinks near 108, an error 1.3x the
    // bound without this term, on naive.
    const double sink = data.sinks[(r / static_cast<std::size_t>(p.seq_q)) % static_cast<std::size_t>(p.heads_q)];
    const double score_error = ((sqrt_d + 2.0) * u_acc + u_qk) * std::max(stats.score_magnitude[r], std::fabs(sink));
    bounds[r] += c * weight_shift(score_error) * 2.0 * kept[r] * (1.0 - kept[r]);
  }
  return bounds;
}

// Error of one projection element: its rounding to dtype, the accumulation
// over `inner` terms (root-n), and the exact effect of rounding x, w and the
// bias to dtype (zero when they are representable, as generated cases are).
std::vector<double> projection_error(const std::vector<double>& exact, const std::vector<double>& x, std::int64_t rows,
                                     std::int64_t inner, const std::vector<double>& w, std::int64_t cols,
                                     const std::vector<double>& bias, DType dtype) {
  const double u = unit_roundoff(dtype), u_acc = accumulation_roundoff(dtype);
  const double grow = std::sqrt(static_cast<double>(inner)) * u_acc;
  std::vector<double> error(exact.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      double magnitude = 0, input_rounding = 0;
      for (std::int64_t k = 0; k < inner; ++k) {
        const double xv = x[static_cast<std::size_t>(r * inner + k)], wv = w[static_cast<std::size_t>(k * cols + c)];
        magnitude += std::fabs(xv * wv);
        input_rounding += std::fabs(round_to_dtype(xv, dtype) * round_to_dtype(wv, dtype) - xv * wv);
      }
      const double b = bias.empty() ? 0.0 : bias[static_cast<std::size_t>(c)];
      const auto e = static_cast<std::size_t>(r * cols + c);
      error[e] = u * std::fabs(exact[e]) + grow * magnitude + input_rounding + std::fabs(round_to_dtype(b, dtype) - b);
    }
  return error;
}

LayerProjectionErrors layer_projection_errors(const LayerData& layer, const LayerReference& ref) {
  const Problem& p = layer.problem;
  const CaseData& a = ref.attention;  // exact Q, K, V split into heads
  auto error_of = [&](const std::vector<double>& exact_split, std::int64_t seq, std::int64_t heads, std::int64_t dim,
                      const std::vector<double>& x, std::int64_t in, const std::vector<double>& w,
                      const std::vector<double>& bias) {
    std::vector<double> exact = merge_heads(exact_split, p.batch, heads, seq, dim);
    return split_heads(projection_error(exact, x, p.batch * seq, in, w, heads * dim, bias, p.dtype), p.batch, seq, heads, dim);
  };
  return {error_of(a.q, p.seq_q, p.heads_q, p.head_dim, layer.x_q, layer.model_dim, layer.w_q, layer.b_q),
          error_of(a.k, p.seq_k, p.heads_kv, p.head_dim, layer.x_k, layer.k_in(), layer.w_k, layer.b_k),
          error_of(a.v, p.seq_k, p.heads_kv, p.head_dim_v, layer.x_v, layer.v_in(), layer.w_v, layer.b_v)};
}

std::vector<double> layer_attention_error(const LayerData& layer, const LayerReference& ref) {
  const Problem& p = layer.problem;
  const double c = ToleranceConstants::safety_factor;
  const CaseData& a = ref.attention;  // exact Q, K, V split into heads
  const LayerProjectionErrors projections = layer_projection_errors(layer, ref);
  const std::vector<double>& eq = projections.q;
  const std::vector<double>& ek = projections.k;
  const std::vector<double>& ev = projections.v;
  // The attention's own bound on the exact inputs, then what the projection
  // errors add: dq and dk move the scores, dv the values.
  std::vector<double> error_o = derive_bounds(p, ref.result.out, ref.result.lse, ref.stats).out;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const std::int64_t g = h / p.group_size();
      const std::vector<double> weights = reference_weights(a, b, h);
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        const std::int64_t row = (b * p.heads_q + h) * p.seq_q + i;
        if (ref.stats.visible[static_cast<std::size_t>(row)] == 0) continue;  // stays exactly 0
        double score_shift = 0;
        std::vector<double> value_shift(static_cast<std::size_t>(p.head_dim_v), 0.0);
        for (std::int64_t j = 0; j < p.seq_k; ++j) {
          if (!reference_visible(a, b, h, i, j)) continue;
          double shift2 = 0;
          for (std::int64_t d = 0; d < p.head_dim; ++d) {
            const auto qi = static_cast<std::size_t>(row * p.head_dim + d);
            const auto kj = static_cast<std::size_t>(((b * p.heads_kv + g) * p.seq_k + j) * p.head_dim + d);
            const double dq = eq[qi] * a.k[kj], dk = a.q[qi] * ek[kj];
            shift2 += dq * dq + dk * dk;
          }
          score_shift = std::max(score_shift, std::fabs(p.scale) * std::sqrt(shift2));
          const double pj = weights[static_cast<std::size_t>(i * p.seq_k + j)];
          for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
            value_shift[static_cast<std::size_t>(d)] += pj * ev[static_cast<std::size_t>(((b * p.heads_kv + g) * p.seq_k + j) * p.head_dim_v + d)];
          }
        }
        for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
          const auto e = static_cast<std::size_t>(row * p.head_dim_v + d);
          error_o[e] += c * (score_shift * ref.stats.weighted_dev_v[e] + value_shift[static_cast<std::size_t>(d)]);
        }
      }
    }
  return error_o;
}

// Independent rounding errors add in quadrature (root-sum-square), the same
// probabilistic model as the root-n terms of the attention bound; C = 8 covers
// the rest, as there.
std::vector<double> derive_layer_bounds(const LayerData& layer, const LayerReference& ref) {
  return layer_output_bounds(layer, ref.y, ref.result.out, layer_attention_error(layer, ref));
}

std::vector<double> layer_output_bounds(const LayerData& layer, const std::vector<double>& y,
                                        const std::vector<double>& out, const std::vector<double>& error_o) {
  const Problem& p = layer.problem;
  const std::int64_t m = layer.model_dim;
  const double c = ToleranceConstants::safety_factor;
  const double u = unit_roundoff(p.dtype), u_acc = accumulation_roundoff(p.dtype);
  std::vector<double> bounds(y.size());
  // Through the output projection, over the merged width.
  const std::vector<double> merged_error = merge_heads(error_o, p.batch, p.heads_q, p.seq_q, p.head_dim_v);
  const std::vector<double> merged_o = merge_heads(out, p.batch, p.heads_q, p.seq_q, p.head_dim_v);
  const std::int64_t width = layer.o_width();
  const double grow = std::sqrt(static_cast<double>(width)) * u_acc;
  for (std::int64_t r = 0; r < p.batch * p.seq_q; ++r)
    for (std::int64_t col = 0; col < m; ++col) {
      double carried2 = 0, magnitude = 0, input_rounding = 0;
      for (std::int64_t k = 0; k < width; ++k) {
        const double w = layer.w_o[static_cast<std::size_t>(k * m + col)];
        const double o = merged_o[static_cast<std::size_t>(r * width + k)];
        const double carried = merged_error[static_cast<std::size_t>(r * width + k)] * w;
        carried2 += carried * carried;
        magnitude += std::fabs(o * w);
        input_rounding += std::fabs(o) * std::fabs(round_to_dtype(w, p.dtype) - w);
      }
      const auto e = static_cast<std::size_t>(r * m + col);
      const double b_o = layer.b_o.empty() ? 0.0 : layer.b_o[static_cast<std::size_t>(col)];
      bounds[e] = std::sqrt(carried2) +
                  c * (u * std::fabs(y[e]) + grow * magnitude + input_rounding + std::fabs(round_to_dtype(b_o, p.dtype) - b_o));
    }
  return bounds;
}

}  // namespace attn
