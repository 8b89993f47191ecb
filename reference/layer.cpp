#include "reference/layer.hpp"

#include "reference/compensated_sum.hpp"

#include <cmath>

namespace attn {

namespace {

using Sum = CompensatedSum;

CaseData exact_attention_inputs(const LayerData& layer) {
  const Problem& p = layer.problem;
  const std::int64_t m = layer.model_dim;
  CaseData data = layer.masking;
  data.problem = p;
  data.q = split_heads(reference_projection(layer.x_q, p.batch * p.seq_q, m, layer.w_q, layer.q_width(), layer.b_q),
                       p.batch, p.seq_q, p.heads_q, p.head_dim);
  data.k = split_heads(reference_projection(layer.x_k, p.batch * p.seq_k, layer.k_in(), layer.w_k, layer.k_width(), layer.b_k),
                       p.batch, p.seq_k, p.heads_kv, p.head_dim);
  data.v = split_heads(reference_projection(layer.x_v, p.batch * p.seq_k, layer.v_in(), layer.w_v, layer.v_width(), layer.b_v),
                       p.batch, p.seq_k, p.heads_kv, p.head_dim_v);
  return data;
}

}  // namespace

std::vector<double> reference_projection(const std::vector<double>& x, std::int64_t rows, std::int64_t inner,
                                         const std::vector<double>& w, std::int64_t cols,
                                         const std::vector<double>& bias) {
  std::vector<double> out(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      Sum s;
      for (std::int64_t k = 0; k < inner; ++k) {
        s.add_product(x[static_cast<std::size_t>(r * inner + k)], w[static_cast<std::size_t>(k * cols + c)]);
      }
      if (!bias.empty()) s.add(bias[static_cast<std::size_t>(c)]);
      out[static_cast<std::size_t>(r * cols + c)] = s.value();
    }
  return out;
}

LayerReference reference_layer(const LayerData& layer) {
  const Problem& p = layer.problem;
  LayerReference ref;
  ref.attention = exact_attention_inputs(layer);
  ref.result = reference_attention(ref.attention, &ref.stats);
  std::vector<double> merged = merge_heads(ref.result.out, p.batch, p.heads_q, p.seq_q, p.head_dim_v);
  ref.y = reference_projection(merged, p.batch * p.seq_q, layer.o_width(), layer.w_o, layer.model_dim, layer.b_o);
  return ref;
}

std::vector<double> reference_matmul(const std::vector<double>& a, std::int64_t rows, std::int64_t inner,
                                     const std::vector<double>& b, std::int64_t cols) {
  return reference_projection(a, rows, inner, b, cols, {});
}

LayerBackwardReference reference_layer_backward(const LayerData& layer, const LayerReference& reference,
                                                const std::vector<double>& dout, bool bias_gradient,
                                                BackwardObserver* observer) {
  LayerBackwardReference r;
  r.attention_dout = layer_attention_dout(layer, dout, reference_matmul);
  r.attention = reference_backward(reference.attention, r.attention_dout, reference.result, bias_gradient, observer);
  r.value = layer_gradients(layer, dout, reference.result.out, r.attention.dq, r.attention.dk, r.attention.dv,
                            r.attention.dbias, r.attention.dsinks, reference_matmul);
  return r;
}

std::vector<double> reference_layer_weights(const LayerData& layer, std::int64_t b, std::int64_t h) {
  return reference_weights(exact_attention_inputs(layer), b, h);
}

}  // namespace attn
