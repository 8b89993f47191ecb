// Whether a case's values fit computation in float32 scores, for backends
// that compute scores in float32 (in the log2 domain, times log2(e)): the
// softcap, the ALiBi penalties over the case's distances, the sinks and the
// bias must stay far enough inside float32's range that no score, and no sum
// of its terms, overflows; a softcap must be a normal float32. The format
// allows any such value (they are exact in float32 or in the dtype), so a
// backend that cannot take them says so (attn::Unsupported from prepare(),
// which the tools report as SKIP with this reason) rather than compute them
// wrong.
#pragma once

#include "attnbench/backend.hpp"

namespace attn {

// yes, or no with what is out of range and by how much.
Status float32_scores_fit(const Problem& problem, const AttentionIO& io);

// Throws attn::Unsupported with the reason when they do not fit.
void require_float32_scores(const Problem& problem, const AttentionIO& io);

// The memory one case may take, as every tool bounds it before work starts:
// ATTN_MAX_CASE_GIB GiB (default 2). A plan that would hold more scratch than
// this (a page of 2^25 keys makes a row block's scores gigabytes) refuses the
// case: require_workspace throws attn::Unsupported, naming what needs it, so
// the run goes on instead of failing an allocation half way.
// require_workspace also refuses what would not fit in the address space
// this process may still map (address_space_left: ulimit -v less what is
// mapped now; +inf without a limit).
double case_memory_limit_bytes();
double address_space_left();
void require_workspace(double bytes, const char* what);

}  // namespace attn
