// The tolerance policy: the one place that decides how far a backend's output
// may be from the float64 golden. See README.md, "Tolerance policy", for the
// derivation; every constant below is explained there and here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "attnbench/problem.hpp"
#include "fixtures/fixture.hpp"
#include "reference/layer.hpp"
#include "reference/backward.hpp"
#include "reference/reference.hpp"

namespace attn {

struct ToleranceConstants {
  // The a-priori bound (element by element, the safety net for localised
  // errors): how much worse than our estimate of a plain same-precision
  // implementation's error a backend may be. The estimate is a typical
  // (root-n) one, not a worst case, so it gets a generous factor.
  static constexpr double safety_factor = 8.0;

  // The measured bound: a backend's max and RMS errors may each be at most
  // k times those of the plain implementation of verify/baseline.hpp on the
  // same case (FlashAttention's tests allow 2x, PyTorch's SDPA tests 4-5x).
  // Measured on the correct backends (README): float32 up to 3.1x (tiled
  // sums and a prescaled Q on scores in the hundreds), 16-bit types up to
  // 1.16x (the final rounding, which every implementation shares, dominates).
  // The baseline error is floored at `baseline_floor` unit roundoffs of the
  // magnitude the output is summed from, sum_j p_ij |v_jd| (at least |out|):
  // every implementation rounds its partial sums at that magnitude, so a
  // baseline that is exact by luck (one output element, exactly
  // representable results, cancellation) does not ask for better.
  // The RMS error must be within k times the formulations'; the max error,
  // the largest of a few elements in a small case and so a noisy statistic,
  // within `baseline_max_share` times that (localised bugs, which the RMS
  // dilutes, are orders of magnitude beyond either).
  static constexpr double baseline_max_share = 2.0;
  static constexpr double baseline_factor_16bit = 3.0;
  static constexpr double baseline_factor_wide = 4.0;  // float32 and float64
  static constexpr double baseline_floor = 1.0;
  static constexpr double baseline_factor(DType dtype) {
    return dtype == DType::f16 || dtype == DType::bf16 ? baseline_factor_16bit : baseline_factor_wide;
  }

  // The rounding-bias test (verify/bias.hpp): a backend fails when the mean
  // sign of its errors over at least `bias_min_rows` rows is at least
  // `bias_min_mean` away from 0 (a bias that matters) with |t| at least
  // `bias_min_t` (far beyond chance: about 1e-6 even at 16 rows).
  // The test runs on 16-bit outputs only (verify/compare.cpp says why).
  // Measured: correct backends lean up to 0.36 beyond every plain formulation,
  // directed rounding 0.69 and more; 0.5 lies between.
  static constexpr std::int64_t bias_min_rows = 16;
  static constexpr double bias_min_mean = 0.5;
  static constexpr double bias_min_t = 8.0;

  // The normalisation probe: with V replaced by ones every visible row must
  // come out as 1 within one unit roundoff of the output type (its rounding)
  // plus `probe_factor` times the error of P's rounding (u ||p||_2) and of the
  // denominator's sum (sqrt(n) u_acc).
  static constexpr double probe_factor = 2.0;

  // A fixture's own tolerance is called loose when it would accept, at some
  // element, an error of this share of the case's largest |out|.
  static constexpr double loose_tolerance_share = 0.1;
};

struct Bounds {
  std::vector<double> out;  // per element of out: |got - truth| must not exceed this
  std::vector<double> lse;  // per row: |got_lse - truth_lse| must not exceed this
  // Per element of out (SDPA cases; empty for layers): an output must lie in
  // [hull_lo - hull_slack, hull_hi + hull_slack], the convex hull of the
  // visible values widened by the rounding of a plain implementation (every
  // term of the bound but the scores'). No score error can move a weighted
  // mean of the values out of their hull, so `out` never exceeds the hull's
  // width plus the slack, however large the scores make the bound.
  std::vector<double> hull_lo, hull_hi, hull_slack;
  // Whether x, at out element e, lies in the widened hull (true without one).
  bool in_hull(std::size_t e, double x) const {
    return hull_lo.empty() || (x >= hull_lo[e] - hull_slack[e] && x <= hull_hi[e] + hull_slack[e]);
  }
};

// The measured bound of one case: the baseline's errors and the floor.
struct MeasuredLimit {
  double factor = ToleranceConstants::baseline_factor_wide;  // k for the case's dtype
  double baseline_max = 0, baseline_rms = 0;  // the less accurate plain formulation's errors against the truth
  double floor_max = 0, floor_rms = 0;        // baseline_floor * u * (max, RMS) of the summed magnitude
  double reference_max() const { return std::max(baseline_max, floor_max); }
  double reference_rms() const { return std::max(baseline_rms, floor_rms); }
};

// Max and RMS of |got - truth| over the rows whose `counts` entry is set.
struct ErrorNorms {
  double max = 0, rms = 0;
  std::int64_t elements = 0;
};
ErrorNorms error_norms(const std::vector<double>& truth, const std::vector<double>& got, std::int64_t width,
                       const std::vector<char>& counts);

// `baselines`: the plain formulations' outputs (the larger max and RMS error
// count); `magnitude`: per element, what the floor is a unit roundoff of
// (sum_j p_ij |v_jd| for attention, |truth| where that is unknown);
// `longest_row`: the most keys any row sees (for the subnormal allowance).
MeasuredLimit measured_limit(DType dtype, const std::vector<double>& truth,
                             const std::vector<std::vector<double>>& baselines, const std::vector<double>& magnitude,
                             std::int64_t width, const std::vector<char>& counts, std::int64_t longest_row);

// The measured bound of one gradient (an attention's or a layer's): k times
// the least accurate of `plain` (the plain formulations' values; those not
// of truth's size are left out), floored at a unit roundoff of the result
// plus one of the accumulation at `summed` (each element's sum of |terms|),
// subnormals allowed over `terms`; infinite (no measurement) where a plain
// value is not finite. With `rounded_terms` the terms are themselves values
// rounded to the dtype (a layer's chain multiplies dQ, dK, dV and O as the
// dtype holds them): the floor takes one dtype rounding of `summed`.
MeasuredLimit gradient_measured_limit(DType dtype, const std::vector<double>& truth, const std::vector<double>& summed,
                                      const std::vector<const std::vector<double>*>& plain, std::int64_t terms,
                                      bool rounded_terms = false);

// The forward's floor magnitude per out element: sum_j p_ij |v_jd|, and what
// adding a bias or ALiBi term moves: every float formulation rounds the score
// at the size of what it adds, so P moves by |bias| + |ALiBi| accumulation
// roundoffs relative, and out by sum_j p_ij (|bias_ij| + |ALiBi_ij|) |v_jd -
// out_id| (bounded with the row's largest), in unit roundoffs of the dtype.
// Without it a formulation whose scores round at another size (log2 units,
// where a bias of -1000 is -1443) exceeds k times the plain ones by luck on a
// row with few keys. (Scores of q.k alone are left out: on exact lattice
// scores the plain formulations round nothing there, and that is what lets
// the measured bound see an exp2 a few ulp off.)
std::vector<double> forward_floor_magnitude(const Problem& p, const ReferenceStats& stats);

// The absolute error that subnormal intermediates may add to an element whose
// row sees `n` keys: n spacings of the accumulation type's subnormals, and for
// bfloat16 the smallest normal (its hardware flushes subnormals).
double subnormal_allowance(DType dtype, double n);

// Per out element: what the row's weights below the dtype's normal range
// may lose, all together at most sum_j min(p_j, smallest normal) |v_j| (0
// without the reference's hull and tiny-weight statistics). The forward
// bound carries it, and so does the measured bound's floor: a kernel whose
// running max includes a sink far above the scores flushes such weights
// where a plain one that divides last keeps a few bits.
std::vector<double> underflow_allowance(const Problem& p, const ReferenceStats& stats);

// Per row: how far from 1 (or from the share the visible keys keep beside a
// sink) a visible row of the normalisation probe may be. Equal weights sum
// identical terms whose rounding errors do not cancel: the accumulation
// grows as the root of the sum of each distinct weight's count squared
// (ReferenceStats::weight_repeats): n for a uniform row, root n for distinct
// weights. With a sink (`kept`: per row, the share the visible keys keep
// beside it; empty without sinks) the probe's value is no longer exact under
// score errors: each moves weight between the keys and the sink, which hold
// "values" 1 and 0, as the forward bound's spread term (2 kept (1 - kept)).
std::vector<double> probe_bounds(const CaseData& data, const ReferenceStats& stats, const std::vector<double>& kept);

// Errors (max and RMS) judged against a measured limit: the ratios, the
// budget (1 = at the limit of either check) and, when over the limit, why
// ("RMS error ... is ...x the least accurate <of_what> ..."), prefixed with
// `what` ("dq: "; empty for out).
struct MeasuredJudgement {
  double over_max = 0, over_rms = 0, budget = 0;
  std::string failure;  // empty when within the limit
};
MeasuredJudgement judge_measured(const ErrorNorms& errors, const MeasuredLimit& limit, std::string_view what,
                                 std::string_view of_what);

// A fixture's own rule, atol + rtol |out| per element; empty when it has none.
std::vector<double> fixture_tolerance(const FixtureHeader& header, const std::vector<double>& golden);

// Unit roundoff of the arithmetic a plain implementation accumulates in:
// float64 for float64 cases, float32 for all the others.
double accumulation_roundoff(DType dtype);

// The spacing of the dtype's subnormals: rounding a tiny result to the output
// type costs up to half of it, absolutely, which a relative term cannot cover;
// the other half is for the accumulated error of a result that lands there.
double underflow_floor(DType dtype);
// Weights below this (of the row's largest, 1) keep only the subnormal
// spacing or are flushed: each may lose all of itself (tolerance.cpp says why).
double weight_underflow(DType dtype);

// The gradients' a-priori bounds (docs/verification/tolerance.md,
// "Gradients"; verify/tolerance_gradients.cpp), computed beside the truth
// from the facts reference_backward reports row by row: per element, C times
// the first-order error of a plain backward in the case's precision (P
// recomputed from the scores, dP = dO V^T, D = rowsum(dO o O), dS = P (dP -
// D), then the three products: roundings of every sum with root-n growth,
// the score error moving P, the forward's error of O inside D, and the
// cancellation in dP - D measured on |dP| + |D| rather than on the
// difference), plus the absolute floors of subnormal results and
// intermediates; and per element the magnitude a plain backward rounds at,
// each dS term taken at P (|dP| + |D|) before dP and D cancel (what the
// measured bound's floor is a unit roundoff of).
struct GradientBounds {
  ReferenceGradients value;      // the truth (reference_backward)
  ReferenceGradients bound;      // the same shapes
  ReferenceGradients magnitude;  // the same shapes
};
GradientBounds derive_gradient_bounds(const CaseData& data, const std::vector<double>& dout,
                                      const ReferenceResult& forward, const ReferenceStats& stats, bool bias_gradient);
// The number of terms the gradients' subnormal allowance is taken over.
double gradient_terms(const Problem& problem);

// The a-priori bounds, from the truth's out and lse and its statistics.
Bounds derive_bounds(const Problem& problem, const std::vector<double>& truth_out,
                     const std::vector<double>& truth_lse, const ReferenceStats& stats);

// Bounds for a whole layer's output y [batch, seq_q, model_dim]: the errors of
// the three input projections carried through the attention, the attention's
// own bound, and the output projection.
std::vector<double> derive_layer_bounds(const LayerData& layer, const LayerReference& reference);
// The same for any attention output `out` with its bound `error_o` ([batch,
// heads_q, seq_q, head_dim_v]) and the y it projects to: the output
// projection's part (a declared convention's rows use it).
std::vector<double> layer_output_bounds(const LayerData& layer, const std::vector<double>& y,
                                        const std::vector<double>& out, const std::vector<double>& error_o);

// The pieces of it that the layer's gradients reuse (verify/layer_backward.hpp).
// One projection's first-order error per element (no safety factor): its
// rounding to dtype, the accumulation over `inner` terms (root-n), and the
// exact effect of rounding x, w and the bias to dtype.
std::vector<double> projection_error(const std::vector<double>& exact, const std::vector<double>& x, std::int64_t rows,
                                     std::int64_t inner, const std::vector<double>& w, std::int64_t cols,
                                     const std::vector<double>& bias, DType dtype);
// Those of the three input projections, split into heads as the attention sees them.
struct LayerProjectionErrors {
  std::vector<double> q, k, v;
};
LayerProjectionErrors layer_projection_errors(const LayerData& layer, const LayerReference& reference);
// The bound of the attention's output inside the layer [batch, heads_q, seq_q,
// head_dim_v]: its own bound and what the projections' errors add.
std::vector<double> layer_attention_error(const LayerData& layer, const LayerReference& reference);

}  // namespace attn
