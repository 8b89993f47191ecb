// The measured half of the gradients' tolerance policy, as verify/baseline.hpp
// is the forward's: plain backward passes of the case in its own precision,
// whose errors against the float64 gradients say how accurate a careful
// same-precision backward can be on this very data. A backend's max and RMS
// error per gradient may be at most k times the least accurate of them
// (docs/verification/tolerance.md, "Gradients").
//
// Inputs as stored (exact in dtype), arithmetic in float32 (float64 for
// float64 cases), every operation rounded to nearest even, R() rounding to the
// dtype. Scores s_j as the forward's natural formulation (scale times the dot
// product, the cap, ALiBi, the bias), m their maximum with the sink.
//
// textbook, an unfused framework's autograd (P materialised in the dtype, the
// softmax's own backward):
//   P_j = R(exp(s_j - m) / l),  dP_j = R(dO . V_j),  D = sum_j P_j dP_j
//   dS_j = R(P_j (dP_j - D)),   dX_j = R(dS_j (1 - t_j^2)) (softcap)
//   dQ = R(scale sum_j dX_j K_j),  dK = R(scale sum_i dX_ij Q_i),  dV = R(sum_i P_ij dO_i)
//   with GQA as repeated kv heads: dK and dV per query head, rounded, then
//   summed over the group in the dtype (the repeat's backward)
// recompute, FlashAttention-2's (P recomputed from the forward's lse, D from
// the forward's output, 16-bit operands of the products):
//   lse = m + log(l),  P_j = exp(s_j - lse),  D = dO . O (O the dtype forward output)
//   dP_j = dO . V_j,  dS_j = P_j (dP_j - D),  dX_j as above, unrounded
//   dQ = R(scale sum_j R(dX_j) K_j),  dK = R(scale sum_i R(dX_ij) Q_i),  dV = R(sum_i R(P_ij) dO_i)
// reversed: recompute with every sum in the opposite order (head dims, keys,
// query rows), a second independent draw of the rounding errors; its scores,
// recomputed in that order, meet the lse of the forward's (in order), as a
// fused backward's score tiles meet the lse its forward kernel wrote: where
// scores are large, their one-ulp differences move P (PyTorch's CPU flash
// backward, float32, scores near 90: dV's RMS error 5.7 times the
// consistent formulations', 1.08 times this one's).
// dbias sums dS (recompute: unrounded) over the broadcast axes and dsinks is
// -sum_i P_sink,i D_i, both in the arithmetic type, then rounded to the dtype.
// Deterministic to the bit on every machine (one thread, fixed orders).
#pragma once

#include <vector>

#include "core/case_data.hpp"
#include "reference/backward.hpp"

namespace attn {

enum class GradientFormulation { textbook, recompute, reversed };
inline constexpr GradientFormulation kGradientFormulations[] = {GradientFormulation::textbook, GradientFormulation::recompute,
                                                                GradientFormulation::reversed};

// `out`: the forward's output in the dtype (a plain forward's, verify/baseline.hpp).
ReferenceGradients baseline_backward(const CaseData& data, const std::vector<double>& dout, const std::vector<double>& out,
                                     bool bias_gradient, GradientFormulation formulation);

// Every formulation's gradients, in the order of kGradientFormulations.
std::vector<ReferenceGradients> baseline_backward_family(const CaseData& data, const std::vector<double>& dout,
                                                         const std::vector<double>& out, bool bias_gradient);

}  // namespace attn
