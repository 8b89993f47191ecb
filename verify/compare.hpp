// Comparison of one backend's output with the golden, and the verdict:
// PASS, FAIL, SKIP (with the backend's reason) or MISTRUSTED (matched, but the
// case proved little: most of the golden is within the bound of zero).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "core/tensor.hpp"
#include "verify/tolerance.hpp"

namespace attn {

enum class Verdict { pass, fail, skip, mistrusted };
std::string_view verdict_name(Verdict verdict);
inline std::string_view format_as(Verdict verdict) { return verdict_name(verdict); }

struct Comparison {
  Verdict verdict = Verdict::pass;
  std::string reason;             // why FAIL, SKIP or MISTRUSTED
  double max_abs_error = 0;       // over out
  double max_rel_error = 0;       // over out elements whose golden is non-zero
  double worst_ratio = 0;         // max over out of |error| / bound (inf for a non-finite output)
  double bound_at_worst = 0;
  std::int64_t worst_index = -1;  // flat index into out of the worst element
  Dims4 worst_coords{};           // [b, h, i, d] of that element
  std::optional<double> lse_worst_ratio;  // when the backend returned lse
  double informative_fraction = 0;  // share of out elements with |golden| > bound or held to exactly 0
};

// A result proves little when fewer than this share of its elements could be
// told apart from zero within their bound.
inline constexpr double kMinInformativeFraction = 0.10;

struct CompareInputs {
  const Problem& problem;
  const std::vector<double>& golden_out;
  const std::vector<double>& golden_lse;
  const Bounds& bounds;
  const std::vector<std::int64_t>& visible;  // per row: visible keys (0 = fully masked row)
  const std::vector<double>& got_out;        // canonical [b, h, i, d]
  const std::vector<double>* got_lse;        // nullptr when the backend has none
};

Comparison compare_output(const CompareInputs& in);

}  // namespace attn
