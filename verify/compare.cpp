#include "verify/compare.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "verify/baseline.hpp"
#include "verify/quantised.hpp"

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

void Comparison::fail(std::string why) {
  verdict = Verdict::fail;
  reason = reason.empty() ? std::move(why) : reason + "; " + why;
}

void Comparison::as_declared(const std::string& why) {
  if (verdict == Verdict::pass) {
    verdict = Verdict::differs;
    reason = why;
  } else {
    reason += (reason.empty() ? "" : "; ") + why;
  }
}

void Comparison::add(TensorScore score) {
  compared = true;
  for (const std::string& failure : score.failures) fail(failure);
  tensors.push_back(std::move(score));
}

void Comparison::conclude(const ConventionOutcome& conventions) {
  if (!conventions.failure.empty()) fail(conventions.failure);
  if (verdict == Verdict::pass) {
    for (const TensorScore& t : tensors) {
      if (!t.decides_trust || t.elements == 0 || t.informative_fraction >= kMinInformativeFraction) continue;
      verdict = Verdict::mistrusted;
      reason = fmt::format("only {:.1f}% of {}'s truth stands out of its tolerance (where a zero would fail): the match "
                           "proves little", 100.0 * t.informative_fraction, t.name);
      break;
    }
  }
  if (conventions.rows_followed == 0) return;
  if (verdict == Verdict::pass) {
    verdict = Verdict::differs;
    reason = differs_reason(conventions);
  } else if (verdict == Verdict::mistrusted) {
    reason += "; " + differs_reason(conventions);
  }
}

const TensorScore* Comparison::worst() const {
  const TensorScore* worst = nullptr;
  for (const TensorScore& t : tensors) {
    if (t.elements > 0 && (!worst || t.worst_ratio > worst->worst_ratio)) worst = &t;
  }
  return worst;
}

const TensorScore* Comparison::tensor(std::string_view name) const {
  for (const TensorScore& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

namespace {

std::vector<char> rows_with_keys(const std::vector<std::int64_t>& visible) {
  std::vector<char> counts(visible.size());
  for (std::size_t r = 0; r < visible.size(); ++r) counts[r] = visible[r] > 0;
  return counts;
}

Dims4 out_shape(const Problem& p) { return {p.q_batch(), p.heads_q, p.seq_q, p.head_dim_v}; }

}  // namespace

TensorTruth ForwardTruth::out() const {
  TensorTruth t;
  t.name = "out";
  t.dtype = problem.dtype;
  t.shape = out_shape(problem);
  t.value = &truth.out;
  t.bound = &bounds.out;
  t.visible = &stats.visible;
  t.hull = &bounds;
  t.measured = &measured;
  t.baselines = &baselines;
  // Errors within the subnormal allowance (bfloat16's flushing) carry no direction.
  t.exact_within = subnormal_allowance(problem.dtype, 1.0);
  if (!tolerance.empty()) t.fixture_values = &golden, t.fixture_tolerance = &tolerance;
  return t;
}

TensorTruth ForwardTruth::lse() const {
  TensorTruth t;
  t.name = "lse";
  t.dtype = problem.dtype;
  t.shape = {problem.q_batch(), problem.heads_q, problem.seq_q, 1};
  t.value = &truth.lse;
  t.bound = &bounds.lse;
  t.decides_trust = false;
  return t;
}

TensorTruth ForwardTruth::probe_out() const {
  TensorTruth t;
  t.name = "probe";
  t.what = "normalisation probe (V = 1): out";
  t.dtype = problem.dtype;
  t.shape = out_shape(problem);
  t.value = &probe_value;
  t.bound = &probe_bound;
  t.visible = &stats.visible;
  // In 16-bit types the probe's lean is P's rounding (toward zero: every row
  // below 1). In float32 and float64 its errors are the accumulation's own
  // noise (a multiply by a rounded reciprocal, what FlashAttention does, gives
  // 1 - 2^-24 every time o = l): the bias test runs on 16-bit types only.
  // Rows are independent where the case's own truth rows are.
  t.baselines = &probe_baselines;
  t.exact_within = 2 * accumulation_roundoff(problem.dtype);
  t.identity = &truth.out;
  t.decides_trust = false;
  return t;
}

ForwardTruth forward_truth(const CaseData& data, int threads) {
  ForwardTruth f;
  f.problem = data.problem;
  f.truth = reference_attention(data, &f.stats, threads);
  f.bounds = derive_bounds(f.problem, f.truth.out, f.truth.lse, f.stats);
  return f;
}

void measure_forward(ForwardTruth& f, const CaseData& data, const Fixture* fixture, int threads) {
  const Problem& p = f.problem;
  const std::vector<char> counts = rows_with_keys(f.stats.visible);
  BaselineFamily family = baseline_family(p.quantised() ? in_compute_dtype(data) : data, threads);
  f.baselines = std::move(family.out);
  f.probe_baselines = std::move(family.probe);
  if (p.quantised() && (p.q_quant.descale != Descale::none || p.k_quant.descale != Descale::none ||
                        p.v_quant.descale != Descale::none)) {
    // The descales applied after the rounding: a second draw of the inputs' rounding.
    BaselineFamily apart = baseline_family(in_compute_dtype(data, true), threads);
    for (auto& out : apart.out) f.baselines.push_back(std::move(out));
  }
  if (p.quantised() && (p.dtype == DType::f16 || p.dtype == DType::bf16)) {
    // Dequantised in float32, then cast to the dtype: the usual plain path,
    // whose double rounding leans outward at a group's extreme codes.
    BaselineFamily through = baseline_family(in_compute_dtype(data, false, true), threads);
    for (auto& out : through.out) f.baselines.push_back(std::move(out));
  }
  const std::int64_t longest = *std::max_element(f.stats.visible.begin(), f.stats.visible.end());
  f.measured = measured_limit(p.dtype, f.truth.out, f.baselines, forward_floor_magnitude(p, f.stats), p.head_dim_v,
                              counts, longest);
  // Weights below float32's normal range (1e-38: float32, float64's own,
  // bfloat16's flushed), lost by some correct kernels (a running max that
  // includes a far sink) and kept by others (dividing last): no plain
  // formulation's accuracy there holds a backend (fuzz seed 9 case 1753:
  // naive 21x the plain ones, at 6e-44). float16's P rounding at 2^-24 is
  // an ordinary regime, which its plain formulations share: not floored.
  if (p.dtype != DType::f16) {
    const ErrorNorms underflow = error_norms(std::vector<double>(f.truth.out.size(), 0.0),
                                             underflow_allowance(p, f.stats), p.head_dim_v, counts);
    f.measured.floor_max = std::max(f.measured.floor_max, underflow.max);
    f.measured.floor_rms = std::max(f.measured.floor_rms, underflow.rms);
  }
  if (fixture) {
    f.tolerance = fixture_tolerance(fixture->header, fixture->out);
    if (!f.tolerance.empty()) f.golden = fixture->out;
  }
  f.probe = data;
  f.probe.fill_ones('v');
  // Per visible row: 1, or the share of the weight the visible keys keep
  // beside a sink (1 - exp(sink - lse)); 0 on a row with no visible key.
  std::vector<double> kept;
  if (p.sinks) {
    kept.resize(f.truth.lse.size());
    for (std::size_t r = 0; r < kept.size(); ++r) {
      const double sink = data.sinks[(r / static_cast<std::size_t>(p.seq_q)) % static_cast<std::size_t>(p.heads_q)];
      kept[r] = -std::expm1(sink - f.truth.lse[r]);
    }
  }
  const std::vector<double> model = probe_bounds(data, f.stats, kept);
  // A row may also be as far from its value as k times the farthest plain
  // formulation on that row (sums whose rounding errors add up, such as many
  // equal weights).
  const double k = ToleranceConstants::baseline_factor(p.dtype);
  const auto width = static_cast<std::size_t>(p.head_dim_v);
  f.probe_value.assign(f.truth.out.size(), 0.0);
  f.probe_bound.assign(f.truth.out.size(), 0.0);
  for (std::size_t row = 0; row < f.stats.visible.size(); ++row) {
    if (f.stats.visible[row] == 0) continue;  // exactly 0, whatever the bound
    const double want = kept.empty() ? 1.0 : kept[row];
    double farthest = 0;
    for (const auto& baseline : f.probe_baselines) {
      for (std::size_t d = 0; d < width; ++d) farthest = std::max(farthest, std::fabs(baseline[row * width + d] - want));
    }
    const double bound = std::max(model[row], k * farthest);
    for (std::size_t d = 0; d < width; ++d) f.probe_value[row * width + d] = want, f.probe_bound[row * width + d] = bound;
  }
}

Comparison judge_forward(const ForwardTruth& truth, const ForwardResult& result) {
  Comparison c;
  c.add(score_tensor(truth.out(), result.out));
  if (result.lse) c.add(score_tensor(truth.lse(), *result.lse));
  if (!result.guard_damage.empty()) c.fail(result.guard_damage);
  if (result.probe) {
    if (!result.probe_conventions_failure.empty()) c.fail("normalisation probe: " + result.probe_conventions_failure);
    c.add(score_tensor(truth.probe_out(), *result.probe));
    if (!result.probe_guard_damage.empty()) c.fail("normalisation probe: " + result.probe_guard_damage);
  }
  c.conclude(result.conventions);
  return c;
}

}  // namespace attn
