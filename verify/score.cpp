#include "verify/score.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace attn {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string at_text(const Dims4& c) { return fmt::format("[{}]", fmt::join(c, ",")); }

bool is_16bit(DType dtype) { return dtype == DType::f16 || dtype == DType::bf16; }

// The a-priori check of one element: its ratio, and in words why it fails
// when it does (empty otherwise). Non-finite values are counted by the caller.
double element_ratio(const TensorTruth& t, std::size_t e, double got, bool hidden_row, std::string& why) {
  const double truth = (*t.value)[e], bound = (*t.bound)[e];
  if (!std::isfinite(truth)) {
    // -inf where a row sees nothing (lse): only the same value is right; NaN never is.
    if (got == truth) return 0.0;
    why = fmt::format("is {}, expected {}", got, truth);
    return kInf;
  }
  if (!std::isfinite(got)) return kInf;
  if (hidden_row && got != 0.0) {
    why = fmt::format("is {}: a row with no visible key, not exactly 0", got);
    return kInf;
  }
  if (t.hull && !t.hull->in_hull(e, got)) {
    why = fmt::format("is {:.6g}, outside the visible values' range [{:.6g}, {:.6g}] (the truth is {:.6g})", got,
                      t.hull->hull_lo[e], t.hull->hull_hi[e], truth);
    return kInf;
  }
  const double error = std::fabs(got - truth);
  if (std::isnan(bound)) {  // a bound that is not a number accepts nothing
    why = fmt::format("is {:.6g}, expected {:.6g}, and its bound is not a number", got, truth);
    return kInf;
  }
  const double ratio = bound > 0 ? error / bound : (error > 0 ? kInf : 0.0);
  if (ratio > 1.0) why = fmt::format("is {:.6g}, expected {:.6g} (bound {:.3g})", got, truth, bound);
  return ratio;
}

void score_fixture_rule(const TensorTruth& t, const std::vector<double>& got, const std::string& what, TensorScore& s) {
  if (!t.fixture_values || !t.fixture_tolerance) return;
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t e = 0; e < got.size(); ++e) {
    const double error = std::fabs(got[e] - (*t.fixture_values)[e]), tol = (*t.fixture_tolerance)[e];
    const double ratio = std::isnan(error) ? kInf : (tol > 0 ? error / tol : (error > 0 ? kInf : 0.0));
    if (ratio > worst) worst = ratio, at = e;
  }
  s.fixture_ratio = worst;
  if (worst > 1.0) {
    s.failures.push_back(fmt::format("{}{} is outside the fixture's own atol/rtol: got {:.6g}, its stored value {:.6g}",
                                     what, at_text(element_coordinates(t.shape, at)), got[at], (*t.fixture_values)[at]));
  }
}

}  // namespace

TensorScore score_tensor(const TensorTruth& t, const std::vector<double>& got) {
  TensorScore s;
  s.name = t.name;
  s.decides_trust = t.decides_trust;
  const std::string what = t.what.empty() ? t.name : t.what;
  const std::vector<double>& value = *t.value;
  if (got.size() != value.size()) {
    s.failures.push_back(fmt::format("{} has {} elements, expected {}", what, got.size(), value.size()));
    return s;
  }
  const auto width = static_cast<std::size_t>(std::max<std::int64_t>(t.shape[3], 1));
  const std::size_t rows = value.size() / width;
  std::vector<char> counts(rows, 1);  // the rows the norms and the bias test take
  if (t.visible) {
    for (std::size_t r = 0; r < rows; ++r) counts[r] = (*t.visible)[r] > 0;
  }
  s.elements = static_cast<std::int64_t>(value.size());
  // An element tells something when a zero there would fail: its truth is
  // above its a-priori bound and above the largest error the measured bound
  // lets one element have.
  const double measured_max = t.measured ? ToleranceConstants::baseline_max_share * t.measured->factor *
                                               t.measured->reference_max()
                                         : kInf;
  std::int64_t informative = 0;
  std::size_t last_nonfinite_row = rows;
  std::string first_failure, first_nonfinite;
  double dot = 0, got_squares = 0, truth_squares = 0;
  for (std::size_t e = 0; e < value.size(); ++e) {
    const double truth = value[e], x = got[e], bound = (*t.bound)[e];
    const std::size_t row = e / width;
    const bool hidden_row = t.visible && (*t.visible)[row] == 0;
    if (std::fabs(truth) > std::min(bound, measured_max) || hidden_row || bound == 0.0 || !std::isfinite(truth)) {
      ++informative;
    }
    std::string why;
    const double ratio = element_ratio(t, e, x, hidden_row, why);
    if (!std::isfinite(x) && !(x == truth)) {
      ++(std::isnan(x) ? s.nan_elements : s.infinite_elements);
      if (row != last_nonfinite_row) ++s.nonfinite_rows;
      last_nonfinite_row = row;
      if (s.nonfinite_at.size() < 8) s.nonfinite_at.push_back(element_coordinates(t.shape, e));
      if (first_nonfinite.empty()) first_nonfinite = fmt::format(", where the truth is {:.6g}", truth);
    } else if (std::isfinite(x) && std::isfinite(truth)) {
      const double error = std::fabs(x - truth);
      s.max_abs_error = std::max(s.max_abs_error, error);
      if (truth != 0.0) s.max_rel_error = std::max(s.max_rel_error, error / std::fabs(truth));
      dot += x * truth, got_squares += x * x, truth_squares += truth * truth;
    }
    if (!why.empty() && first_failure.empty()) first_failure = fmt::format("{}{} {}", what, at_text(element_coordinates(t.shape, e)), why);
    if (ratio > s.worst_ratio || s.worst_index < 0) {
      s.worst_ratio = ratio;
      s.worst_index = static_cast<std::int64_t>(e);
      s.got_at_worst = x, s.truth_at_worst = truth, s.bound_at_worst = bound;
    }
  }
  if (s.worst_index >= 0) s.worst_at = element_coordinates(t.shape, static_cast<std::size_t>(s.worst_index));
  s.informative_fraction = value.empty() ? 0.0 : static_cast<double>(informative) / static_cast<double>(value.size());
  const std::int64_t nonfinite = s.nan_elements + s.infinite_elements;
  if (nonfinite > 0) {
    s.failures.push_back(fmt::format("{} holds {} NaN and {} infinite (non-finite) values in {} rows, first at {}{}",
                                     what, s.nan_elements, s.infinite_elements, s.nonfinite_rows,
                                     at_text(s.nonfinite_at.front()), first_nonfinite));
    s.cosine = s.norm_ratio = std::numeric_limits<double>::quiet_NaN();
  } else if (truth_squares > 0) {
    s.norm_ratio = std::sqrt(got_squares / truth_squares);
    s.cosine = got_squares > 0 ? dot / std::sqrt(got_squares * truth_squares) : 0.0;
  } else if (got_squares > 0) {
    s.cosine = 0, s.norm_ratio = kInf;
  }
  if (!first_failure.empty()) s.failures.push_back(first_failure);
  if (nonfinite == 0) {
    const ErrorNorms norms = error_norms(value, got, static_cast<std::int64_t>(width), counts);
    s.rms_error = norms.rms;
    if (t.measured && norms.elements > 0) {
      const MeasuredJudgement j = judge_measured(norms, *t.measured, what + ": ", t.measured_of);
      s.measured = MeasuredScore{j.budget, j.over_max, j.over_rms};
      if (!j.failure.empty()) s.failures.push_back(j.failure);
    }
    // Only where the result's own rounding dominates (16-bit types): in
    // float32 and float64 the accumulation's lean is as large as a directed
    // rounding and differs between correct designs (a sequential sum of many
    // positive terms loses the small ones: attn fuzz measured -29 u on l over
    // 2683 keys, against -2 u in 16 lanes), so a sign test cannot tell them apart.
    if (t.baselines && !t.baselines->empty() && is_16bit(t.dtype)) {
      // (a float16's subnormals start at 2^-14, a bfloat16's at 2^-126)
      s.bias = least_biased(value, got, *t.baselines, static_cast<std::int64_t>(width), counts, t.exact_within,
                            t.identity, std::ldexp(1.0, t.dtype == DType::f16 ? -14 : -126));
      if (s.bias->biased) s.failures.push_back(fmt::format("{}: rounding bias: {}", what, s.bias->finding));
    }
  }
  score_fixture_rule(t, got, what, s);
  return s;
}

Dims4 element_coordinates(const Dims4& shape, std::size_t e) {
  Dims4 c{};
  for (int axis = 3; axis >= 0; --axis) {
    const auto extent = static_cast<std::size_t>(std::max<std::int64_t>(shape[static_cast<std::size_t>(axis)], 1));
    c[static_cast<std::size_t>(axis)] = static_cast<std::int64_t>(e % extent);
    e /= extent;
  }
  return c;
}

BiasTest least_biased(const std::vector<double>& truth, const std::vector<double>& got,
                      const std::vector<std::vector<double>>& baselines, std::int64_t width,
                      const std::vector<char>& counts, double exact_within, const std::vector<double>* identity,
                      double below) {
  BiasTest best;
  double best_t = kInf;
  for (const auto& baseline : baselines) {
    BiasTest b = rounding_bias(truth, got, baseline, width, counts, exact_within, identity, below);
    const double t = std::max(std::fabs(b.toward_zero.t), std::fabs(b.upward.t));
    if (&baseline == &baselines.front() || (!b.biased && best.biased) || (b.biased == best.biased && t < best_t)) {
      best = std::move(b);
      best_t = t;
    }
  }
  return best;
}

}  // namespace attn
