// One multi-head attention layer case's inputs (kind = mha in the fixture
// format): the attention problem, model_dim (and the key's and value's input
// widths where they differ), x_q/x_k/x_v, the projection weights and biases,
// and the masking of the attention inside. Row-major; weights multiply from
// the right (x @ w).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/case_data.hpp"

namespace attn {

struct LayerData {
  Problem problem;               // the attention inside the layer
  std::int64_t model_dim = 0;    // x_q's width and y's
  std::int64_t kdim = 0, vdim = 0;  // x_k's and x_v's widths; 0: model_dim (use k_in(), v_in())
  std::vector<double> x_q;       // [batch, seq_q, model_dim]
  std::vector<double> x_k, x_v;  // [batch, seq_k, k_in()], [batch, seq_k, v_in()]
  std::vector<double> w_q;       // [model_dim, heads_q * head_dim]
  std::vector<double> w_k;       // [k_in(), heads_kv * head_dim]
  std::vector<double> w_v;       // [v_in(), heads_kv * head_dim_v]
  std::vector<double> w_o;       // [heads_q * head_dim_v, model_dim]
  std::vector<double> b_q, b_k, b_v, b_o;  // projection widths; empty = zero
  CaseData masking;              // problem + mask, bias, kv_len; q, k, v unused

  std::int64_t k_in() const { return kdim ? kdim : model_dim; }
  std::int64_t v_in() const { return vdim ? vdim : model_dim; }
  std::int64_t q_width() const { return problem.heads_q * problem.head_dim; }
  std::int64_t k_width() const { return problem.heads_kv * problem.head_dim; }
  std::int64_t v_width() const { return problem.heads_kv * problem.head_dim_v; }
  std::int64_t o_width() const { return problem.heads_q * problem.head_dim_v; }
};

// The gradients of a layer case (format version 3, kind = mha;
// docs/format/v3.md, "Layers"): of L = sum(dout * y) with respect to every
// input and parameter, each in the shape of what it is the gradient of.
struct LayerGradients {
  std::vector<double> dx_q, dx_k, dx_v;        // the inputs' shapes
  std::vector<double> dw_q, dw_k, dw_v, dw_o;  // the weights' shapes
  std::vector<double> db_q, db_k, db_v, db_o;  // the biases' shapes; empty where the layer has none
  std::vector<double> dbias;                   // the attention bias's stored shape, when it requires a gradient
  std::vector<double> dsinks;                  // [heads_q] when the attention has sinks
};

// One layer gradient: its name (the dataset's), its shape in the file, the
// same as a 4-d logical shape for scoring, and whether this layer has it.
struct LayerGradientPart {
  const char* name;
  std::vector<std::int64_t> file_shape;
  Dims4 shape;
  std::vector<double> LayerGradients::*values;
  bool present;
};
// Every gradient the format names, in file order; `bias_requires_grad` and
// the layer's biases and sinks say which are present.
std::vector<LayerGradientPart> layer_gradient_parts(const LayerData& layer, bool bias_requires_grad);

// a [rows, inner] @ b [inner, cols], row-major, as the caller computes it:
// exactly (the reference) or in a dtype (what a plain backend does).
using MatMul = std::function<std::vector<double>(const std::vector<double>& a, std::int64_t rows, std::int64_t inner,
                                                 const std::vector<double>& b, std::int64_t cols)>;
std::vector<double> transposed(const std::vector<double>& a, std::int64_t rows, std::int64_t cols);

// The chain rule around the attention inside a layer. First the attention's
// upstream gradient, dout @ w_o^T split into heads [batch, heads_q, seq_q,
// head_dim_v]; then, from the attention's output (the same shape) and its
// gradients (dq, dk, dv split into heads; dbias and dsinks passed through),
// every gradient of the layer: dw = x^T @ d(projection), db = the column sums
// of d(projection), dx = d(projection) @ w^T.
std::vector<double> layer_attention_dout(const LayerData& layer, const std::vector<double>& dout, const MatMul& mm);
LayerGradients layer_gradients(const LayerData& layer, const std::vector<double>& dout,
                               const std::vector<double>& attention_out, const std::vector<double>& dq,
                               const std::vector<double>& dk, const std::vector<double>& dv, std::vector<double> dbias,
                               std::vector<double> dsinks, const MatMul& mm);

// Moves a projection [batch, seq, heads * dim] to [batch, heads, seq, dim] and back.
std::vector<double> split_heads(const std::vector<double>& x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                                std::int64_t dim);
std::vector<double> merge_heads(const std::vector<double>& x, std::int64_t batch, std::int64_t heads, std::int64_t seq,
                                std::int64_t dim);

}  // namespace attn
