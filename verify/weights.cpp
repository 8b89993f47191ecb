#include "verify/weights.hpp"

#include <fmt/format.h>

#include "core/error.hpp"
#include "reference/reference.hpp"
#include "verify/run_case.hpp"

namespace attn {

namespace {
std::vector<char> hidden_of(const CaseData& data, std::int64_t b, std::int64_t h) {
  const Problem& p = data.problem;
  std::vector<char> hidden(static_cast<std::size_t>(p.seq_q * p.seq_k));
  for (std::int64_t i = 0; i < p.seq_q; ++i)
    for (std::int64_t j = 0; j < p.seq_k; ++j) hidden[static_cast<std::size_t>(i * p.seq_k + j)] = !reference_visible(data, b, h, i, j);
  return hidden;
}

void check_indices(const Problem& p, std::int64_t b, std::int64_t h) {
  if (b < 0 || b >= p.batch) throw InputError(fmt::format("--batch {} is outside [0, {})", b, p.batch));
  if (h < 0 || h >= p.heads_q) throw InputError(fmt::format("--head {} is outside [0, {})", h, p.heads_q));
}
}  // namespace

WeightsView reference_weights_view(const CaseData& data, std::int64_t b, std::int64_t h) {
  check_indices(data.problem, b, h);
  return {data.problem.seq_q, data.problem.seq_k, reference_weights(data, b, h), hidden_of(data, b, h)};
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
  if (ok) ok = backend.supports(identity.problem);
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

std::string format_weights_table(const WeightsView& view) {
  std::string out = "       ";
  for (std::int64_t j = 0; j < view.keys; ++j) out += fmt::format(" {:>6}", fmt::format("k{}", j));
  out += "\n";
  for (std::int64_t i = 0; i < view.queries; ++i) {
    out += fmt::format("{:<7}", fmt::format("q{}", i));
    for (std::int64_t j = 0; j < view.keys; ++j) {
      const auto e = static_cast<std::size_t>(i * view.keys + j);
      out += view.hidden[e] ? fmt::format(" {:>6}", "-") : fmt::format(" {:>6.3f}", view.weights[e]);
    }
    out += "\n";
  }
  return out;
}

}  // namespace attn
