// The truth of the backward pass: every gradient of attention in float64
// (docs/format/v3.md), from the forward truth of reference/reference.hpp.
// It computes truth only; what an error model needs (verify/tolerance.hpp,
// "Gradients") it reports as facts, row by row, to an observer.
#pragma once

#include <cstddef>
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

// One visible key of a row, as the truth computes it.
struct BackwardKey {
  std::int64_t j = 0;           // its position within the row's entry
  const double* k = nullptr;    // its row of K (head_dim values)
  std::size_t k_at = 0, v_at = 0;  // where that row starts in CaseData::k and ::v (dK and dV index alike)
  std::size_t bias_at = 0;      // its element of dbias, when the bias needs a gradient
  double p = 0;                 // its weight exp(s - lse)
  double abs_dp = 0;            // sum_d |dO_d V_jd|: what dP_j = dO . V_j is summed from
  double gap = 0;               // dP_j - D
  double ds = 0;                // dS_j = p (dP_j - D), the score's gradient
  double tanh = 0;              // tanh of the scaled product over the softcap (0 without one)
};

// One row (b, h, i) that sees at least one key. Valid during the call only.
struct BackwardRow {
  std::int64_t b = 0, h = 0, i = 0, row = 0;  // row: the flat index (b * heads_q + h) * seq_q + i
  const double* q = nullptr;     // its query (head_dim)
  const double* o = nullptr;     // its forward output (head_dim_v)
  const double* dout = nullptr;  // its upstream gradient (head_dim_v)
  double lse = 0;
  double D = 0;                  // dO . O: the weighted mean of dP over the row's keys
  double abs_delta = 0;          // sum_d |dO_d O_d|
  double p_sink = 0;             // the sink's weight exp(sink - lse); 0 without sinks
  const std::vector<BackwardKey>* keys = nullptr;  // its visible keys
};

class BackwardObserver {
 public:
  virtual ~BackwardObserver() = default;
  virtual void row(const BackwardRow& row) = 0;
};

// dout has the shape of out; `forward` is reference_attention's for the same
// data. Each row with a visible key is reported to `observer` when given.
// Throws InputError for a case whose backward the format does not define (backward_defined).
ReferenceGradients reference_backward(const CaseData& data, const std::vector<double>& dout, const ReferenceResult& forward,
                                      bool bias_gradient, BackwardObserver* observer = nullptr);

}  // namespace attn
