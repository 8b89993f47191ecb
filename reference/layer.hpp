// The float64 truth for a whole multi-head attention layer: projections with
// compensated sums and no intermediate rounding, the reference attention on
// the exact Q, K, V, and the output projection.
#pragma once

#include "core/layer_data.hpp"
#include "reference/backward.hpp"
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

// The float64 gradients of a layer case (docs/format/v3.md, "Layers"): the
// attention's upstream gradient dout @ w_o^T, the attention's gradients on
// the exact Q, K, V, and every layer gradient through the projections, each
// product with compensated sums.
struct LayerBackwardReference {
  std::vector<double> attention_dout;  // [batch, heads_q, seq_q, head_dim_v]
  ReferenceGradients attention;        // on reference.attention
  LayerGradients value;
};
// Throws InputError where the attention's backward is not defined.
LayerBackwardReference reference_layer_backward(const LayerData& layer, const LayerReference& reference,
                                                const std::vector<double>& dout, bool bias_gradient,
                                                BackwardObserver* observer = nullptr);
// The exact products the layer's reference uses (no bias): a MatMul.
std::vector<double> reference_matmul(const std::vector<double>& a, std::int64_t rows, std::int64_t inner,
                                     const std::vector<double>& b, std::int64_t cols);

// The attention weights of (batch b, query head h) of the layer: [seq_q, seq_k].
std::vector<double> reference_layer_weights(const LayerData& layer, std::int64_t b, std::int64_t h);

}  // namespace attn
