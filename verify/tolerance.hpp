// The tolerance policy: the one place that decides how far a backend's output
// may be from the float64 golden. See README.md, "Tolerance policy", for the
// derivation; every constant below is explained there and here.
#pragma once

#include <vector>

#include "core/problem.hpp"
#include "fixtures/fixture.hpp"
#include "reference/layer.hpp"
#include "reference/reference.hpp"

namespace attn {

struct ToleranceConstants {
  // How much worse than a plain same-precision implementation a backend may
  // be. FlashAttention's tests allow 2x the error of a plain implementation
  // measured on the same data; our estimate of that error is a typical
  // (root-n) rather than a worst-case one, so we allow 4x more on top.
  static constexpr double safety_factor = 8.0;
};

struct Bounds {
  std::vector<double> out;  // per element of out: |got - golden| must not exceed this
  std::vector<double> lse;  // per row: |got_lse - golden_lse| must not exceed this
  bool from_fixture = false;  // out bounds are the fixture's own atol + rtol |out|
};

// Unit roundoff of the arithmetic a plain implementation accumulates in:
// float64 for float64 cases, float32 for all the others.
double accumulation_roundoff(DType dtype);

Bounds derive_bounds(const FixtureHeader& header, const std::vector<double>& golden_out,
                     const std::vector<double>& golden_lse, const ReferenceStats& stats);

// Bounds for a whole layer's output y [batch, seq_q, model_dim]: the errors of
// the three input projections carried through the attention, the attention's
// own bound, and the output projection. A fixture's atol/rtol replace them.
std::vector<double> derive_layer_bounds(const FixtureHeader& header, const LayerData& layer,
                                        const LayerReference& reference);

}  // namespace attn
