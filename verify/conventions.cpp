#include "verify/conventions.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/layer_data.hpp"
#include "reference/layer.hpp"
#include "reference/reference.hpp"
#include "verify/tolerance.hpp"

namespace attn {

namespace {

std::int64_t broadcast_index(const BroadcastShape& s, std::int64_t seq_k, std::int64_t b, std::int64_t h,
                             std::int64_t i, std::int64_t j) {
  const std::int64_t bb = s.batch == 1 ? 0 : b, hh = s.heads == 1 ? 0 : h, ii = s.rows == 1 ? 0 : i;
  return ((bb * s.heads + hh) * s.rows + ii) * seq_k + j;
}

// The weights over the keys of row (b, h, i) that a convention averages V
// with (empty for NaN, or without keys): uniform (the mean of V), or the
// softmax of every score with nothing hidden.
std::vector<double> convention_weights(ConventionKind kind, const CaseData& data, std::int64_t b, std::int64_t h,
                                       std::int64_t i) {
  const Problem& p = data.problem;
  const std::int64_t kvh = h / p.group_size();
  if (kind == ConventionKind::empty_rows_nan || p.seq_k == 0) return {};
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
  for (double& w : weight) w /= total;
  return weight;
}

// V of entry b as query head h reads it, averaged with `weight` over the
// keys, [head_dim_v]; zeros without weights.
std::vector<double> weighted_v(const CaseData& data, std::int64_t b, std::int64_t h, const std::vector<double>& weight) {
  const Problem& p = data.problem;
  const std::int64_t kvh = h / p.group_size();
  std::vector<double> row(static_cast<std::size_t>(p.head_dim_v), 0.0);
  for (std::size_t j = 0; j < weight.size(); ++j) {
    for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
      row[static_cast<std::size_t>(d)] +=
          weight[j] * data.v[static_cast<std::size_t>(((b * p.heads_kv + kvh) * p.seq_k + static_cast<std::int64_t>(j)) * p.head_dim_v + d)];
    }
  }
  return row;
}

// The row every convention predicts, [head_dim_v]; zeros for NaN.
std::vector<double> predicted_row(ConventionKind kind, const CaseData& data, std::int64_t b, std::int64_t h,
                                  std::int64_t i) {
  return weighted_v(data, b, h, convention_weights(kind, data, b, h, i));
}

// The error a backend of the case's dtype may make in a row it computes by
// the convention, inside a layer, [head_dim_v]: the projections' errors of
// V averaged with the convention's weights, those of Q and K moving its
// scores (softmax with nothing hidden), and its own rounding over the keys;
// with the layer bounds' safety factor. (The format's row of 0 has none.)
std::vector<double> convention_row_error(ConventionKind kind, const CaseData& data, const LayerProjectionErrors& e,
                                         std::int64_t b, std::int64_t h, std::int64_t i) {
  const Problem& p = data.problem;
  const std::int64_t g = h / p.group_size();
  const double u = unit_roundoff(p.dtype), u_acc = accumulation_roundoff(p.dtype);
  std::vector<double> error(static_cast<std::size_t>(p.head_dim_v), 0.0);
  const std::vector<double> weight = convention_weights(kind, data, b, h, i);
  if (weight.empty()) return error;
  const std::vector<double> row = weighted_v(data, b, h, weight);
  const std::int64_t q_row = (b * p.heads_q + h) * p.seq_q + i;
  double score_shift = 0;
  if (kind == ConventionKind::empty_rows_unmasked) {
    for (std::int64_t j = 0; j < p.seq_k; ++j) {
      double shift2 = 0, s = 0;
      for (std::int64_t d = 0; d < p.head_dim; ++d) {
        const auto qi = static_cast<std::size_t>(q_row * p.head_dim + d);
        const auto kj = static_cast<std::size_t>(((b * p.heads_kv + g) * p.seq_k + j) * p.head_dim + d);
        shift2 += e.q[qi] * data.k[kj] * e.q[qi] * data.k[kj] + data.q[qi] * e.k[kj] * data.q[qi] * e.k[kj];
        s += data.q[qi] * data.k[kj];
      }
      score_shift = std::max(score_shift, std::fabs(p.scale) * (std::sqrt(shift2) + u_acc * std::fabs(s)));
    }
  }
  const double grow = std::sqrt(static_cast<double>(p.seq_k)) * u_acc + u;
  for (std::int64_t j = 0; j < p.seq_k; ++j) {
    const double w = weight[static_cast<std::size_t>(j)];
    for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
      const auto vj = static_cast<std::size_t>(((b * p.heads_kv + g) * p.seq_k + j) * p.head_dim_v + d);
      error[static_cast<std::size_t>(d)] +=
          w * (e.v[vj] + grow * std::fabs(data.v[vj]) + score_shift * std::fabs(data.v[vj] - row[static_cast<std::size_t>(d)]));
    }
  }
  for (double& x : error) x *= ToleranceConstants::safety_factor;
  return error;
}

std::string kind_text(ConventionKind kind) {
  switch (kind) {
    case ConventionKind::empty_rows_mean_v: return "the mean of V";
    case ConventionKind::empty_rows_nan: return "NaN";
    case ConventionKind::empty_rows_unmasked: return "the attention with nothing hidden";
  }
  return "?";
}

// "the mean of V", or "NaN or the mean of V": what the declarations allow.
std::string declared_text(const std::vector<Convention>& conventions) {
  std::vector<std::string> names;
  for (const Convention& c : conventions) names.push_back(kind_text(c.kind));
  return fmt::format("{}", fmt::join(names, " or "));
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
  // (Plus the dtype's subnormal spacing: a mean of V near 0 rounds to it.)
  const double tolerance = (8 * unit_roundoff(p.dtype) + 8 * std::sqrt(n) * 0x1p-24) * std::max(v_max, 1e-30) +
                           underflow_floor(p.dtype);
  std::int64_t neither = 0;
  std::string first;
  for (std::int64_t b = 0; b < p.q_batch(); ++b) {
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
    result.failure = fmt::format("{} of {} rows with no visible key hold neither the format's 0 nor what the declared "
                                 "convention gives ({}) (first at {})",
                                 neither, result.empty_rows, declared_text(conventions), first);
  }
  return result;
}

ConventionOutcome apply_layer_conventions(const std::vector<Convention>& conventions, const LayerData& layer,
                                          const LayerReference& reference, const std::vector<double>& bound,
                                          std::vector<double>& y) {
  ConventionOutcome result;
  const CaseData& data = reference.attention;
  const Problem& p = data.problem;
  const std::int64_t m = layer.model_dim, width = p.head_dim_v;
  // Which (b, h, i) rows have no visible key, and which queries have any.
  std::vector<char> empty(static_cast<std::size_t>(p.rows()), 0);
  std::vector<char> query(static_cast<std::size_t>(p.batch * p.seq_q), 0);
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        bool none = true;
        for (std::int64_t j = 0; j < p.seq_k && none; ++j) none = !reference_visible(data, b, h, i, j);
        if (!none) continue;
        empty[static_cast<std::size_t>((b * p.heads_q + h) * p.seq_q + i)] = 1;
        query[static_cast<std::size_t>(b * p.seq_q + i)] = 1;
      }
  // y as each convention predicts it, and its bound: the rows that follow
  // it carry what a backend computing them in the dtype may err by (a mean
  // of V through W_O is not a row of 0, whose bound is b_O's rounding).
  std::vector<std::vector<double>> predicted, predicted_bound;
  const bool averages = std::any_of(conventions.begin(), conventions.end(),
                                    [](const Convention& c) { return c.kind != ConventionKind::empty_rows_nan; });
  const LayerProjectionErrors projections = averages ? layer_projection_errors(layer, reference) : LayerProjectionErrors{};
  const std::vector<double> attention_error = averages ? layer_attention_error(layer, reference) : std::vector<double>{};
  for (const Convention& c : conventions) {
    std::vector<double> o = reference.result.out, error = attention_error;
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t h = 0; h < p.heads_q; ++h)
        for (std::int64_t i = 0; i < p.seq_q; ++i) {
          const std::size_t row = static_cast<std::size_t>((b * p.heads_q + h) * p.seq_q + i);
          if (!empty[row]) continue;
          const std::vector<double> want = predicted_row(c.kind, data, b, h, i);
          const std::vector<double> err = c.kind == ConventionKind::empty_rows_nan
                                              ? std::vector<double>{}
                                              : convention_row_error(c.kind, data, projections, b, h, i);
          for (std::int64_t d = 0; d < width; ++d) {
            const std::size_t at = row * static_cast<std::size_t>(width) + static_cast<std::size_t>(d);
            o[at] = c.kind == ConventionKind::empty_rows_nan ? std::numeric_limits<double>::quiet_NaN()
                                                             : want[static_cast<std::size_t>(d)];
            if (!err.empty()) error[at] = err[static_cast<std::size_t>(d)];
          }
        }
    const std::vector<double> merged = merge_heads(o, p.batch, p.heads_q, p.seq_q, width);
    predicted.push_back(reference_projection(merged, p.batch * p.seq_q, layer.o_width(), layer.w_o, m, layer.b_o));
    predicted_bound.push_back(c.kind == ConventionKind::empty_rows_nan
                                  ? std::vector<double>{}
                                  : layer_output_bounds(layer, predicted.back(), o, error));
  }
  std::int64_t neither = 0;
  std::string first;
  for (std::int64_t q = 0; q < p.batch * p.seq_q; ++q) {
    if (!query[static_cast<std::size_t>(q)]) continue;
    ++result.empty_rows;
    const std::size_t at = static_cast<std::size_t>(q * m);
    bool is_format = true;
    for (std::int64_t e = 0; e < m && is_format; ++e) {
      const std::size_t k = at + static_cast<std::size_t>(e);
      is_format = std::isfinite(y[k]) && std::fabs(y[k] - reference.y[k]) <= 2 * bound[k];
    }
    if (is_format) continue;
    bool matched = false;
    for (std::size_t c = 0; c < conventions.size() && !matched; ++c) {
      bool same = true;
      for (std::int64_t e = 0; e < m && same; ++e) {
        const std::size_t k = at + static_cast<std::size_t>(e);
        if (conventions[c].kind == ConventionKind::empty_rows_nan) same = std::isnan(y[k]);
        else same = std::isfinite(y[k]) && std::fabs(y[k] - predicted[c][k]) <= 2 * predicted_bound[c][k] + 1e-300;
      }
      if (same) {
        matched = true;
        if (result.followed.empty()) {
          result.followed = fmt::format("{} ({})", kind_text(conventions[c].kind), conventions[c].why);
        }
      }
    }
    if (!matched) {
      if (neither == 0) first = fmt::format("[{},{}]", q / p.seq_q, q % p.seq_q);
      ++neither;
      continue;
    }
    ++result.rows_followed;
    std::copy(reference.y.begin() + static_cast<std::ptrdiff_t>(at), reference.y.begin() + static_cast<std::ptrdiff_t>(at + m),
              y.begin() + static_cast<std::ptrdiff_t>(at));
  }
  if (neither > 0) {
    result.failure = fmt::format("{} of {} queries with a fully hidden head give a y row that is neither the format's "
                                 "nor what the declared convention gives ({}) (first at [b,i] = {})",
                                 neither, result.empty_rows, declared_text(conventions), first);
  }
  return result;
}

std::string differs_reason(const ConventionOutcome& outcome) {
  return fmt::format("{} of {} rows with no visible key give {} where the format gives 0; the rest matches",
                     outcome.rows_followed, outcome.empty_rows, outcome.followed);
}

}  // namespace attn
