#include "verify/compare.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace attn {

std::string_view verdict_name(Verdict verdict) {
  switch (verdict) {
    case Verdict::pass: return "PASS";
    case Verdict::fail: return "FAIL";
    case Verdict::skip: return "SKIP";
    case Verdict::mistrusted: return "MISTRUSTED";
    case Verdict::differs: return "DIFFERS";
  }
  return "?";
}

void Comparison::conclude(const ConventionOutcome& conventions) {
  if (!conventions.failure.empty()) fail(conventions.failure);
  if (conventions.rows_followed == 0) return;
  if (verdict == Verdict::pass) {
    verdict = Verdict::differs;
    reason = differs_reason(conventions);
  } else if (verdict == Verdict::mistrusted) {
    reason += "; " + differs_reason(conventions);
  }
}

namespace {

Dims4 coords_of(const Problem& p, std::int64_t index) {
  Dims4 c{};
  c[3] = index % p.head_dim_v;
  index /= p.head_dim_v;
  c[2] = index % p.seq_q;
  index /= p.seq_q;
  c[1] = index % p.heads_q;
  c[0] = index / p.heads_q;
  return c;
}

}  // namespace

void Comparison::fail(std::string why) {
  verdict = Verdict::fail;
  reason = reason.empty() ? std::move(why) : reason + "; " + why;
}

namespace {

std::vector<char> rows_with_keys(const std::vector<std::int64_t>& visible) {
  std::vector<char> counts(visible.size());
  for (std::size_t r = 0; r < visible.size(); ++r) counts[r] = visible[r] > 0;
  return counts;
}

// Check 2, element by element: the a-priori bound against the float64 truth,
// NaN and infinity, rows with no visible key exactly 0; and how much of the
// result could be told from zero at all (for MISTRUSTED).
void check_a_priori(const CompareInputs& in, Comparison& r) {
  const Problem& p = in.problem;
  r.compared = true;
  std::int64_t informative = 0;
  std::string first_failure;
  auto note = [&](std::int64_t e, std::string what) {
    first_failure = fmt::format("{} at [{}]", what, fmt::join(coords_of(p, e), ","));
  };
  const auto n = static_cast<std::int64_t>(in.truth_out.size());
  for (std::int64_t e = 0; e < n; ++e) {
    const double truth = in.truth_out[static_cast<std::size_t>(e)];
    const double got = in.got_out[static_cast<std::size_t>(e)];
    const double bound = in.bounds.out[static_cast<std::size_t>(e)];
    const bool hidden_row = in.visible[static_cast<std::size_t>(e / p.head_dim_v)] == 0;
    // An element tells something when it is distinguishable from zero within
    // its bound, or when it sits in a hidden row, which must be exactly 0.
    if (std::fabs(truth) > bound || hidden_row) ++informative;
    double error = std::fabs(got - truth);
    double ratio;
    if (!std::isfinite(got)) {
      ++(std::isnan(got) ? r.nan_elements : r.infinite_elements);
      error = std::numeric_limits<double>::infinity();
      ratio = error;
      if (first_failure.empty()) note(e, fmt::format("non-finite output {} where the truth is {}", got, truth));
    } else if (hidden_row && got != 0.0) {
      // A row with no visible key must be exactly zero, whatever the bound.
      ratio = std::numeric_limits<double>::infinity();
      if (first_failure.empty()) note(e, fmt::format("row with no visible key is {}, not exactly 0", got));
    } else if (!in.bounds.in_hull(static_cast<std::size_t>(e), got)) {
      // A weighted mean of the visible values never leaves their hull.
      ratio = std::numeric_limits<double>::infinity();
      if (first_failure.empty()) {
        note(e, fmt::format("got {:.6g}, outside the visible values' range [{:.6g}, {:.6g}] (the truth is {:.6g})", got,
                            in.bounds.hull_lo[static_cast<std::size_t>(e)], in.bounds.hull_hi[static_cast<std::size_t>(e)],
                            truth));
      }
    } else {
      ratio = bound > 0 ? error / bound : (error > 0 ? std::numeric_limits<double>::infinity() : 0.0);
      if (ratio > 1.0 && first_failure.empty()) {
        note(e, fmt::format("got {:.6g}, expected {:.6g}, bound {:.3g}", got, truth, bound));
      }
    }
    r.max_abs_error = std::max(r.max_abs_error, error);
    if (truth != 0.0) r.max_rel_error = std::max(r.max_rel_error, error / std::fabs(truth));
    if (ratio > r.worst_ratio || r.worst_index < 0) {
      r.worst_ratio = ratio;
      r.worst_index = e;
      r.bound_at_worst = bound;
    }
  }
  if (r.worst_index >= 0) r.worst_coords = coords_of(p, r.worst_index);
  r.informative_fraction = n > 0 ? static_cast<double>(informative) / static_cast<double>(n) : 0.0;
  if (r.worst_ratio > 1.0) r.fail(first_failure);
}

// Check 2 for the log-sum-exp, when the backend returns one: within its bound,
// and -inf exactly where the truth is.
void check_lse(const CompareInputs& in, Comparison& r) {
  if (!in.got_lse) return;
  double worst = 0;
  std::string lse_failure;
  for (std::size_t row = 0; row < in.truth_lse.size(); ++row) {
    const double truth = in.truth_lse[row], got = (*in.got_lse)[row];
    double ratio;
    if (std::isinf(truth) || std::isinf(got) || std::isnan(got)) {
      ratio = (got == truth) ? 0.0 : std::numeric_limits<double>::infinity();
    } else {
      ratio = std::fabs(got - truth) / in.bounds.lse[row];
    }
    if (ratio > 1.0 && lse_failure.empty()) {
      lse_failure = fmt::format("lse of row {} is {}, expected {} (bound {:.3g})", row, got, truth, in.bounds.lse[row]);
    }
    worst = std::max(worst, ratio);
  }
  r.lse_worst_ratio = worst;
  if (!lse_failure.empty()) r.fail(lse_failure);
}

// Check 3, the measured bound: max and RMS error within k times the least
// accurate plain same-precision formulation's (skipped when the output is not
// finite, which check 2 has failed already).
void check_measured(const CompareInputs& in, const std::vector<char>& counts, Comparison& r) {
  if (!in.measured) return;
  for (double x : in.got_out) {
    if (!std::isfinite(x)) return;
  }
  const ErrorNorms norms = error_norms(in.truth_out, in.got_out, in.problem.head_dim_v, counts);
  r.rms_error = norms.rms;
  if (norms.elements == 0) return;
  const MeasuredJudgement j = judge_measured(norms, *in.measured, "", "plain implementation's");
  r.baseline_ratio = j.budget;
  r.baseline_max_ratio = j.over_max;
  r.baseline_rms_ratio = j.over_rms;
  if (!j.failure.empty()) r.fail(j.failure);
}

// Check 4, the rounding-bias test. Only where the output's rounding dominates
// (16-bit types): in float32 and float64 the accumulation's own lean is as
// large as a directed rounding of out, and differs between correct designs (a
// sequential sum of many positive terms loses the small ones: attn fuzz
// measured -29 u on l over 2683 keys, against -2 u in 16 lanes), so a sign
// test cannot tell them apart.
void check_rounding_bias(const CompareInputs& in, const std::vector<char>& counts, Comparison& r) {
  const DType dtype = in.problem.dtype;
  if (!in.baselines || in.baselines->empty() || (dtype != DType::f16 && dtype != DType::bf16)) return;
  // Errors within the subnormal allowance (bfloat16's flushing) carry no direction.
  r.bias = least_biased(in.truth_out, in.got_out, *in.baselines, in.problem.head_dim_v, counts,
                        subnormal_allowance(dtype, 1.0), nullptr);
  if (r.bias.biased) r.fail("rounding bias: " + r.bias.finding);
}

// Check 6, the fixture's own atol and rtol against its stored out.
void check_fixture_tolerance(const CompareInputs& in, Comparison& r) {
  if (!in.golden_out || !in.fixture_tolerance) return;
  double worst = 0;
  std::int64_t at = -1;
  for (std::size_t i = 0; i < in.got_out.size(); ++i) {
    const double error = std::fabs(in.got_out[i] - (*in.golden_out)[i]);
    const double tol = (*in.fixture_tolerance)[i];
    const double ratio = std::isnan(error) ? std::numeric_limits<double>::infinity()
                                           : (tol > 0 ? error / tol : (error > 0 ? std::numeric_limits<double>::infinity() : 0.0));
    if (ratio > worst) {
      worst = ratio;
      at = static_cast<std::int64_t>(i);
    }
  }
  r.fixture_ratio = worst;
  if (worst > 1.0) {
    r.fail(fmt::format("outside the fixture's own atol/rtol at [{}]: got {:.6g}, its out {:.6g}",
                       fmt::join(coords_of(in.problem, at), ","), in.got_out[static_cast<std::size_t>(at)],
                       (*in.golden_out)[static_cast<std::size_t>(at)]));
  }
}

}  // namespace

Comparison compare_output(const CompareInputs& in) {
  Comparison r;
  const std::vector<char> counts = rows_with_keys(in.visible);
  check_a_priori(in, r);
  check_lse(in, r);
  check_measured(in, counts, r);
  check_rounding_bias(in, counts, r);
  check_fixture_tolerance(in, r);
  if (r.verdict == Verdict::pass && r.informative_fraction < kMinInformativeFraction) {
    r.verdict = Verdict::mistrusted;
    r.reason = fmt::format("only {:.1f}% of the truth is larger than its bound: the match proves little",
                           100.0 * r.informative_fraction);
  }
  return r;
}

BiasTest least_biased(const std::vector<double>& truth, const std::vector<double>& got,
                      const std::vector<std::vector<double>>& baselines, std::int64_t width,
                      const std::vector<char>& counts, double exact_within, const std::vector<double>* identity) {
  BiasTest best;
  double best_t = std::numeric_limits<double>::infinity();
  for (const auto& baseline : baselines) {
    BiasTest b = rounding_bias(truth, got, baseline, width, counts, exact_within, identity);
    const double t = std::max(std::fabs(b.toward_zero.t), std::fabs(b.upward.t));
    if (&baseline == &baselines.front() || (!b.biased && best.biased) || (b.biased == best.biased && t < best_t)) {
      best = std::move(b);
      best_t = t;
    }
  }
  return best;
}

void check_probe(Comparison& c, const Problem& p, const std::vector<std::int64_t>& visible,
                 const std::vector<double>& model_bounds, const std::vector<double>& got,
                 const std::vector<std::vector<double>>& baselines, const std::vector<double>& truth,
                 const std::vector<double>& wanted) {
  double worst = 0;
  std::string failure;
  std::vector<double> expected(got.size(), 0.0);
  const double k = ToleranceConstants::baseline_factor(p.dtype);
  for (std::size_t row = 0; row < visible.size(); ++row) {
    const auto first = row * static_cast<std::size_t>(p.head_dim_v);
    // 1, or the share of the weight the visible keys keep beside a sink.
    const double row_want = visible[row] > 0 ? (wanted.empty() ? 1.0 : wanted[row]) : 0.0;
    double measured = 0;
    for (const auto& baseline : baselines) {
      for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
        measured = std::max(measured, std::fabs(baseline[first + static_cast<std::size_t>(d)] - row_want));
      }
    }
    const double bound = visible[row] > 0 ? std::max(model_bounds[row], k * measured) : 0.0;
    for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
      const auto e = row * static_cast<std::size_t>(p.head_dim_v) + static_cast<std::size_t>(d);
      const double want = row_want;
      expected[e] = want;
      const double error = std::fabs(got[e] - want);
      double ratio;
      // A row with no visible key must be exactly 0; a visible row's keys may
      // keep almost none of the weight beside a large sink (want near 0).
      if (!std::isfinite(got[e]) || (visible[row] == 0 && got[e] != 0.0)) ratio = std::numeric_limits<double>::infinity();
      else ratio = visible[row] == 0 ? 0.0 : error / bound;
      if (ratio > 1.0 && failure.empty()) {
        failure = fmt::format("normalisation probe (V = 1): got {:.17g} at [{}], expected {} within {:.3g}", got[e],
                              fmt::join(coords_of(p, static_cast<std::int64_t>(e)), ","), want, bound);
      }
      worst = std::max(worst, ratio);
    }
  }
  c.probe_ratio = worst;
  if (!failure.empty()) c.fail(failure);
  // In 16-bit types the probe's lean is P's rounding (toward zero: every row
  // below 1). In float32 and float64 its errors are the accumulation's own
  // noise (a multiply by a rounded reciprocal, what FlashAttention does, gives
  // 1 - 2^-24 every time o = l): no direction to test there.
  if (p.dtype == DType::f16 || p.dtype == DType::bf16) {
    c.probe_bias = least_biased(expected, got, baselines, p.head_dim_v, rows_with_keys(visible),
                                2 * accumulation_roundoff(p.dtype), &truth);
    if (c.probe_bias.biased) c.fail("normalisation probe (V = 1): " + c.probe_bias.finding);
  }
}

}  // namespace attn
