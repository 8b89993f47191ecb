// Attention with dropout under a given mask, in float64: the truth a
// backend's dropout is judged against once its mask is known
// (docs/verification/dropout.md). Weight p_ij becomes p_ij c_ij, c_ij = 0
// where dropped and 1 / (1 - p) where kept; lse is the forward's (dropout
// leaves the softmax's denominator alone). Beside each value, the sum of the
// magnitudes of the terms summed into it (what its rounding scales with).
#pragma once

#include <cstdint>
#include <vector>

#include "core/case_data.hpp"
#include "reference/backward.hpp"
#include "reference/reference.hpp"

namespace attn {

// A mask as a backend reports it: kept[e, h, i, j] over [batch, heads_q,
// seq_q, seq_k] (entry, query head, query and key positions within the
// entry), 1 kept, 0 dropped; read at visible pairs only.
struct DropoutMaskView {
  const std::uint8_t* kept = nullptr;
  double keep_scale = 1;  // 1 / (1 - p)
  std::uint8_t at(const Problem& p, std::int64_t e, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return kept[static_cast<std::size_t>(((e * p.heads_q + h) * p.seq_q + i) * p.seq_k + j)];
  }
};

struct DropoutForwardTruth {
  std::vector<double> out;        // [batch, heads_q, seq_q, head_dim_v]
  std::vector<double> magnitude;  // per element: sum_j p_ij c_ij |v_jd|
};
// `forward` is reference_attention's on the same data (its lse).
DropoutForwardTruth reference_dropout(const CaseData& data, const ReferenceResult& forward, const DropoutMaskView& mask);

struct DropoutGradientTruth {
  ReferenceGradients value;
  ReferenceGradients magnitude;  // per element: the sum of |terms|, each dS at p (c |dP| + |D|)
};
// The gradients of L = sum(dout * out) for the dropout's out (`dropout_out`,
// reference_dropout's), the mask held fixed.
DropoutGradientTruth reference_dropout_backward(const CaseData& data, const std::vector<double>& dout,
                                                const ReferenceResult& forward, const std::vector<double>& dropout_out,
                                                const DropoutMaskView& mask, bool bias_gradient);

}  // namespace attn
