// The float64 truth for a whole multi-head attention layer: projections with
// compensated sums and no intermediate rounding, the reference attention on
// the exact Q, K, V, and the output projection.
#pragma once

#include "core/layer_data.hpp"
#include "reference/reference.hpp"

namespace attn {

struct LayerReference {
  CaseData attention;       // exact Q, K, V as [batch, heads, seq, dim], with the layer's masking
  ReferenceResult result;   // exact O and lse
  ReferenceStats stats;     // of the attention, for the tolerance
  std::vector<double> y;    // [batch, seq_q, model_dim]
};

// out[r][c] = sum_k x[r][k] w[k][c] + bias[c], compensated; bias may be empty.
std::vector<double> reference_projection(const std::vector<double>& x, std::int64_t rows, std::int64_t inner,
                                         const std::vector<double>& w, std::int64_t cols,
                                         const std::vector<double>& bias);

LayerReference reference_layer(const LayerData& layer);

// The attention weights of (batch b, query head h) of the layer: [seq_q, seq_k].
std::vector<double> reference_layer_weights(const LayerData& layer, std::int64_t b, std::int64_t h);

}  // namespace attn
