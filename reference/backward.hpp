// The truth of the backward pass: every gradient of attention in float64
// (docs/format/v3.md), from the forward truth of reference/reference.hpp, with
// the first-order error magnitudes the tolerance policy turns into bounds.
#pragma once

#include <cstdint>
#include <vector>

#include "core/case_data.hpp"
#include "reference/reference.hpp"

namespace attn {

// Gradients of L = sum(dout * out) with respect to every trainable input.
struct ReferenceGradients {
  std::vector<double> dq;      // shape of q
  std::vector<double> dk, dv;  // shapes of k and v
  std::vector<double> dbias;   // the bias's stored (broadcast) shape, reduced over broadcast axes; empty unless asked
  std::vector<double> dsinks;  // [heads_q]; empty without sinks
};

// The precision of a plain implementation the error magnitudes describe: u
// rounds inputs, P, dS and results to the case's dtype; u_acc is that of its
// dot products and sums (float32 for the 16-bit types).
struct GradientPrecision {
  double u = 0, u_acc = 0;
  double f_min = 0;  // the dtype's subnormal spacing: O rounded to the dtype may be off by that, absolutely
};

// Per gradient element, the first-order error of a plain same-precision
// backward (P recomputed from the scores, dP = dO V^T, D = rowsum(dO o O),
// dS = P (dP - D), then the three products): roundings of every sum with
// root-n growth, the score error moving P, the forward's error of O inside D,
// and the cancellation in dP - D measured on |dP| + |D| rather than on the
// difference. Same shapes as ReferenceGradients.
struct GradientErrors {
  std::vector<double> dq, dk, dv, dbias, dsinks;
  // Per element, the sum of the |terms| summed into it, each dS term taken
  // at P (|dP| + |D|), the size dP and D are rounded at before they cancel:
  // what a plain implementation rounds at (the measured bound's floor).
  ReferenceGradients magnitude;
};

// dout has the shape of out. `forward` and `stats` are reference_attention's
// for the same data (with stats). Throws InputError for a paged case: the
// format defines no backward through a page table.
ReferenceGradients reference_backward(const CaseData& data, const std::vector<double>& dout, const ReferenceResult& forward,
                                      const ReferenceStats& stats, bool bias_gradient,
                                      const GradientPrecision* precision = nullptr, GradientErrors* errors = nullptr);

}  // namespace attn
