// Batch invariance (docs/verification/invariance.md): a request's output
// (and, given dO, its gradients) must not depend on what else is in the
// batch. Each entry of a case is run again alone, in the batch reversed,
// among 63 short entries, among copies with shorter and longer neighbours,
// packed instead of dense and paged at other pages; every run must give its
// entries the bits the case's own run gave them. INVARIANT (bitwise
// everywhere) or VARIES with the largest difference in units of the bound; a
// backend that declares batch_invariant FAILs on any variation, naming the
// run.
#pragma once

#include <array>
#include <functional>
#include <string>
#include <vector>

#include "attnbench/backend.hpp"
#include "core/case_data.hpp"
#include "verify/backward.hpp"
#include "verify/compare.hpp"
#include "verify/run_case.hpp"
#include "verify/tolerance.hpp"

namespace attn {

// A quantised tensor's rows of one entry (format version 4), whatever the
// shape of its scales: each row's codes, scale groups and zero points, and
// the entry's descale per kv head when the descale is per entry.
struct EntryCodes {
  std::vector<std::uint8_t> codes;       // [heads, len, row_bytes]
  std::vector<float> scale;              // [heads, len, groups], empty without a scale
  std::vector<std::int32_t> zero_point;  // likewise, empty without zero points
  std::vector<float> descale;            // [heads_kv], empty unless per (entry, kv head)
  bool operator==(const EntryCodes&) const = default;
};

// One batch entry of a case, whatever its arrangement: its queries and keys
// (canonical [heads, len, dim]), the keys it may see (kv_len), its mask and
// bias rows over its own keys, and the codes of its quantised tensors.
struct BatchEntry {
  std::int64_t q_len = 0, k_len = 0, limit = 0;
  std::vector<double> q, k, v;   // [heads_q, q_len, d], [heads_kv, k_len, d], [heads_kv, k_len, dv]
  std::vector<std::uint8_t> mask;  // [heads_q, q_len, k_len], empty without one
  std::vector<double> bias;        // [heads_q, q_len, k_len], empty without one
  std::vector<double> dout;        // [heads_q, q_len, dv], empty without a backward
  std::array<EntryCodes, 3> codes; // q, k, v: empty where not quantised
  bool operator==(const BatchEntry&) const = default;
};

// The entries of a case (dense, packed or paged, quantised or not), with their
// rows of `dout` (canonical [q_batch, heads_q, seq_q, dv]) when given; the
// first `count` of them (-1: all).
std::vector<BatchEntry> batch_entries(const CaseData& data, const std::vector<double>* dout = nullptr,
                                      std::int64_t count = -1);

enum class Arrangement { dense, packed, paged };
std::string_view arrangement_name(Arrangement arrangement);

// One run of the check: a case built from entries, and which of its entries
// are entries of the original case (-1: a neighbour, not compared).
struct InvarianceRun {
  std::string what;  // "alone (entry 2)", "batch of 64", "packed", "paged at other pages", ...
  CaseData data;
  Arrangement arrangement = Arrangement::dense;
  std::vector<std::int64_t> source;  // per entry of data: the original entry it copies, or -1
  std::vector<double> dout;          // the entries' dO rows, canonical; empty without a backward
};

// A case of the given arrangement holding `entries` (with the original
// case's heads, dims, dtype, scale and version 2 settings), or a reason why
// that arrangement cannot hold them (a mask in a packed batch, per-entry
// scales in a packed batch, ...). A quantised tensor's scales keep the
// original's shape: an axis broadcast there stays broadcast.
struct Assembled {
  std::optional<CaseData> data;
  std::string why_not;
  std::vector<double> dout;  // when every entry has dO rows: the case's, canonical
};
Assembled assemble(const CaseData& original, const std::vector<BatchEntry>& entries, Arrangement arrangement,
                   std::int64_t page_size = 16, std::uint64_t seed = 1);

// The runs of the check for a case, within `element_budget` elements of
// q, k and v each (0: no limit); a case beyond it, or of more than 1024
// entries, runs only its first 16 entries alone. Layers have none. With
// `dout`, each run carries its entries' dO rows too.
std::vector<InvarianceRun> invariance_runs(const CaseData& data, std::int64_t element_budget,
                                           const std::vector<double>* dout = nullptr);

// Runs the backend on each run it accepts and compares every entry's rows
// with its run on the case itself (`own`, called once, only when a run is
// accepted); PASS naming the runs (INVARIANT), DIFFERS (VARIES, the largest
// difference in units of the relations' bound, verify/relations.hpp) or,
// when it declares batch_invariant, FAIL; SKIP when it accepts none of them.
Comparison judge_batch_invariance(const Backend& backend, const CaseData& data, const std::vector<InvarianceRun>& runs,
                                  const RunOptions& options, const std::function<const BackendRun&()>& own);

// The same for the backward: each run's backward from its dO rows (runs the
// backward does not take, paged ones, are left out), dQ of every original
// entry's queries and dK, dV of its keys against the case's own backward
// (`own`, from `dout`). Differences are in units of twice the a-priori
// bound of the gradient (`truth`), as the relations' are. dbias and dsinks,
// sums over the batch, are not compared.
Comparison judge_batch_invariance_backward(const Backend& backend, const CaseData& data,
                                           const std::vector<InvarianceRun>& runs, bool bias_gradient,
                                           const GradientTruth& truth, const RunOptions& options,
                                           const std::function<const BackwardRun&()>& own);

}  // namespace attn
