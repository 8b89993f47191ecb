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
  }
  return "?";
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

Comparison compare_output(const CompareInputs& in) {
  const Problem& p = in.problem;
  Comparison r;
  std::int64_t informative = 0;
  std::string first_failure;
  auto note = [&](std::int64_t e, std::string what) {
    first_failure = fmt::format("{} at [{}]", what, fmt::join(coords_of(p, e), ","));
  };
  const auto n = static_cast<std::int64_t>(in.golden_out.size());
  for (std::int64_t e = 0; e < n; ++e) {
    const double golden = in.golden_out[static_cast<std::size_t>(e)];
    const double got = in.got_out[static_cast<std::size_t>(e)];
    const double bound = in.bounds.out[static_cast<std::size_t>(e)];
    const bool hidden_row = in.visible[static_cast<std::size_t>(e / p.head_dim_v)] == 0;
    // An element tells something when it is distinguishable from zero within
    // its bound, or when it sits in a hidden row, which must be exactly 0.
    if (std::fabs(golden) > bound || (hidden_row && !in.bounds.from_fixture)) ++informative;
    double error = std::fabs(got - golden);
    double ratio;
    if (!std::isfinite(got)) {
      error = std::numeric_limits<double>::infinity();
      ratio = error;
      if (first_failure.empty()) note(e, fmt::format("non-finite output {} where the golden is {}", got, golden));
    } else if (hidden_row && !in.bounds.from_fixture && got != 0.0) {
      // A row with no visible key must be exactly zero, whatever the bound.
      ratio = std::numeric_limits<double>::infinity();
      if (first_failure.empty()) note(e, fmt::format("row with no visible key is {}, not exactly 0", got));
    } else {
      ratio = bound > 0 ? error / bound : (error > 0 ? std::numeric_limits<double>::infinity() : 0.0);
      if (ratio > 1.0 && first_failure.empty()) {
        note(e, fmt::format("got {:.6g}, expected {:.6g}, bound {:.3g}", got, golden, bound));
      }
    }
    r.max_abs_error = std::max(r.max_abs_error, error);
    if (golden != 0.0) r.max_rel_error = std::max(r.max_rel_error, error / std::fabs(golden));
    if (ratio > r.worst_ratio || r.worst_index < 0) {
      r.worst_ratio = ratio;
      r.worst_index = e;
      r.bound_at_worst = bound;
    }
  }
  if (r.worst_index >= 0) r.worst_coords = coords_of(p, r.worst_index);
  r.informative_fraction = n > 0 ? static_cast<double>(informative) / static_cast<double>(n) : 0.0;

  std::string lse_failure;
  if (in.got_lse) {
    double worst = 0;
    for (std::size_t row = 0; row < in.golden_lse.size(); ++row) {
      const double golden = in.golden_lse[row], got = (*in.got_lse)[row];
      double ratio;
      if (std::isinf(golden) || std::isinf(got) || std::isnan(got)) {
        ratio = (got == golden) ? 0.0 : std::numeric_limits<double>::infinity();
      } else {
        ratio = std::fabs(got - golden) / in.bounds.lse[row];
      }
      if (ratio > 1.0 && lse_failure.empty()) {
        lse_failure = fmt::format("lse of row {} is {}, expected {} (bound {:.3g})", row, got, golden, in.bounds.lse[row]);
      }
      worst = std::max(worst, ratio);
    }
    r.lse_worst_ratio = worst;
  }

  if (r.worst_ratio > 1.0) {
    r.verdict = Verdict::fail;
    r.reason = first_failure;
  } else if (!lse_failure.empty()) {
    r.verdict = Verdict::fail;
    r.reason = lse_failure;
  } else if (r.informative_fraction < kMinInformativeFraction) {
    r.verdict = Verdict::mistrusted;
    r.reason = fmt::format("only {:.1f}% of the golden is larger than its bound: the match proves little",
                           100.0 * r.informative_fraction);
  }
  return r;
}

}  // namespace attn
