#include "verify/dropout.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attnbench/error.hpp"
#include "attnbench/value_range.hpp"
#include "reference/dropout.hpp"
#include "verify/run_case.hpp"
#include "verify/score.hpp"
#include "verify/tolerance.hpp"

namespace attn {

namespace {

double log_pmf(std::int64_t n, std::int64_t k, double q) {
  const double dn = static_cast<double>(n), dk = static_cast<double>(k);
  return std::lgamma(dn + 1) - std::lgamma(dk + 1) - std::lgamma(dn - dk + 1) + dk * std::log(q) +
         (dn - dk) * std::log1p(-q);
}

// Coordinates [e, h, i, j] of a flat mask index.
std::string mask_at(const Problem& p, std::size_t index) {
  const auto n = static_cast<std::int64_t>(index);
  const std::int64_t j = n % p.seq_k, i = n / p.seq_k % p.seq_q, h = n / (p.seq_k * p.seq_q) % p.heads_q,
                     e = n / (p.seq_k * p.seq_q * p.heads_q);
  return fmt::format("[{}, {}, {}, {}]", e, h, i, j);
}

// Whether two outputs are the same bits (NaN included).
bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

// The first visible element where two masks differ; -1 when none.
std::int64_t first_difference(const std::vector<std::uint8_t>& visible, const std::vector<std::uint8_t>& a,
                              const std::vector<std::uint8_t>& b) {
  for (std::size_t n = 0; n < visible.size(); ++n) {
    if (visible[n] && a[n] != b[n]) return static_cast<std::int64_t>(n);
  }
  return -1;
}

// The first visible element a mask holds neither 0 nor 1 at; -1 when none.
std::int64_t first_unwritten(const std::vector<std::uint8_t>& visible, const std::vector<std::uint8_t>& kept) {
  for (std::size_t n = 0; n < visible.size(); ++n) {
    if (visible[n] && kept[n] > 1) return static_cast<std::int64_t>(n);
  }
  return -1;
}

std::int64_t count_visible(const std::vector<std::uint8_t>& visible) {
  std::int64_t n = 0;
  for (std::uint8_t v : visible) n += v;
  return n;
}

// What dropout adds to an a-priori bound: the rounding of the result itself
// (u |truth|), and per unit of the magnitude of the terms summed into it
// (sum_j p_ij c_ij |v_jd| for out) the accumulation's over `terms` and each
// weight's own error, that of a score rounded at `score_magnitude` (|scale
// q.k| + |bias| + |ALiBi|). Without dropout the weights sum to 1, so a
// score's error moves out by p |v - out| only, which the case's bound
// counts; a dropped weight leaves its partner's error uncancelled, at p |v|.
double dropout_rounding(DType dtype, double truth, double magnitude, double terms, double score_magnitude) {
  const double u_acc = accumulation_roundoff(dtype);
  return ToleranceConstants::safety_factor *
         (unit_roundoff(dtype) * std::fabs(truth) + (std::sqrt(terms) + 1 + score_magnitude) * u_acc * magnitude);
}

// Kept weights grow by 1 / (1 - p): a true result beyond the dtype's range
// has no right answer in it (SKIP, as a golden-free case's).
void refuse_beyond_range(DType dtype, const char* name, const std::vector<double>& truth) {
  const double largest = largest_finite(dtype);
  for (double x : truth) {
    if (!(std::fabs(x) <= largest)) {
      throw Unsupported(fmt::format("its true {} under dropout holds {:.3g}, beyond {}'s range: no {} result can be "
                                    "right", name, x, dtype_name(dtype), dtype_name(dtype)));
    }
  }
}

}  // namespace

double binomial_two_sided(std::int64_t n, std::int64_t k, double q) {
  if (n <= 0) return 1;
  if (q <= 0) return k == 0 ? 1 : 0;
  if (q >= 1) return k == n ? 1 : 0;
  // The tail on k's side of the mean, from k outwards: its terms shrink
  // from the first, summed relative to it.
  const bool upper = static_cast<double>(k) >= static_cast<double>(n) * q;
  const double odds = q / (1 - q);
  double relative = 1, term = 1;
  for (std::int64_t x = k; upper ? x < n : x > 0; x += upper ? 1 : -1) {
    term *= upper ? static_cast<double>(n - x) / static_cast<double>(x + 1) * odds
                  : static_cast<double>(x) / static_cast<double>(n - x + 1) / odds;
    relative += term;
    if (term < relative * 1e-17) break;
  }
  const double log_tail = log_pmf(n, k, q) + std::log(relative);
  return std::min(1.0, 2 * std::exp(log_tail));
}

std::vector<std::uint8_t> dropout_visible(const CaseData& data) {
  const Problem& p = data.problem;
  std::vector<std::uint8_t> visible(static_cast<std::size_t>(p.batch * p.heads_q * p.seq_q * p.seq_k), 0);
  ReferenceRowView view;
  for (std::int64_t b = 0; b < p.q_batch(); ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        reference_row_view(data, b, h, i, view);
        if (view.visible.empty()) continue;
        const ReferenceRowEntry at = reference_row_entry(data, b, i);
        const std::size_t base = static_cast<std::size_t>(((at.entry * p.heads_q + h) * p.seq_q + at.i) * p.seq_k);
        for (std::int64_t j : view.visible) visible[base + static_cast<std::size_t>(j)] = 1;
      }
  return visible;
}

MaskVerdict test_dropout_mask(const Problem& p, double drop, const std::vector<std::uint8_t>& visible,
                              const std::vector<std::uint8_t>& kept, double significance) {
  MaskVerdict verdict;
  if (const std::int64_t first_bad = first_unwritten(visible, kept); first_bad >= 0) {
    std::int64_t unwritten = 0, invalid = 0;
    for (std::size_t n = 0; n < visible.size(); ++n) {
      if (visible[n] && kept[n] > 1) ++(kept[n] == kNotWritten ? unwritten : invalid);
    }
    verdict.failure = fmt::format("mask: {} of {} visible pairs not written and {} neither 0 nor 1 (first at [entry, "
                                  "head, query, key] = {})", unwritten, count_visible(visible), invalid,
                                  mask_at(p, static_cast<std::size_t>(first_bad)));
    return verdict;
  }
  MaskStatistic share{"kept", 0, 0, 1 - drop};
  for (std::size_t n = 0; n < visible.size(); ++n) {
    if (!visible[n]) continue;
    ++share.trials;
    share.successes += kept[n];
  }
  verdict.statistics.push_back(share);
  // Neighbours along each axis, in disjoint pairs (coordinate even, the next
  // one beside it): independent draws agree with probability p^2 + (1-p)^2.
  const double agree = drop * drop + (1 - drop) * (1 - drop);
  const std::int64_t dims[4] = {p.batch, p.heads_q, p.seq_q, p.seq_k};
  const std::int64_t strides[4] = {p.heads_q * p.seq_q * p.seq_k, p.seq_q * p.seq_k, p.seq_k, 1};
  const char* names[4] = {"batch entries e, e+1 agree", "heads h, h+1 agree", "queries i, i+1 agree",
                          "keys j, j+1 agree"};
  for (int axis = 3; axis >= 0; --axis) {
    MaskStatistic pairs{names[axis], 0, 0, agree};
    for (std::size_t n = 0; n < visible.size(); ++n) {
      const std::int64_t coordinate = static_cast<std::int64_t>(n) / strides[axis] % dims[axis];
      if (coordinate % 2 != 0 || coordinate + 1 >= dims[axis]) continue;
      const std::size_t next = n + static_cast<std::size_t>(strides[axis]);
      if (!visible[n] || !visible[next]) continue;
      ++pairs.trials;
      pairs.successes += kept[n] == kept[next] ? 1 : 0;
    }
    if (pairs.trials > 0) verdict.statistics.push_back(pairs);
  }
  verdict.threshold = significance / static_cast<double>(verdict.statistics.size());
  for (MaskStatistic& s : verdict.statistics) {
    s.p_value = binomial_two_sided(s.trials, s.successes, s.expected);
    if (s.p_value >= verdict.threshold) continue;
    if (!verdict.failure.empty()) verdict.failure += "; ";
    verdict.failure += fmt::format("mask: {} in {:.3f}% of {} where a dropout of p = {:g} gives {:.3f}%: two-sided "
                                   "binomial p-value {:.3g}, below {:.3g}", s.name, 100.0 * static_cast<double>(s.successes) /
                                   static_cast<double>(s.trials), s.trials, drop, 100.0 * s.expected, s.p_value,
                                   verdict.threshold);
  }
  return verdict;
}

DropoutCalibration calibrate_dropout(const Backend& backend, const CaseData& data, double drop, double run_p,
                                     std::uint64_t first_seed, std::int64_t runs, double significance,
                                     const RunOptions& options) {
  DropoutCalibration calibration;
  const std::vector<std::uint8_t> visible = dropout_visible(data);
  calibration.visible = count_visible(visible);
  for (std::int64_t r = 0; r < runs; ++r) {
    const DropoutView view{.p = run_p, .seed = first_seed + static_cast<std::uint64_t>(r), .offset = 0};
    const BackendRun run = run_backend(backend, data, options, view);
    const MaskVerdict verdict = test_dropout_mask(data.problem, drop, visible, run.kept, significance);
    if (calibration.tests.empty()) {
      calibration.tests.emplace_back("mask written (0 or 1 at every visible pair)");
      for (const MaskStatistic& s : verdict.statistics) calibration.tests.push_back(s.name);
      calibration.failed_by_test.assign(calibration.tests.size(), 0);
    }
    ++calibration.runs;
    if (verdict.failure.empty()) continue;
    ++calibration.failed;
    if (verdict.statistics.empty()) ++calibration.failed_by_test[0];
    for (std::size_t t = 0; t < verdict.statistics.size() && t + 1 < calibration.tests.size(); ++t) {
      if (verdict.statistics[t].p_value < verdict.threshold) ++calibration.failed_by_test[t + 1];
    }
  }
  return calibration;
}

std::string dropout_out_of_reach(const Problem& p) {
  const double elements = static_cast<double>(p.batch) * static_cast<double>(p.heads_q) * static_cast<double>(p.seq_q) *
                          static_cast<double>(p.seq_k);
  if (elements > static_cast<double>(DropoutConstants::max_mask_elements)) {
    return fmt::format("its dropout mask would hold {:.3g} elements, more than the {} the check draws", elements,
                       DropoutConstants::max_mask_elements);
  }
  return {};
}

Comparison judge_dropout(const Backend& backend, const CaseData& data, double drop, const std::vector<std::uint8_t>& visible,
                         const ForwardTruth& truth, const RunOptions& options) {
  const Problem& p = data.problem;
  const DropoutView view{.p = drop, .seed = DropoutConstants::seed, .offset = DropoutConstants::offset};
  const BackendRun run = run_backend(backend, data, options, view);
  Comparison c;
  if (!run.guard_damage.empty()) c.fail(run.guard_damage);
  const MaskVerdict mask = test_dropout_mask(p, drop, visible, run.kept);
  if (!mask.failure.empty()) c.fail(mask.failure);
  // The same seed, the same bits; another seed, another mask (where a
  // second independent draw would repeat the first with a chance below 1e-9).
  const BackendRun again = run_backend(backend, data, options, view);
  if (!same_bits(run.out, again.out)) c.fail("the same seed gave another out on a second run");
  if (const std::int64_t n = first_difference(visible, run.kept, again.kept); n >= 0) {
    c.fail(fmt::format("the same seed gave another mask on a second run (first at {})", mask_at(p, static_cast<std::size_t>(n))));
  }
  const double repeat = std::log1p(-2 * drop * (1 - drop));
  if (static_cast<double>(count_visible(visible)) * repeat < std::log(1e-9)) {
    DropoutView other = view;
    other.seed = DropoutConstants::other_seed;
    const BackendRun reseeded = run_backend(backend, data, options, other);
    if (first_difference(visible, run.kept, reseeded.kept) < 0) {
      c.fail(fmt::format("seeds {:#x} and {:#x} gave the same mask: the seed is not used", view.seed, other.seed));
    }
  }
  if (!mask.failure.empty() && mask.statistics.empty()) {  // elements unwritten: no truth to compare with
    c.conclude();
    return c;
  }
  // out under the mask it reported.
  const DropoutForwardTruth t = reference_dropout(data, truth.truth, {run.kept.data(), 1.0 / (1.0 - drop)});
  refuse_beyond_range(p.dtype, "out", t.out);
  std::vector<double> bound(t.out.size());
  // Every term of the case's own bound is a sum over weights of p_ij times
  // what it multiplies: kept weights grow by 1 / (1 - p).
  for (std::size_t e = 0; e < bound.size(); ++e) {
    const std::size_t row = e / static_cast<std::size_t>(p.head_dim_v);
    const double keys = static_cast<double>(truth.stats.visible[row]);
    const double scores = truth.stats.score_magnitude[row] + truth.stats.added_magnitude[row];
    bound[e] = truth.bounds.out[e] / (1 - drop) + dropout_rounding(p.dtype, t.out[e], t.magnitude[e], keys, scores);
  }
  TensorTruth out;
  out.name = "out";
  out.what = fmt::format("dropout (p = {:g}): out", drop);
  out.dtype = p.dtype;
  out.shape = {p.q_batch(), p.heads_q, p.seq_q, p.head_dim_v};
  out.value = &t.out;
  out.bound = &bound;
  out.visible = &truth.stats.visible;
  out.decides_trust = false;  // as the gradients' (judge_dropout_backward)
  c.add(score_tensor(out, run.out));
  if (run.lse) {  // dropout leaves the denominator, and lse, alone
    TensorTruth lse = truth.lse();
    lse.what = fmt::format("dropout (p = {:g}): lse", drop);
    c.add(score_tensor(lse, *run.lse));
  }
  c.conclude();
  return c;
}

Comparison judge_dropout_backward(const Backend& backend, const CaseData& data, double drop,
                                  const std::vector<std::uint8_t>& visible, const std::vector<double>& dout,
                                  bool bias_gradient, const ForwardTruth& truth, const GradientTruth& a_priori,
                                  const RunOptions& options) {
  const Problem& p = data.problem;
  const DropoutView view{.p = drop, .seed = DropoutConstants::seed, .offset = DropoutConstants::offset};
  const BackwardRun run = run_backward(backend, data, dout, bias_gradient, options, view);
  Comparison c;
  if (const std::int64_t n = first_unwritten(visible, run.kept); n >= 0) {
    c.fail(fmt::format("its forward wrote no mask (0 or 1) at {}: the gradients have no truth to meet",
                       mask_at(p, static_cast<std::size_t>(n))));
    c.conclude();
    return c;
  }
  const DropoutMaskView mask{run.kept.data(), 1.0 / (1.0 - drop)};
  const DropoutForwardTruth forward = reference_dropout(data, truth.truth, mask);
  refuse_beyond_range(p.dtype, "out", forward.out);
  const DropoutGradientTruth t = reference_dropout_backward(data, dout, truth.truth, forward.out, mask, bias_gradient);
  for (const GradientPart& part : gradient_parts(p)) refuse_beyond_range(p.dtype, part.name, t.value.*part.values);
  GradientTruth g;
  g.value = t.value;
  g.magnitude = t.magnitude;
  g.bound = t.value;
  const double terms = static_cast<double>(std::max(p.seq_q, p.seq_k));
  double scores = 0;  // the largest score magnitude of any row
  for (std::size_t row = 0; row < truth.stats.score_magnitude.size(); ++row) {
    scores = std::max(scores, truth.stats.score_magnitude[row] + truth.stats.added_magnitude[row]);
  }
  const std::vector<GradientPart> parts = gradient_parts(p);
  for (const GradientPart& part : parts) {
    std::vector<double>& bound = g.bound.*part.values;
    const std::vector<double>& plain = a_priori.bound.*part.values;
    const std::vector<double>& magnitude = t.magnitude.*part.values;
    const std::vector<double>& value = t.value.*part.values;
    for (std::size_t e = 0; e < bound.size(); ++e) {
      bound[e] = (e < plain.size() ? plain[e] : 0) / (1 - drop) +
                 dropout_rounding(p.dtype, value[e], magnitude[e], terms, scores);
    }
  }
  // Each gradient's informativeness (MISTRUSTED) is the golden comparison's
  // to judge, on the same case without dropout, under its measured bound:
  // these rows judge the mask, its scaling and its replay.
  for (TensorTruth tensor : g.tensors(p)) {
    tensor.decides_trust = false;
    tensor.what = fmt::format("dropout (p = {:g}): {}", drop, tensor.name);
    const auto part = std::find_if(parts.begin(), parts.end(), [&](const GradientPart& x) { return tensor.name == x.name; });
    c.add(score_tensor(tensor, run.got.*part->values));
  }
  c.conclude();
  return c;
}

}  // namespace attn
