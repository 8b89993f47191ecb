#include "verify/weights.hpp"

#include <fmt/format.h>

#include <cmath>

#include "attnbench/error.hpp"
#include "reference/reference.hpp"
#include "verify/run_case.hpp"

namespace attn {

namespace {

// Where key j of query row i's entry sits among the columns of the view: the
// packed position for packed (ragged) sequences, whose columns are the packed
// keys; j itself otherwise. -1 for a row past the last sequence.
std::int64_t key_column_offset(const CaseData& data, std::int64_t i) {
  const Problem& p = data.problem;
  if (!p.ragged) return 0;
  for (std::int64_t e = 0; e < p.batch; ++e) {
    const auto at = static_cast<std::size_t>(e);
    if (i >= data.cu_seqlens_q[at] && i < data.cu_seqlens_q[at + 1]) return data.cu_seqlens_k[at];
  }
  return -1;
}

std::vector<char> hidden_of(const CaseData& data, std::int64_t b, std::int64_t h) {
  const Problem& p = data.problem;
  std::vector<char> hidden(static_cast<std::size_t>(p.seq_q * p.seq_k), 1);
  for (std::int64_t i = 0; i < p.seq_q; ++i) {
    const std::int64_t offset = key_column_offset(data, i);
    if (offset < 0) continue;
    for (std::int64_t j = 0; j + offset < p.seq_k; ++j) {
      hidden[static_cast<std::size_t>(i * p.seq_k + offset + j)] = !reference_visible(data, b, h, i, j);
    }
  }
  return hidden;
}

// The reference's weights (entry-local keys) moved to the view's columns.
std::vector<double> weights_in_columns(const CaseData& data, std::int64_t b, std::int64_t h) {
  const Problem& p = data.problem;
  std::vector<double> local = reference_weights(data, b, h);
  if (!p.ragged) return local;
  std::vector<double> placed(local.size(), 0.0);
  for (std::int64_t i = 0; i < p.seq_q; ++i) {
    const std::int64_t offset = key_column_offset(data, i);
    if (offset < 0) continue;
    for (std::int64_t j = 0; j + offset < p.seq_k; ++j) {
      placed[static_cast<std::size_t>(i * p.seq_k + offset + j)] = local[static_cast<std::size_t>(i * p.seq_k + j)];
    }
  }
  return placed;
}

void check_indices(const Problem& p, std::int64_t b, std::int64_t h) {
  // Packed sequences are one batch of packed rows: every entry is in batch 0.
  if (b < 0 || b >= p.q_batch()) {
    throw InputError(fmt::format("--batch {} is outside [0, {}){}", b, p.q_batch(),
                                 p.ragged ? " (packed sequences: every entry is in batch 0)" : ""));
  }
  if (h < 0 || h >= p.heads_q) throw InputError(fmt::format("--head {} is outside [0, {})", h, p.heads_q));
}
}  // namespace

WeightsView reference_weights_view(const CaseData& data, std::int64_t b, std::int64_t h) {
  check_indices(data.problem, b, h);
  return {data.problem.seq_q, data.problem.seq_k, weights_in_columns(data, b, h), hidden_of(data, b, h)};
}

WeightsView backend_weights_view(const Backend& backend, const CaseData& data, std::int64_t b, std::int64_t h,
                                 const RunOptions& options) {
  const Problem& p = data.problem;
  check_indices(p, b, h);
  CaseData identity = data;
  identity.problem.head_dim_v = std::max<std::int64_t>(p.seq_k, 1);
  identity.v.assign(static_cast<std::size_t>(identity.problem.v_elements()), 0.0);
  for (std::int64_t bb = 0; bb < p.batch; ++bb)
    for (std::int64_t g = 0; g < p.heads_kv; ++g)
      for (std::int64_t j = 0; j < p.seq_k; ++j) {
        identity.v[static_cast<std::size_t>(((bb * p.heads_kv + g) * p.seq_k + j) * identity.problem.head_dim_v + j)] = 1.0;
      }
  Status ok = backend.available();
  if (ok) ok = backend_accepts(backend, identity.problem);
  if (!ok) throw Error(fmt::format("{} cannot produce weights here: {}", backend.name(), ok.reason));
  BackendRun run = run_backend(backend, identity, options);
  WeightsView view{p.seq_q, p.seq_k, {}, hidden_of(data, b, h)};
  view.weights.resize(static_cast<std::size_t>(p.seq_q * p.seq_k));
  for (std::int64_t i = 0; i < p.seq_q; ++i)
    for (std::int64_t j = 0; j < p.seq_k; ++j) {
      view.weights[static_cast<std::size_t>(i * p.seq_k + j)] =
          run.out[static_cast<std::size_t>(((b * p.heads_q + h) * p.seq_q + i) * identity.problem.head_dim_v + j)];
    }
  return view;
}

WeightsView reference_gradient_view(const CaseData& data, const std::vector<double>& dout, std::int64_t b, std::int64_t h,
                                    GradientMatrix which) {
  const Problem& p = data.problem;
  check_indices(p, b, h);
  if (static_cast<std::int64_t>(dout.size()) != p.out_elements()) throw InputError("the case holds no dout (format version 3)");
  const ReferenceResult forward = reference_attention(data);
  const std::vector<double> weights = weights_in_columns(data, b, h);
  WeightsView view{p.seq_q, p.seq_k, std::vector<double>(static_cast<std::size_t>(p.seq_q * p.seq_k), 0.0), hidden_of(data, b, h)};
  ReferenceRowView row;
  for (std::int64_t i = 0; i < p.seq_q; ++i) {
    const std::int64_t offset = key_column_offset(data, i);
    if (offset < 0) continue;
    reference_row_view(data, b, h, i, row);
    const auto first = static_cast<std::size_t>(((b * p.heads_q + h) * p.seq_q + i) * p.head_dim_v);
    double delta = 0;
    for (std::int64_t d = 0; d < p.head_dim_v; ++d) delta += dout[first + d] * forward.out[first + d];
    for (std::size_t t = 0; t < row.visible.size(); ++t) {
      const auto e = static_cast<std::size_t>(i * p.seq_k + offset + row.visible[t]);
      double dp = 0;
      for (std::int64_t d = 0; d < p.head_dim_v; ++d) dp += dout[first + d] * row.v_rows[t][d];
      view.weights[e] = which == GradientMatrix::dp ? dp : weights[e] * (dp - delta);
    }
  }
  return view;
}

std::string format_weights_table(const WeightsView& view, std::int64_t max_queries, std::int64_t max_keys) {
  // Which indices to show along one axis: all, or the first and last halves
  // of the limit with a gap (-1) between them.
  auto shown = [](std::int64_t n, std::int64_t limit) {
    std::vector<std::int64_t> index;
    if (limit <= 0 || n <= limit) {
      for (std::int64_t i = 0; i < n; ++i) index.push_back(i);
      return index;
    }
    const std::int64_t head = (limit + 1) / 2, tail = limit / 2;
    for (std::int64_t i = 0; i < head; ++i) index.push_back(i);
    index.push_back(-1);
    for (std::int64_t i = n - tail; i < n; ++i) index.push_back(i);
    return index;
  };
  const std::vector<std::int64_t> rows = shown(view.queries, max_queries), cols = shown(view.keys, max_keys);
  // Three decimals; a weight too small for them keeps two significant digits,
  // so a long row of tiny weights does not read as zeros.
  auto cell = [&](std::int64_t i, std::int64_t j) {
    if (i < 0 || j < 0) return fmt::format(" {:>7}", "...");
    const auto e = static_cast<std::size_t>(i * view.keys + j);
    if (view.hidden[e]) return fmt::format(" {:>7}", "-");
    const double w = view.weights[e];
    return w == 0 || std::fabs(w) >= 0.0005 ? fmt::format(" {:>7.3f}", w) : fmt::format(" {:>7.1e}", w);
  };
  std::string out = "        ";
  for (std::int64_t j : cols) out += fmt::format(" {:>7}", j < 0 ? std::string("...") : fmt::format("k{}", j));
  out += "\n";
  for (std::int64_t i : rows) {
    out += fmt::format("{:<8}", i < 0 ? std::string("...") : fmt::format("q{}", i));
    for (std::int64_t j : cols) out += cell(i, j);
    out += "\n";
  }
  if (static_cast<std::int64_t>(rows.size()) < view.queries || static_cast<std::int64_t>(cols.size()) < view.keys) {
    out += fmt::format("(showing the first and last of {} queries and {} keys; --all prints every weight)\n",
                       view.queries, view.keys);
  }
  return out;
}

}  // namespace attn
