#include "verify/conventions.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "reference/reference.hpp"

namespace attn {

namespace {

std::int64_t broadcast_index(const BroadcastShape& s, std::int64_t seq_k, std::int64_t b, std::int64_t h,
                             std::int64_t i, std::int64_t j) {
  const std::int64_t bb = s.batch == 1 ? 0 : b, hh = s.heads == 1 ? 0 : h, ii = s.rows == 1 ? 0 : i;
  return ((bb * s.heads + hh) * s.rows + ii) * seq_k + j;
}

// The row every convention predicts, [head_dim_v]; empty for NaN.
std::vector<double> predicted_row(ConventionKind kind, const CaseData& data, std::int64_t b, std::int64_t h,
                                  std::int64_t i) {
  const Problem& p = data.problem;
  const std::int64_t kvh = h / p.group_size();
  std::vector<double> row(static_cast<std::size_t>(p.head_dim_v), 0.0);
  if (kind == ConventionKind::empty_rows_nan || p.seq_k == 0) return row;
  std::vector<double> weight(static_cast<std::size_t>(p.seq_k), 1.0);
  if (kind == ConventionKind::empty_rows_unmasked) {
    double top = -std::numeric_limits<double>::infinity();
    for (std::int64_t j = 0; j < p.seq_k; ++j) {
      double s = 0;
      for (std::int64_t d = 0; d < p.head_dim; ++d) {
        s += data.q[static_cast<std::size_t>(((b * p.heads_q + h) * p.seq_q + i) * p.head_dim + d)] *
             data.k[static_cast<std::size_t>(((b * p.heads_kv + kvh) * p.seq_k + j) * p.head_dim + d)];
      }
      s *= p.scale;
      if (p.bias.present) {
        double x = data.bias[static_cast<std::size_t>(broadcast_index(p.bias, p.seq_k, b, h, i, j))];
        if (std::isfinite(x)) s += x;
      }
      weight[static_cast<std::size_t>(j)] = s;
      top = std::max(top, s);
    }
    for (double& w : weight) w = std::exp(w - top);
  }
  double total = 0;
  for (double w : weight) total += w;
  for (std::int64_t j = 0; j < p.seq_k; ++j) {
    const double w = weight[static_cast<std::size_t>(j)] / total;
    for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
      row[static_cast<std::size_t>(d)] +=
          w * data.v[static_cast<std::size_t>(((b * p.heads_kv + kvh) * p.seq_k + j) * p.head_dim_v + d)];
    }
  }
  return row;
}

std::string kind_text(ConventionKind kind) {
  switch (kind) {
    case ConventionKind::empty_rows_mean_v: return "the mean of V";
    case ConventionKind::empty_rows_nan: return "NaN";
    case ConventionKind::empty_rows_unmasked: return "the attention with nothing hidden";
  }
  return "?";
}

}  // namespace

ConventionOutcome apply_conventions(const std::vector<Convention>& conventions, const CaseData& data,
                                    std::vector<double>& out, std::vector<double>* lse) {
  ConventionOutcome result;
  const Problem& p = data.problem;
  const std::int64_t width = p.head_dim_v;
  // A conventional row is computed in float32 or wider and rounded to the
  // dtype; it is told apart from other values, not held to the last bit.
  const double n = static_cast<double>(std::max<std::int64_t>(p.seq_k, 1));
  double v_max = 0;
  for (double x : data.v) v_max = std::max(v_max, std::fabs(x));
  const double tolerance = (8 * unit_roundoff(p.dtype) + 8 * std::sqrt(n) * 0x1p-24) * std::max(v_max, 1e-30);
  std::int64_t neither = 0;
  std::string first;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        bool empty = true;
        for (std::int64_t j = 0; j < p.seq_k && empty; ++j) empty = !reference_visible(data, b, h, i, j);
        if (!empty) continue;
        ++result.empty_rows;
        const std::size_t row = static_cast<std::size_t>((b * p.heads_q + h) * p.seq_q + i);
        double* got = out.data() + row * static_cast<std::size_t>(width);
        bool is_zero = true;
        for (std::int64_t d = 0; d < width; ++d) is_zero = is_zero && got[d] == 0.0;
        if (is_zero) continue;
        bool matched = false;
        for (const Convention& c : conventions) {
          std::vector<double> want = predicted_row(c.kind, data, b, h, i);
          bool same = true;
          for (std::int64_t d = 0; d < width && same; ++d) {
            if (c.kind == ConventionKind::empty_rows_nan) same = std::isnan(got[d]);
            else same = std::isfinite(got[d]) && std::fabs(got[d] - want[static_cast<std::size_t>(d)]) <= tolerance;
          }
          if (same) {
            matched = true;
            if (result.followed.empty()) result.followed = fmt::format("{} ({})", kind_text(c.kind), c.why);
            break;
          }
        }
        if (!matched) {
          if (neither == 0) first = fmt::format("[{},{},{}]", b, h, i);
          ++neither;
          continue;
        }
        ++result.rows_followed;
        std::fill(got, got + width, 0.0);
        if (lse != nullptr) (*lse)[row] = -std::numeric_limits<double>::infinity();
      }
    }
  }
  if (neither > 0) {
    std::vector<std::string> names;
    for (const Convention& c : conventions) names.push_back(kind_text(c.kind));
    result.failure = fmt::format("{} of {} rows with no visible key hold neither the format's 0 nor the declared "
                                 "{} (first at {})",
                                 neither, result.empty_rows, fmt::join(names, " or "), first);
  }
  return result;
}

std::string differs_reason(const ConventionOutcome& outcome) {
  return fmt::format("{} of {} rows with no visible key give {} where the format gives 0; the rest matches",
                     outcome.rows_followed, outcome.empty_rows, outcome.followed);
}

}  // namespace attn
