#include "verify/layer.hpp"

#include "core/extensions.hpp"
#include "verify/run_case.hpp"

namespace attn {

std::vector<double> project_in_dtype(const std::vector<double>& x, std::int64_t rows, std::int64_t inner,
                                     const std::vector<double>& w, std::int64_t cols, const std::vector<double>& bias,
                                     DType dtype) {
  std::vector<double> out(static_cast<std::size_t>(rows * cols));
  std::vector<double> xr(x.size()), wr(w.size());
  for (std::size_t e = 0; e < x.size(); ++e) xr[e] = round_to_dtype(x[e], dtype);
  for (std::size_t e = 0; e < w.size(); ++e) wr[e] = round_to_dtype(w[e], dtype);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const double b = bias.empty() ? 0.0 : round_to_dtype(bias[static_cast<std::size_t>(c)], dtype);
      double value;
      if (dtype == DType::f64) {
        double acc = 0;
        for (std::int64_t k = 0; k < inner; ++k) acc += xr[static_cast<std::size_t>(r * inner + k)] * wr[static_cast<std::size_t>(k * cols + c)];
        value = acc + b;
      } else {
        float acc = 0;
        for (std::int64_t k = 0; k < inner; ++k) {
          acc += static_cast<float>(xr[static_cast<std::size_t>(r * inner + k)]) * static_cast<float>(wr[static_cast<std::size_t>(k * cols + c)]);
        }
        value = static_cast<double>(acc + static_cast<float>(b));
      }
      out[static_cast<std::size_t>(r * cols + c)] = round_to_dtype(value, dtype);
    }
  return out;
}

CaseData layer_attention_inputs(const LayerData& layer) {
  const Problem& p = layer.problem;
  const std::int64_t m = layer.model_dim;
  CaseData data = layer.masking;
  data.problem = p;
  for (double& x : data.bias) x = round_to_dtype(x, p.dtype);
  data.q = split_heads(project_in_dtype(layer.x_q, p.batch * p.seq_q, m, layer.w_q, layer.q_width(), layer.b_q, p.dtype),
                       p.batch, p.seq_q, p.heads_q, p.head_dim);
  data.k = split_heads(project_in_dtype(layer.x_k, p.batch * p.seq_k, layer.k_in(), layer.w_k, layer.k_width(), layer.b_k, p.dtype),
                       p.batch, p.seq_k, p.heads_kv, p.head_dim);
  data.v = split_heads(project_in_dtype(layer.x_v, p.batch * p.seq_k, layer.v_in(), layer.w_v, layer.v_width(), layer.b_v, p.dtype),
                       p.batch, p.seq_k, p.heads_kv, p.head_dim_v);
  return data;
}

LayerRun run_layer(const Backend& backend, const LayerData& layer, const RunOptions& options) {
  const Problem& p = layer.problem;
  const CaseData inputs = layer_attention_inputs(layer);
  BackendRun attention = run_backend(backend, inputs, options);
  LayerRun run;
  // A declared convention is checked on the attention rows, before the output
  // projection mixes them.
  const std::vector<Convention> conventions = conventions_of(backend, p);
  if (!conventions.empty()) run.conventions = apply_conventions(conventions, inputs, attention.out, nullptr);
  std::vector<double> merged = merge_heads(attention.out, p.batch, p.heads_q, p.seq_q, p.head_dim_v);
  run.y = project_in_dtype(merged, p.batch * p.seq_q, layer.o_width(), layer.w_o, layer.model_dim, layer.b_o, p.dtype);
  run.guard_damage = attention.guard_damage;
  return run;
}

}  // namespace attn
