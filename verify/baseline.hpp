// The measured half of the tolerance policy: a plain implementation of the
// case in its own precision, whose error against the float64 reference says
// how accurate a careful same-precision backend can be on this very data.
// A backend may be at most `k` times worse (verify/tolerance.hpp).
//
// Definition (README, "Tolerance policy"): inputs as stored (exact in dtype),
// arithmetic in float32 (float64 for float64 cases), every operation rounded
// to nearest even, sums left to right:
//   s_j  = fl(fl(scale) * dot(q, k_j)) + bias_j      dot: products then sums in order
//   m    = max over visible j of s_j
//   e_j  = fl(exp(s_j - m))                          exp correctly rounded (detmath)
//   l    = sum_j e_j                                 (unrounded weights)
//   o_d  = sum_j fl(dtype(e_j) * v_jd)               P rounded to dtype before P V
//   out  = dtype(fl(o_d / l))                        rounded to nearest even
// Deterministic to the bit on every machine and for every thread count.
#pragma once

#include <vector>

#include "core/case_data.hpp"
#include "core/layer_data.hpp"

namespace attn {

// out [batch, heads_q, seq_q, head_dim_v] as doubles (each exact in dtype).
std::vector<double> baseline_attention(const CaseData& data, int threads = 0);

// A layer's y with the verifier's own projections (verify/layer.hpp) around
// the baseline attention.
std::vector<double> baseline_layer(const LayerData& layer, int threads = 0);

}  // namespace attn
