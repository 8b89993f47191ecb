// Runs one backend on one case the way the verifier does: inputs converted to
// the case's dtype and layout, the output buffer pre-filled with NaN and
// surrounded by guard bands that must come back untouched.
#pragma once

#include <cstdint>
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
  // With dropout: the mask it reported, [batch, heads_q, seq_q, seq_k]
  // (AttentionIO::dropout), pre-filled with kNotWritten.
  std::vector<std::uint8_t> kept;
  double seconds = 0;                      // prepare + run + read_output
};

// What a dropout mask holds where the backend wrote nothing.
inline constexpr std::uint8_t kNotWritten = 0xA5;
// A mask buffer for the problem, every element kNotWritten.
std::vector<std::uint8_t> unwritten_mask(const Problem& problem);

// Throws whatever the backend throws (the verifier reports it as FAIL).
// `dropout` (active: p > 0) is passed on with a mask buffer of the run's own.
BackendRun run_backend(const Backend& backend, const CaseData& data, const RunOptions& options,
                       const DropoutView& dropout = {});

}  // namespace attn
