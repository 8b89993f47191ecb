// Batch invariance (docs/verification/invariance.md): a request's output
// must not depend on what else is in the batch. Each entry of a case is run
// again alone, in the batch reversed, among up to 64 entries with shorter and
// longer neighbours, packed instead of dense and paged at other pages; every
// run must give its entries the bits the case's own run gave them.
// INVARIANT (bitwise everywhere) or VARIES with the largest difference in
// units of the a-priori bound; a backend that declares batch_invariant FAILs
// on any variation, naming the run.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "attnbench/backend.hpp"
#include "core/case_data.hpp"
#include "verify/compare.hpp"
#include "verify/run_case.hpp"
#include "verify/tolerance.hpp"

namespace attn {

// One batch entry of a case, whatever its arrangement: its queries and keys
// (canonical [heads, len, dim]), the keys it may see (kv_len) and its mask
// and bias rows over its own keys.
struct BatchEntry {
  std::int64_t q_len = 0, k_len = 0, limit = 0;
  std::vector<double> q, k, v;   // [heads_q, q_len, d], [heads_kv, k_len, d], [heads_kv, k_len, dv]
  std::vector<std::uint8_t> mask;  // [heads_q, q_len, k_len], empty without one
  std::vector<double> bias;        // [heads_q, q_len, k_len], empty without one
  bool operator==(const BatchEntry&) const = default;
};

// The entries of a case (dense, packed or paged; not quantised).
std::vector<BatchEntry> batch_entries(const CaseData& data);

enum class Arrangement { dense, packed, paged };
std::string_view arrangement_name(Arrangement arrangement);

// One run of the check: a case built from entries, and which of its entries
// are entries of the original case (-1: a neighbour, not compared).
struct InvarianceRun {
  std::string what;  // "alone (entry 2)", "batch of 64", "packed", "paged at other pages", ...
  CaseData data;
  Arrangement arrangement = Arrangement::dense;
  std::vector<std::int64_t> source;  // per entry of data: the original entry it copies, or -1
};

// A case of the given arrangement holding `entries` (with the original
// case's heads, dims, dtype, scale and version 2 settings), or a reason why
// that arrangement cannot hold them (a mask in a packed batch, ...).
struct Assembled {
  std::optional<CaseData> data;
  std::string why_not;
};
Assembled assemble(const CaseData& original, const std::vector<BatchEntry>& entries, Arrangement arrangement,
                   std::int64_t page_size = 16, std::uint64_t seed = 1);

// The runs of the check for a case, within `element_budget` elements of
// q, k and v each (0: no limit). Quantised cases and layers have none.
std::vector<InvarianceRun> invariance_runs(const CaseData& data, std::int64_t element_budget);

// Runs the backend on each run it accepts and compares every entry's rows
// with its run on the case itself (`own`, called once, only when a run is
// accepted); PASS naming the runs (INVARIANT), DIFFERS (VARIES, the largest
// difference in units of the relations' bound, verify/relations.hpp) or,
// when it declares batch_invariant, FAIL; SKIP when it accepts none of them.
Comparison judge_batch_invariance(const Backend& backend, const CaseData& data, const std::vector<InvarianceRun>& runs,
                                  const RunOptions& options, const std::function<const BackendRun&()>& own);

}  // namespace attn
