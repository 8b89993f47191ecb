// The backward pass of a whole multi-head attention layer (format version 3
// layer cases, docs/format/v3.md "Layers"): the truth of every gradient, its
// a-priori bound, the measured bound from plain same-precision layer
// backwards, a backend's run (the verifier's projections around the
// backend's attention backward, or the framework's own layer), and the
// judgement, each gradient scored as a tensor (verify/score.hpp).
//
// The a-priori bound (docs/verification/tolerance.md, "Layer gradients") is a
// first-order error propagation through the chain rule:
// - the attention's upstream gradient dout @ w_o^T and the three input
//   projections carry their roundings (projection_error);
// - the attention's gradients carry their own a-priori bound on exact inputs
//   (derive_gradient_bounds) plus what those input errors move: scores by
//   |scale| (e_q . |k| + |q| . e_k), weights P by P (s-move + its mean), O,
//   D = dO . O, dP = dO . V and dS with them, dK, dQ, dV, dbias, dsinks last;
// - each product of the chain C = A @ B (dW = x^T dP, dx = dP w^T, db the
//   column sums) adds |e_A| @ |B| + |A| @ |e_B| (worst case: the carried
//   errors of different rows may share a sign) and its own rounding
//   C (u |C| + sqrt(inner) u_acc |A| @ |B|);
// with the safety factor C = 8 on every rounding term, as for the attention.
#pragma once

#include <string>
#include <vector>

#include "attnbench/backend.hpp"
#include "core/layer_data.hpp"
#include "reference/layer.hpp"
#include "verify/compare.hpp"
#include "verify/score.hpp"
#include "verify/tolerance.hpp"

namespace attn {

struct LayerGradientTruth {
  LayerGradients value;      // reference_layer_backward
  LayerGradients bound;      // the a-priori bound of each element
  LayerGradients magnitude;  // per element: the sum of |terms| of its last product (the measured floor's)
  // In the order of layer_gradient_parts; empty until measured.
  std::vector<MeasuredLimit> measured;
  // Non-empty when a true gradient is beyond the dtype's finite range: no
  // backend can return it, so the backward is SKIP with this reason.
  std::string beyond;
  std::vector<TensorTruth> tensors(const LayerData& layer, bool bias_requires_grad) const;
};

// The truth and a-priori bounds, and the measured bounds from
// baseline_layer_backward_family.
LayerGradientTruth layer_gradient_truth(const LayerData& layer, const LayerReference& reference,
                                        const std::vector<double>& dout, bool bias_gradient);

// The truth as a framework's declared empty_rows_mean_v changes it (Keras'
// MultiHeadAttention gives a query whose keys are all hidden the mean of V):
// that row's O reaches dW_O, its dO / seq_k the dV of every key, and, where
// the hiding is additive, (dP - mean dP) / seq_k dQ and dK (mean_v_terms);
// all carried through the projections, with bounds and measured floors
// widened by the added terms' rounding. `rows` is how many attention rows
// changed (0: the truth as it was).
LayerGradientTruth conventional_layer_truth(const LayerData& layer, const LayerReference& reference,
                                            const std::vector<double>& dout, bool bias_gradient,
                                            const LayerGradientTruth& truth, bool additive, std::int64_t& rows);

// The products of the chain in a dtype: inputs rounded to it, float32
// accumulation (float64 for float64), the result rounded (project_in_dtype).
MatMul dtype_matmul(DType dtype);

// Plain same-precision layer backwards: the projections in the dtype, the
// plain attention forward, each plain attention backward formulation
// (verify/backward_baseline.hpp), the chain in the dtype.
std::vector<LayerGradients> baseline_layer_backward_family(const LayerData& layer, const std::vector<double>& dout,
                                                           bool bias_gradient);

// A backend's layer backward: the framework's own layer where it runs
// layers, else the projections in the dtype around the backend's attention
// forward and backward (run_backward). Throws what the backend throws.
LayerGradients run_layer_backward(const Backend& backend, const LayerData& layer, const std::vector<double>& dout,
                                  bool bias_gradient, const RunOptions& options);

// Every gradient the layer has, scored against the truth; a missing or
// misshapen one fails, naming it.
Comparison judge_layer_backward(const LayerData& layer, bool bias_requires_grad, const LayerGradientTruth& truth,
                                const LayerGradients& got);

}  // namespace attn
