// Attention weights of one (batch, query head) of a case, from the reference
// or from any backend: the backend runs the case with V replaced by the
// identity (head_dim_v = seq_k), so its output rows are its weights.
#pragma once

#include <string>
#include <vector>

#include "attnbench/backend.hpp"
#include "core/case_data.hpp"

namespace attn {

struct WeightsView {
  std::int64_t queries = 0, keys = 0;
  std::vector<double> weights;  // [queries, keys]
  std::vector<char> hidden;     // [queries, keys]: 1 where the key is not visible
};

// `data` holds the attention inputs (for a layer: the projected Q, K, V).
WeightsView reference_weights_view(const CaseData& data, std::int64_t b, std::int64_t h);
// Throws Error with the backend's reason when it cannot run the identity case.
WeightsView backend_weights_view(const Backend& backend, const CaseData& data, std::int64_t b, std::int64_t h,
                                 const RunOptions& options);

// A version 3 case's backward intermediates of one (batch, query head), in
// float64 from the reference: dP = dO V^T, or dS = P (dP - D) with
// D = rowsum(dO o O) (docs/format/v3.md), at the visible keys (0 elsewhere).
enum class GradientMatrix { dp, ds };
WeightsView reference_gradient_view(const CaseData& data, const std::vector<double>& dout, std::int64_t b, std::int64_t h,
                                    GradientMatrix which);

// The table: query rows, key columns, 3 decimals (2 significant digits for
// smaller magnitudes), hidden keys as '-'. With limits (0: none), a longer axis
// shows its first and last indices with '...' between.
std::string format_weights_table(const WeightsView& view, std::int64_t max_queries = 0, std::int64_t max_keys = 0);

}  // namespace attn
