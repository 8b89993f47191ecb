#include "verify/bias.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <string>
#include <unordered_set>

#include "verify/tolerance.hpp"

namespace attn {

namespace {

// Mean and t statistic of per-row values.
SignStatistic over_rows(const std::vector<double>& values) {
  SignStatistic s;
  s.rows = static_cast<std::int64_t>(values.size());
  if (s.rows == 0) return s;
  double sum = 0;
  for (double v : values) sum += v;
  s.mean = sum / static_cast<double>(s.rows);
  if (s.rows < 2) return s;
  double squares = 0;
  for (double v : values) squares += (v - s.mean) * (v - s.mean);
  const double sd = std::sqrt(squares / static_cast<double>(s.rows - 1));
  if (sd > 0) s.t = s.mean / (sd / std::sqrt(static_cast<double>(s.rows)));
  else if (s.mean != 0) s.t = std::copysign(std::numeric_limits<double>::infinity(), s.mean);
  return s;
}

bool significant(const SignStatistic& s) {
  using T = ToleranceConstants;
  return s.rows >= T::bias_min_rows && std::fabs(s.mean) >= T::bias_min_mean && std::fabs(s.t) >= T::bias_min_t;
}

int sign(double x) { return (x > 0) - (x < 0); }

// The mean sign of one row's inexact elements, two ways; `any` is false when
// every element is exact.
struct RowSigns {
  bool any = false, any_nonzero_truth = false;
  double upward = 0, toward = 0;
};

RowSigns row_signs(const std::vector<double>& truth, const std::vector<double>& got, std::size_t first,
                   std::int64_t width, double exact_within, double below) {
  int n_up = 0, sum_up = 0, n_zero = 0, sum_zero = 0;
  for (std::int64_t d = 0; d < width; ++d) {
    const std::size_t e = first + static_cast<std::size_t>(d);
    if (!std::isfinite(got[e])) continue;  // failed elsewhere
    if (std::fabs(truth[e]) < below) continue;  // among the subnormals: a grid of its own, no rounding direction
    const int s = std::fabs(got[e] - truth[e]) <= exact_within ? 0 : sign(got[e] - truth[e]);
    if (s == 0) continue;  // exact: says nothing about the direction of rounding
    ++n_up;
    sum_up += s;
    if (truth[e] != 0) {
      ++n_zero;
      sum_zero += s * sign(truth[e]);
    }
  }
  RowSigns r;
  r.any = n_up > 0;
  r.any_nonzero_truth = n_zero > 0;
  if (n_up > 0) r.upward = static_cast<double>(sum_up) / n_up;
  if (n_zero > 0) r.toward = static_cast<double>(sum_zero) / n_zero;
  return r;
}

}  // namespace

BiasTest rounding_bias(const std::vector<double>& truth, const std::vector<double>& got,
                       const std::vector<double>& baseline, std::int64_t width, const std::vector<char>& counts,
                       double exact_within, const std::vector<double>* identity, double below) {
  const std::vector<double>& ids = identity ? *identity : truth;
  std::unordered_set<std::string> seen;
  std::vector<double> toward, up, own_toward, own_up;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    if (!counts[r]) continue;
    const std::size_t first = r * static_cast<std::size_t>(width);
    const std::string key(reinterpret_cast<const char*>(&ids[first]), static_cast<std::size_t>(width) * sizeof(double));
    if (!seen.insert(key).second) continue;
    const RowSigns g = row_signs(truth, got, first, width, exact_within, below),
                   b = row_signs(truth, baseline, first, width, exact_within, below);
    if (g.any || b.any) up.push_back(g.upward - b.upward), own_up.push_back(g.upward);
    if (g.any_nonzero_truth || b.any_nonzero_truth) toward.push_back(g.toward - b.toward), own_toward.push_back(g.toward);
  }
  BiasTest test;
  test.toward_zero = over_rows(toward);
  test.upward = over_rows(up);
  // A lean beyond the baselines' is the backend's own only if its own errors
  // lean that way too: baselines whose float32 weights underflow (a sink
  // far above every score) lean toward zero, and a backend that rounds
  // once, correctly, would otherwise seem to lean away (fuzz seed 2, case 322).
  auto its_own = [](const SignStatistic& beyond, const std::vector<double>& own) {
    const SignStatistic mine = over_rows(own);
    return significant(beyond) && significant(mine) && (beyond.mean > 0) == (mine.mean > 0);
  };
  auto describe = [](const SignStatistic& s, const char* positive, const char* negative) {
    return fmt::format("errors lean {} (mean sign {:+.2f} beyond every plain implementation's, over {} rows, t = {:.1f})",
                       s.mean > 0 ? positive : negative, s.mean, s.rows, s.t);
  };
  if (its_own(test.toward_zero, own_toward)) {
    test.biased = true;
    test.finding = describe(test.toward_zero, "away from zero", "toward zero");
  } else if (its_own(test.upward, own_up)) {
    test.biased = true;
    test.finding = describe(test.upward, "upward", "downward");
  }
  return test;
}

}  // namespace attn
