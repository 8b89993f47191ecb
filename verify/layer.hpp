// Running a whole multi-head attention layer around any SDPA backend: the
// projections by one shared GEMM in the case's dtype with float32
// accumulation (float64 for float64 cases), the attention by the backend.
#pragma once

#include <string>
#include <vector>

#include "attnbench/backend.hpp"
#include "core/layer_data.hpp"
#include "verify/conventions.hpp"

namespace attn {

// out = round(x @ w + bias) with x, w, bias rounded to dtype first.
std::vector<double> project_in_dtype(const std::vector<double>& x, std::int64_t rows, std::int64_t inner,
                                     const std::vector<double>& w, std::int64_t cols, const std::vector<double>& bias,
                                     DType dtype);

// The attention inputs the backend sees: projections rounded to dtype, split into heads.
CaseData layer_attention_inputs(const LayerData& layer);

struct LayerRun {
  std::vector<double> y;     // [batch, seq_q, model_dim]
  std::string guard_damage;  // from the attention call
  ConventionOutcome conventions;  // the backend's declared conventions, applied to the attention output
};

LayerRun run_layer(const Backend& backend, const LayerData& layer, const RunOptions& options);

}  // namespace attn
