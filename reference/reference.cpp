#include "reference/reference.hpp"

#include <cmath>
#include <limits>
#include <thread>

#include "core/detmath.hpp"
#include "reference/compensated_sum.hpp"

namespace attn {

namespace {

std::int64_t idx4(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d, std::int64_t nb, std::int64_t nc,
                  std::int64_t nd) {
  return ((a * nb + b) * nc + c) * nd + d;
}

std::int64_t broadcast_index(const BroadcastShape& s, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j,
                             std::int64_t seq_k) {
  return idx4(s.batch == 1 ? 0 : b, s.heads == 1 ? 0 : h, s.rows == 1 ? 0 : i, j, s.heads, s.rows, seq_k);
}

void compute_row(const CaseData& data, std::int64_t b, std::int64_t h, std::int64_t i, ReferenceResult& result,
                 ReferenceStats* stats, std::vector<double>& scores, std::vector<double>& magnitudes,
                 std::vector<std::int64_t>& visible_keys) {
  const Problem& p = data.problem;
  const std::int64_t g = h / p.group_size();
  const std::int64_t row = (b * p.heads_q + h) * p.seq_q + i;
  const double* q = &data.q[static_cast<std::size_t>(row * p.head_dim)];
  visible_keys.clear();
  scores.clear();
  magnitudes.clear();
  double max_score = -std::numeric_limits<double>::infinity();
  for (std::int64_t j = 0; j < p.seq_k; ++j) {
    if (!reference_visible(data, b, h, i, j)) continue;
    const double* k = &data.k[static_cast<std::size_t>(idx4(b, g, j, 0, p.heads_kv, p.seq_k, p.head_dim))];
    CompensatedSum dot;
    double magnitude = 0;
    for (std::int64_t d = 0; d < p.head_dim; ++d) {
      dot.add_product(q[d], k[d]);
      magnitude += std::fabs(q[d] * k[d]);
    }
    CompensatedSum s;
    s.add_product(p.scale, dot.value());
    magnitude *= std::fabs(p.scale);
    if (p.bias.present) {
      double bias = data.bias[static_cast<std::size_t>(broadcast_index(p.bias, b, h, i, j, p.seq_k))];
      s.add(bias);
      magnitude += std::fabs(bias);
    }
    visible_keys.push_back(j);
    scores.push_back(s.value());
    magnitudes.push_back(magnitude);
    max_score = std::max(max_score, s.value());
  }

  const std::int64_t out_base = row * p.head_dim_v;
  if (stats) {
    stats->visible[static_cast<std::size_t>(row)] = static_cast<std::int64_t>(visible_keys.size());
    double m = 0;
    for (double x : magnitudes) m = std::max(m, x);
    stats->score_magnitude[static_cast<std::size_t>(row)] = m;
  }
  if (visible_keys.empty()) {
    for (std::int64_t d = 0; d < p.head_dim_v; ++d) result.out[static_cast<std::size_t>(out_base + d)] = 0.0;
    result.lse[static_cast<std::size_t>(row)] = -std::numeric_limits<double>::infinity();
    return;  // stats of the elements stay 0: a hidden row must be exactly 0
  }
  CompensatedSum denominator;
  for (double& s : scores) {
    s = detmath::exp(s - max_score);  // scores now hold the unnormalised weights
    denominator.add(s);
  }
  const double total = denominator.value();
  result.lse[static_cast<std::size_t>(row)] = max_score + detmath::log(total);
  if (stats) {
    CompensatedSum squares;
    for (double w : scores) squares.add((w / total) * (w / total));
    stats->weight_norm[static_cast<std::size_t>(row)] = std::sqrt(squares.value());
  }
  for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
    // Sums of up to n weights (each at most 1) times v overflow when |v| is
    // near the largest double: such columns are summed as v * 2^-shift, which
    // is exact, and scaled back (the result is at most max |v|).
    double largest = 0;
    for (std::size_t n = 0; n < visible_keys.size(); ++n) {
      largest = std::max(largest, std::fabs(data.v[static_cast<std::size_t>(
                                      idx4(b, g, visible_keys[n], d, p.heads_kv, p.seq_k, p.head_dim_v))]));
    }
    int shift = 0;
    if (largest * static_cast<double>(visible_keys.size()) > 0x1p1000) {
      shift = std::ilogb(largest) + std::ilogb(static_cast<double>(visible_keys.size())) - 1000;
    }
    auto column = [&](std::size_t n) {
      return std::ldexp(data.v[static_cast<std::size_t>(idx4(b, g, visible_keys[n], d, p.heads_kv, p.seq_k, p.head_dim_v))],
                        -shift);
    };
    CompensatedSum acc;
    for (std::size_t n = 0; n < visible_keys.size(); ++n) acc.add_product(scores[n], column(n));
    const double out = std::ldexp(acc.value() / total, shift);
    result.out[static_cast<std::size_t>(out_base + d)] = out;
    if (stats) {
      CompensatedSum abs_v, dev_v;
      const double scaled_out = std::ldexp(out, -shift);
      for (std::size_t n = 0; n < visible_keys.size(); ++n) {
        const double v = column(n);
        abs_v.add(scores[n] * std::fabs(v));
        dev_v.add(scores[n] * std::fabs(v - scaled_out));
      }
      stats->weighted_abs_v[static_cast<std::size_t>(out_base + d)] = std::ldexp(abs_v.value() / total, shift);
      stats->weighted_dev_v[static_cast<std::size_t>(out_base + d)] = std::ldexp(dev_v.value() / total, shift);
    }
  }
}

}  // namespace

bool reference_visible(const CaseData& data, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  const Problem& p = data.problem;
  if (!p.causal_visible(i, j)) return false;
  if (p.kv_len && j >= data.kv_len[static_cast<std::size_t>(b)]) return false;
  if (p.mask.present && data.mask[static_cast<std::size_t>(broadcast_index(p.mask, b, h, i, j, p.seq_k))] == 0) {
    return false;
  }
  if (p.bias.present) {
    double bias = data.bias[static_cast<std::size_t>(broadcast_index(p.bias, b, h, i, j, p.seq_k))];
    if (std::isinf(bias) && bias < 0) return false;
  }
  return true;
}

std::vector<double> reference_weights(const CaseData& data, std::int64_t b, std::int64_t h) {
  const Problem& p = data.problem;
  std::vector<double> weights(static_cast<std::size_t>(p.seq_q * p.seq_k), 0.0);
  const std::int64_t g = h / p.group_size();
  for (std::int64_t i = 0; i < p.seq_q; ++i) {
    double* row = &weights[static_cast<std::size_t>(i * p.seq_k)];
    const double* q = &data.q[static_cast<std::size_t>(((b * p.heads_q + h) * p.seq_q + i) * p.head_dim)];
    double max_score = -std::numeric_limits<double>::infinity();
    std::vector<std::int64_t> visible;
    for (std::int64_t j = 0; j < p.seq_k; ++j) {
      if (!reference_visible(data, b, h, i, j)) continue;
      const double* k = &data.k[static_cast<std::size_t>(idx4(b, g, j, 0, p.heads_kv, p.seq_k, p.head_dim))];
      CompensatedSum dot;
      for (std::int64_t d = 0; d < p.head_dim; ++d) dot.add_product(q[d], k[d]);
      CompensatedSum s;
      s.add_product(p.scale, dot.value());
      if (p.bias.present) s.add(data.bias[static_cast<std::size_t>(broadcast_index(p.bias, b, h, i, j, p.seq_k))]);
      row[j] = s.value();
      max_score = std::max(max_score, row[j]);
      visible.push_back(j);
    }
    CompensatedSum total;
    for (std::int64_t j : visible) {
      row[j] = detmath::exp(row[j] - max_score);
      total.add(row[j]);
    }
    for (std::int64_t j : visible) row[j] /= total.value();
  }
  return weights;
}

ReferenceResult reference_attention(const CaseData& data, ReferenceStats* stats, int threads) {
  data.validate_shapes();  // values are the caller's: exact projections need not fit the dtype
  const Problem& p = data.problem;
  ReferenceResult result;
  result.out.assign(static_cast<std::size_t>(p.out_elements()), 0.0);
  result.lse.assign(static_cast<std::size_t>(p.rows()), 0.0);
  if (stats) {
    stats->weighted_abs_v.assign(result.out.size(), 0.0);
    stats->weighted_dev_v.assign(result.out.size(), 0.0);
    stats->score_magnitude.assign(result.lse.size(), 0.0);
    stats->visible.assign(result.lse.size(), 0);
    stats->weight_norm.assign(result.lse.size(), 0.0);
  }
  const std::int64_t rows = p.rows();
  int workers = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (rows * p.seq_k * (p.head_dim + p.head_dim_v) < (1 << 16)) workers = 1;
  auto work = [&](int worker) {
    std::vector<double> scores, magnitudes;
    std::vector<std::int64_t> visible;
    // Rows are interleaved so causal cases share the work evenly.
    for (std::int64_t row = worker; row < rows; row += workers) {
      std::int64_t i = row % p.seq_q, bh = row / p.seq_q;
      compute_row(data, bh / p.heads_q, bh % p.heads_q, i, result, stats, scores, magnitudes, visible);
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < workers; ++w) pool.emplace_back(work, w);
  work(0);
  for (auto& t : pool) t.join();
  return result;
}

}  // namespace attn
