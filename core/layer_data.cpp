#include "core/layer_data.hpp"

namespace attn {

std::vector<double> split_heads(const std::vector<double>& x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                                std::int64_t dim) {
  std::vector<double> out(x.size());
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t s = 0; s < seq; ++s)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t d = 0; d < dim; ++d) {
          out[static_cast<std::size_t>(((b * heads + h) * seq + s) * dim + d)] =
              x[static_cast<std::size_t>(((b * seq + s) * heads + h) * dim + d)];
        }
  return out;
}

std::vector<double> merge_heads(const std::vector<double>& x, std::int64_t batch, std::int64_t heads, std::int64_t seq,
                                std::int64_t dim) {
  std::vector<double> out(x.size());
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t s = 0; s < seq; ++s)
        for (std::int64_t d = 0; d < dim; ++d) {
          out[static_cast<std::size_t>(((b * seq + s) * heads + h) * dim + d)] =
              x[static_cast<std::size_t>(((b * heads + h) * seq + s) * dim + d)];
        }
  return out;
}

std::vector<LayerGradientPart> layer_gradient_parts(const LayerData& l, bool bias_requires_grad) {
  const Problem& p = l.problem;
  const std::int64_t m = l.model_dim, mk = l.k_in(), mv = l.v_in();
  using G = LayerGradients;
  return {
      {"dx_q", {p.batch, p.seq_q, m}, {p.batch, 1, p.seq_q, m}, &G::dx_q, true},
      {"dx_k", {p.batch, p.seq_k, mk}, {p.batch, 1, p.seq_k, mk}, &G::dx_k, true},
      {"dx_v", {p.batch, p.seq_k, mv}, {p.batch, 1, p.seq_k, mv}, &G::dx_v, true},
      {"dw_q", {m, l.q_width()}, {1, 1, m, l.q_width()}, &G::dw_q, true},
      {"dw_k", {mk, l.k_width()}, {1, 1, mk, l.k_width()}, &G::dw_k, true},
      {"dw_v", {mv, l.v_width()}, {1, 1, mv, l.v_width()}, &G::dw_v, true},
      {"dw_o", {l.o_width(), m}, {1, 1, l.o_width(), m}, &G::dw_o, true},
      {"db_q", {l.q_width()}, {1, 1, 1, l.q_width()}, &G::db_q, !l.b_q.empty()},
      {"db_k", {l.k_width()}, {1, 1, 1, l.k_width()}, &G::db_k, !l.b_k.empty()},
      {"db_v", {l.v_width()}, {1, 1, 1, l.v_width()}, &G::db_v, !l.b_v.empty()},
      {"db_o", {m}, {1, 1, 1, m}, &G::db_o, !l.b_o.empty()},
      {"dbias", {p.bias.batch, p.bias.heads, p.bias.rows, p.seq_k}, {p.bias.batch, p.bias.heads, p.bias.rows, p.seq_k},
       &G::dbias, bias_requires_grad && p.bias.present},
      {"dsinks", {p.heads_q}, {1, 1, 1, p.heads_q}, &G::dsinks, p.sinks},
  };
}

std::vector<double> transposed(const std::vector<double>& a, std::int64_t rows, std::int64_t cols) {
  std::vector<double> t(a.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) t[static_cast<std::size_t>(c * rows + r)] = a[static_cast<std::size_t>(r * cols + c)];
  return t;
}

std::vector<double> layer_attention_dout(const LayerData& l, const std::vector<double>& dout, const MatMul& mm) {
  const Problem& p = l.problem;
  const std::vector<double> merged =
      mm(dout, p.batch * p.seq_q, l.model_dim, transposed(l.w_o, l.o_width(), l.model_dim), l.o_width());
  return split_heads(merged, p.batch, p.seq_q, p.heads_q, p.head_dim_v);
}

LayerGradients layer_gradients(const LayerData& l, const std::vector<double>& dout, const std::vector<double>& attention_out,
                               const std::vector<double>& dq, const std::vector<double>& dk, const std::vector<double>& dv,
                               std::vector<double> dbias, std::vector<double> dsinks, const MatMul& mm) {
  const Problem& p = l.problem;
  const std::int64_t m = l.model_dim;
  LayerGradients g;
  // One projection x [rows, in] @ w [in, width] (+ b): its three gradients
  // from d (the projection's gradient, [rows, width]).
  auto through = [&](const std::vector<double>& x, std::int64_t rows, std::int64_t in, const std::vector<double>& w,
                     std::int64_t width, const std::vector<double>& d, bool has_bias, std::vector<double>& dx,
                     std::vector<double>& dw, std::vector<double>& db) {
    dw = mm(transposed(x, rows, in), in, rows, d, width);
    if (has_bias) db = mm(std::vector<double>(static_cast<std::size_t>(rows), 1.0), 1, rows, d, width);
    dx = mm(d, rows, width, transposed(w, in, width), in);
  };
  const std::int64_t q_rows = p.batch * p.seq_q, k_rows = p.batch * p.seq_k;
  // The output projection: its input is the attention's output, merged.
  const std::vector<double> o = merge_heads(attention_out, p.batch, p.heads_q, p.seq_q, p.head_dim_v);
  g.dw_o = mm(transposed(o, q_rows, l.o_width()), l.o_width(), q_rows, dout, m);
  if (!l.b_o.empty()) g.db_o = mm(std::vector<double>(static_cast<std::size_t>(q_rows), 1.0), 1, q_rows, dout, m);
  through(l.x_q, q_rows, m, l.w_q, l.q_width(), merge_heads(dq, p.batch, p.heads_q, p.seq_q, p.head_dim), !l.b_q.empty(),
          g.dx_q, g.dw_q, g.db_q);
  through(l.x_k, k_rows, l.k_in(), l.w_k, l.k_width(), merge_heads(dk, p.batch, p.heads_kv, p.seq_k, p.head_dim), !l.b_k.empty(),
          g.dx_k, g.dw_k, g.db_k);
  through(l.x_v, k_rows, l.v_in(), l.w_v, l.v_width(), merge_heads(dv, p.batch, p.heads_kv, p.seq_k, p.head_dim_v), !l.b_v.empty(),
          g.dx_v, g.dw_v, g.db_v);
  g.dbias = std::move(dbias);
  g.dsinks = std::move(dsinks);
  return g;
}

}  // namespace attn
