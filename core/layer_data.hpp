// One multi-head attention layer case's inputs (kind = mha in the fixture
// format): the attention problem, model_dim, x_q/x_k/x_v, the projection
// weights and biases, and the masking of the attention inside. Row-major;
// weights multiply from the right (x @ w).
#pragma once

#include <vector>

#include "core/case_data.hpp"

namespace attn {

struct LayerData {
  Problem problem;               // the attention inside the layer
  std::int64_t model_dim = 0;
  std::vector<double> x_q;       // [batch, seq_q, model_dim]
  std::vector<double> x_k, x_v;  // [batch, seq_k, model_dim]
  std::vector<double> w_q;       // [model_dim, heads_q * head_dim]
  std::vector<double> w_k;       // [model_dim, heads_kv * head_dim]
  std::vector<double> w_v;       // [model_dim, heads_kv * head_dim_v]
  std::vector<double> w_o;       // [heads_q * head_dim_v, model_dim]
  std::vector<double> b_q, b_k, b_v, b_o;  // projection widths; empty = zero
  CaseData masking;              // problem + mask, bias, kv_len; q, k, v unused

  std::int64_t q_width() const { return problem.heads_q * problem.head_dim; }
  std::int64_t k_width() const { return problem.heads_kv * problem.head_dim; }
  std::int64_t v_width() const { return problem.heads_kv * problem.head_dim_v; }
  std::int64_t o_width() const { return problem.heads_q * problem.head_dim_v; }
};

// Moves a projection [batch, seq, heads * dim] to [batch, heads, seq, dim] and back.
std::vector<double> split_heads(const std::vector<double>& x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                                std::int64_t dim);
std::vector<double> merge_heads(const std::vector<double>& x, std::int64_t batch, std::int64_t heads, std::int64_t seq,
                                std::int64_t dim);

}  // namespace attn
