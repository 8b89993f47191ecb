// Runs one backend on one case the way the verifier does: inputs converted to
// the case's dtype and layout, the output buffer pre-filled with NaN and
// surrounded by guard bands that must come back untouched.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "attnbench/backend.hpp"
#include "core/case_data.hpp"

namespace attn {

struct BackendRun {
  std::vector<double> out;                 // canonical [b, h, i, d], widened from dtype
  std::optional<std::vector<double>> lse;  // when the plan has lse
  std::string guard_damage;                // non-empty when the backend wrote outside `out`
  double seconds = 0;                      // prepare + run + read_output
};

// Throws whatever the backend throws (the verifier reports it as FAIL).
BackendRun run_backend(const Backend& backend, const CaseData& data, const RunOptions& options);

}  // namespace attn
