#include "reference/reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "core/detmath.hpp"
#include "core/thread_pool.hpp"
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

// Where query row `row` of the q tensor (tensor batch tb, head h, seq s) and
// its keys are. Written here from the format's text, apart from the helpers
// the backends share (attnbench/sequences.hpp), so that a slip there cannot hide.
struct RowPlace {
  std::int64_t tb = 0, h = 0, g = 0, s = 0, row = 0;
  std::int64_t entry = -1;             // -1: a packed row past the last sequence
  std::int64_t i = 0;                  // the query's position in its entry
  std::int64_t k_len = 0, limit = 0;   // the entry's keys, and those kv_len leaves
  std::int64_t diag = 0;               // key position of the query's diagonal
};

RowPlace place(const CaseData& data, std::int64_t tb, std::int64_t h, std::int64_t s) {
  const Problem& p = data.problem;
  RowPlace at;
  at.tb = tb, at.h = h, at.g = h / p.group_size(), at.s = s, at.row = (tb * p.heads_q + h) * p.seq_q + s;
  std::int64_t q_len = p.seq_q;
  at.entry = tb;
  at.i = s;
  at.k_len = p.seq_k;
  if (p.ragged) {
    // The entry e with cu_seqlens_q[e] <= s < cu_seqlens_q[e + 1] (the last such
    // when empty entries share an offset), by bisection: a file may hold
    // millions of empty entries.
    at.entry = -1;
    std::int64_t lo = 0, hi = p.batch;  // cu[lo] <= s holds for lo = 0 when s >= 0
    if (s >= data.cu_seqlens_q[static_cast<std::size_t>(p.batch)]) return at;  // past the last sequence
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (data.cu_seqlens_q[static_cast<std::size_t>(mid)] <= s) lo = mid;
      else hi = mid;
    }
    at.entry = lo;
    at.i = s - data.cu_seqlens_q[at.entry];
    q_len = data.cu_seqlens_q[at.entry + 1] - data.cu_seqlens_q[at.entry];
    at.k_len = data.cu_seqlens_k[at.entry + 1] - data.cu_seqlens_k[at.entry];
  }
  if (p.paged()) at.k_len = data.seq_lens[tb];
  at.limit = p.kv_len ? data.kv_len[tb] : at.k_len;
  Align align = p.align;
  if (p.causal == Causal::top_left) align = Align::top_left;
  if (p.causal == Causal::bottom_right) align = Align::bottom_right;
  at.diag = align == Align::top_left ? at.i : at.i + at.k_len - q_len;
  return at;
}

const double* key_row(const CaseData& data, const std::vector<double>& tensor, const RowPlace& at, std::int64_t j,
                      std::int64_t width) {
  const Problem& p = data.problem;
  std::int64_t b = at.tb, s = j, seq = p.seq_k;
  if (p.ragged) b = 0, s = data.cu_seqlens_k[at.entry] + j;
  if (p.paged()) {
    b = data.page_table[static_cast<std::size_t>(at.tb * (p.seq_k / p.page_size) + j / p.page_size)];
    s = j % p.page_size;
    seq = p.page_size;
  }
  return &tensor[static_cast<std::size_t>(idx4(b, at.g, s, 0, p.heads_kv, seq, width))];
}

// The score of key j (entry-local) for a row, in the format's order: scale
// times the exact dot, capped, plus ALiBi, plus the bias. `magnitude` gets
// what the tolerance policy needs: |scale| sum |q k| (through the cap's
// slope, plus the cap), plus |alibi| and |bias|.
__attribute__((target_clones("fma", "default")))  // as compute_row, below
double score(const CaseData& data, const RowPlace& at, std::int64_t j, double* magnitude, double* added = nullptr) {
  const Problem& p = data.problem;
  const double* q = &data.q[static_cast<std::size_t>(at.row * p.head_dim)];
  const double* k = key_row(data, data.k, at, j, p.head_dim);
  CompensatedSum dot;
  double m = 0;
  for (std::int64_t d = 0; d < p.head_dim; ++d) {
    dot.add_product(q[d], k[d]);
    m += std::fabs(q[d] * k[d]);
  }
  CompensatedSum s;
  s.add_product(p.scale, dot.value());
  m *= std::fabs(p.scale);
  if (p.softcap != 0) {
    // An error e of the product moves cap tanh(s / cap) by about e (1 - tanh^2).
    const double t = detmath::tanh(s.value() / p.softcap);
    s = CompensatedSum{};
    s.add(p.softcap * t);
    // Each of s / cap, tanh and cap * t rounds relative to the capped score,
    // whose size is |cap t| (at most the cap, and at most |s|): a cap of 1e30
    // over scores of 10 costs roundings of 10, not of 1e30.
    m = m * (1.0 - t * t) + std::fabs(p.softcap * t);
  }
  double terms = 0;  // |ALiBi| + |bias|: what is added to the scaled product
  if (p.alibi) {
    // -slope |diag - j|: a float32 slope times an integer below 2^31, exact in a double.
    const double term = -data.alibi_slopes[static_cast<std::size_t>(at.h)] * static_cast<double>(std::llabs(at.diag - j));
    s.add(term);
    m += std::fabs(term);
    terms += std::fabs(term);
  }
  if (p.bias.present) {
    const double bias = data.bias[static_cast<std::size_t>(broadcast_index(p.bias, at.tb, at.h, at.s, j, p.seq_k))];
    s.add(bias);
    m += std::fabs(bias);
    terms += std::fabs(bias);
  }
  if (magnitude) *magnitude = m;
  if (added) *added = terms;
  return s.value();
}

bool visible(const CaseData& data, const RowPlace& at, std::int64_t j) {
  const Problem& p = data.problem;
  if (at.entry < 0 || j < 0 || j >= at.k_len || j >= at.limit) return false;
  if (p.causal != Causal::none && j > at.diag) return false;
  // Distances from the diagonal: a window up to INT64_MAX cannot overflow.
  if (p.window_left >= 0 && at.diag - j > p.window_left) return false;
  if (p.window_right >= 0 && j - at.diag > p.window_right) return false;
  if (p.mask.present && data.mask[static_cast<std::size_t>(broadcast_index(p.mask, at.tb, at.h, at.s, j, p.seq_k))] == 0) {
    return false;
  }
  if (p.bias.present) {
    const double bias = data.bias[static_cast<std::size_t>(broadcast_index(p.bias, at.tb, at.h, at.s, j, p.seq_k))];
    if (std::isinf(bias) && bias < 0) return false;
  }
  return true;
}

double sink_of(const CaseData& data, std::int64_t h) {
  return data.problem.sinks ? data.sinks[static_cast<std::size_t>(h)] : -std::numeric_limits<double>::infinity();
}

// Built twice, with and without the FMA instruction, and the CPU's picks one
// at load time: the exact products of CompensatedSum are std::fma, a library
// call without it. Both give the same bits: fma is correctly rounded either
// way, and -ffp-contract=off keeps the compiler from fusing anything else.
__attribute__((target_clones("fma", "default")))
void compute_row(const CaseData& data, std::int64_t b, std::int64_t h, std::int64_t i, ReferenceResult& result,
                 ReferenceStats* stats, std::vector<double>& scores, std::vector<double>& magnitudes,
                 std::vector<std::int64_t>& visible_keys) {
  const Problem& p = data.problem;
  const RowPlace at = place(data, b, h, i);
  const std::int64_t row = at.row;
  visible_keys.clear();
  scores.clear();
  magnitudes.clear();
  // The sink joins the denominator as one more logit that carries no value.
  const double sink = sink_of(data, h);
  double max_score = sink, max_added = 0;
  for (std::int64_t j = 0; j < at.k_len; ++j) {
    if (!visible(data, at, j)) continue;
    double magnitude = 0, added = 0;
    const double s = score(data, at, j, &magnitude, &added);
    visible_keys.push_back(j);
    scores.push_back(s);
    magnitudes.push_back(magnitude);
    max_added = std::max(max_added, added);
    max_score = std::max(max_score, s);
  }

  const std::int64_t out_base = row * p.head_dim_v;
  if (stats) {
    stats->visible[static_cast<std::size_t>(row)] = static_cast<std::int64_t>(visible_keys.size());
    double m = 0;
    for (double x : magnitudes) m = std::max(m, x);
    stats->score_magnitude[static_cast<std::size_t>(row)] = m;
    stats->added_magnitude[static_cast<std::size_t>(row)] = max_added;
  }
  if (visible_keys.empty()) {
    for (std::int64_t d = 0; d < p.head_dim_v; ++d) result.out[static_cast<std::size_t>(out_base + d)] = 0.0;
    result.lse[static_cast<std::size_t>(row)] = sink;  // -inf without a sink
    return;  // stats of the elements stay 0: a hidden row must be exactly 0
  }
  CompensatedSum denominator;
  for (double& s : scores) s -= max_score;
  detmath::exp_n(scores.data(), scores.data(), scores.size());  // scores now hold the unnormalised weights
  for (double s : scores) denominator.add(s);
  if (p.sinks) denominator.add(detmath::exp(sink - max_score));
  const double total = denominator.value();
  result.lse[static_cast<std::size_t>(row)] = max_score + detmath::log(total);
  if (stats) {
    CompensatedSum squares;
    for (double w : scores) squares.add((w / total) * (w / total));
    stats->weight_norm[static_cast<std::size_t>(row)] = std::sqrt(squares.value());
    // Weights equal in the arithmetic type (float32, float64 for float64
    // cases) round alike when summed: sqrt(sum of each value's count^2).
    std::vector<double> held(scores.size());
    for (std::size_t n = 0; n < scores.size(); ++n) {
      const double w = scores[n] / total;
      held[n] = p.dtype == DType::f64 ? w : static_cast<double>(static_cast<float>(w));
    }
    std::sort(held.begin(), held.end());
    double repeats = 0;
    for (std::size_t n = 0; n < held.size();) {
      std::size_t end = n + 1;
      while (end < held.size() && held[end] == held[n]) ++end;
      repeats += static_cast<double>(end - n) * static_cast<double>(end - n);
      n = end;
    }
    stats->weight_repeats[static_cast<std::size_t>(row)] = std::sqrt(repeats);
  }
  auto v_at = [&](std::size_t n, std::int64_t d) {
    return key_row(data, data.v, at, visible_keys[n], p.head_dim_v)[d];
  };
  for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
    // Sums of up to n weights (each at most 1) times v overflow when |v| is
    // near the largest double: such columns are summed as v * 2^-shift, which
    // is exact, and scaled back (the result is at most max |v|).
    double largest = 0;
    for (std::size_t n = 0; n < visible_keys.size(); ++n) largest = std::max(largest, std::fabs(v_at(n, d)));
    int shift = 0;
    if (largest * static_cast<double>(visible_keys.size()) > 0x1p1000) {
      shift = std::ilogb(largest) + std::ilogb(static_cast<double>(visible_keys.size())) - 1000;
    }
    auto column = [&](std::size_t n) { return shift == 0 ? v_at(n, d) : std::ldexp(v_at(n, d), -shift); };
    CompensatedSum acc;
    for (std::size_t n = 0; n < visible_keys.size(); ++n) acc.add_product(scores[n], column(n));
    const double out = std::ldexp(acc.value() / total, shift);
    result.out[static_cast<std::size_t>(out_base + d)] = out;
    if (stats) {
      double lo = p.sinks ? 0.0 : v_at(0, d), hi = lo;
      for (std::size_t n = 0; n < visible_keys.size(); ++n) {
        lo = std::min(lo, v_at(n, d));
        hi = std::max(hi, v_at(n, d));
      }
      stats->hull_lo[static_cast<std::size_t>(out_base + d)] = lo;
      stats->hull_hi[static_cast<std::size_t>(out_base + d)] = hi;
      CompensatedSum abs_v, dev_v, tiny_v;
      const double scaled_out = std::ldexp(out, -shift);
      const double tiny = smallest_kept_weight(p.dtype) * total;  // an unnormalised weight below it is p_ij below that
      for (std::size_t n = 0; n < visible_keys.size(); ++n) {
        const double v = column(n);
        abs_v.add(scores[n] * std::fabs(v));
        dev_v.add(scores[n] * std::fabs(v - scaled_out));
        if (scores[n] < tiny) tiny_v.add(scores[n] * std::fabs(v));
      }
      stats->weighted_abs_v[static_cast<std::size_t>(out_base + d)] = std::ldexp(abs_v.value() / total, shift);
      stats->weighted_dev_v[static_cast<std::size_t>(out_base + d)] = std::ldexp(dev_v.value() / total, shift);
      stats->tiny_weighted_v[static_cast<std::size_t>(out_base + d)] = std::ldexp(tiny_v.value() / total, shift);
    }
  }
}

}  // namespace

bool reference_visible(const CaseData& data, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  return visible(data, place(data, b, h, i), j);
}

ReferenceRowKeys reference_row_keys(const CaseData& data, std::int64_t b, std::int64_t h, std::int64_t i) {
  const RowPlace at = place(data, b, h, i);
  return {at.entry < 0 ? 0 : at.k_len, at.diag};
}

ReferenceRowEntry reference_row_entry(const CaseData& data, std::int64_t b, std::int64_t i) {
  const RowPlace at = place(data, b, 0, i);
  return {at.entry, at.i};
}

std::int64_t reference_key_offset(const CaseData& data, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j,
                                  std::int64_t width) {
  const RowPlace at = place(data, b, h, i);
  const std::vector<double>& tensor = width == data.problem.head_dim_v ? data.v : data.k;
  return key_row(data, tensor, at, j, width) - tensor.data();
}

void reference_row_view(const CaseData& data, std::int64_t b, std::int64_t h, std::int64_t i, ReferenceRowView& view) {
  const Problem& p = data.problem;
  const RowPlace at = place(data, b, h, i);
  view.keys = at.entry < 0 ? 0 : at.k_len;
  view.diag = at.diag;
  view.visible.clear();
  view.k_rows.clear();
  view.v_rows.clear();
  for (std::int64_t j = 0; j < view.keys; ++j) {
    if (!visible(data, at, j)) continue;
    view.visible.push_back(j);
    view.k_rows.push_back(key_row(data, data.k, at, j, p.head_dim));
    view.v_rows.push_back(key_row(data, data.v, at, j, p.head_dim_v));
  }
}

double reference_score(const CaseData& data, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  return score(data, place(data, b, h, i), j, nullptr);
}

double smallest_kept_weight(DType dtype) {
  switch (dtype) {
    case DType::f16: return 0x1p-14;
    case DType::f32:
    case DType::bf16: return 0x1p-126;
    case DType::f64: return 0x1p-1022;
  }
  return 0x1p-14;
}

double reference_added_magnitude(const CaseData& data, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  double added = 0;
  score(data, place(data, b, h, i), j, nullptr, &added);
  return added;
}

std::vector<double> reference_weights(const CaseData& data, std::int64_t b, std::int64_t h) {
  const Problem& p = data.problem;
  std::vector<double> weights(static_cast<std::size_t>(p.seq_q * p.seq_k), 0.0);
  for (std::int64_t i = 0; i < p.seq_q; ++i) {
    double* row = weights.data() + static_cast<std::size_t>(i * p.seq_k);  // no element when seq_k is 0
    const RowPlace at = place(data, b, h, i);
    const double sink = sink_of(data, h);
    double max_score = sink;
    std::vector<std::int64_t> shown;
    for (std::int64_t j = 0; j < at.k_len; ++j) {
      if (!visible(data, at, j)) continue;
      row[j] = score(data, at, j, nullptr);
      max_score = std::max(max_score, row[j]);
      shown.push_back(j);
    }
    CompensatedSum total;
    for (std::int64_t j : shown) {
      row[j] = detmath::exp(row[j] - max_score);
      total.add(row[j]);
    }
    if (p.sinks && !shown.empty()) total.add(detmath::exp(sink - max_score));
    for (std::int64_t j : shown) row[j] /= total.value();
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
    stats->tiny_weighted_v.assign(result.out.size(), 0.0);
    stats->score_magnitude.assign(result.lse.size(), 0.0);
    stats->added_magnitude.assign(result.lse.size(), 0.0);
    stats->visible.assign(result.lse.size(), 0);
    stats->weight_norm.assign(result.lse.size(), 0.0);
    stats->weight_repeats.assign(result.lse.size(), 0.0);
    stats->hull_lo.assign(result.out.size(), 0.0);
    stats->hull_hi.assign(result.out.size(), 0.0);
  }
  const std::int64_t rows = p.rows();
  int workers = threads > 0 ? threads : available_cpus();
  if (rows * p.seq_k * (p.head_dim + p.head_dim_v) < (1 << 16)) workers = 1;
  auto work = [&](int worker) {
    std::vector<double> scores, magnitudes;
    std::vector<std::int64_t> visible;
    // Rows are interleaved so causal cases share the work evenly.
    for (std::int64_t row = worker; row < rows; row += workers) {
      const std::int64_t i = row % p.seq_q, bh = row / p.seq_q;
      compute_row(data, bh / p.heads_q, bh % p.heads_q, i, result, stats, scores, magnitudes, visible);
    }
  };
  run_on_new_threads(workers, work);
  return result;
}

}  // namespace attn
