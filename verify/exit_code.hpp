// The one rule that turns a verification into a process exit code, for
// `attn verify` (a whole run or one shard) and `attn merge` (the union of the
// shards): 0 = something was verified and nothing failed; 1 = a FAIL, every
// case skipped (unless allowed), or a MISTRUSTED result under
// --fail-on-mistrusted; 2 = an input error, or nothing selected at all.
#pragma once

#include <string>

#include "verify/verifier.hpp"

namespace attn {

struct ExitPolicy {
  bool allow_all_skipped = false;   // --allow-all-skipped
  bool fail_on_mistrusted = false;  // --fail-on-mistrusted
  // One shard of a run: its own failures and input errors decide; whether the
  // whole run verified anything is the merge's verdict.
  bool shard = false;
};

struct ExitDecision {
  int code = 0;
  std::string why;  // for stderr when the code is not 0 for a reason the table does not show; may be empty
};

ExitDecision verification_exit(const VerifySummary& summary, const ExitPolicy& policy);

}  // namespace attn
