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

#include <functional>
#include <memory>

#include "attnbench/backend.hpp"

namespace attn {

// yes, or no with what is out of range and by how much.
Status float32_scores_fit(const Problem& problem, const AttentionIO& io);

// Throws attn::Unsupported with the reason when they do not fit.
void require_float32_scores(const Problem& problem, const AttentionIO& io);

// What a float32 backend's prepare() calls instead of require_float32_scores:
// a case whose values fit goes to `make` as it is. A case beyond float32's
// range whose float32 answer is nevertheless exact goes to `make` as an
// equivalent case that fits, and the plan returned puts the answer back:
//   - a softcap so large that no score of the case reaches 2^-13 of it (the
//     scores are bounded by scale |q| |k|) is the identity: no cap;
//   - a softcap below float32's normal range makes every score 0 (forward
//     only: the backward's slope is 1 exactly where a score is 0, which
//     float32 products cannot decide; refused there);
//   - a sink more than 128 above every score the case can make (the bound of
//     the product, the cap, ALiBi and the bias) takes all the weight: it runs
//     at that distance (out 0; every weight of a key rounds to 0 in float32)
//     and lse is the sink; one more than 128 below them takes none: it runs
//     at that distance, and a row with no visible key gets the sink as lse.
// Anything else beyond the range is refused as require_float32_scores does
// (ALiBi slopes beyond it: the float64 reference itself rounds the scores
// away beside penalties of 1e38; docs/verification/tolerance.md).
using PlanMaker = std::function<std::unique_ptr<Plan>(const Problem&, const AttentionIO&)>;
using BackwardPlanMaker = std::function<std::unique_ptr<BackwardPlan>(const Problem&, const BackwardIO&)>;
std::unique_ptr<Plan> prepare_in_float32_range(const Problem& problem, const AttentionIO& io, const PlanMaker& make);
std::unique_ptr<BackwardPlan> prepare_backward_in_float32_range(const Problem& problem, const BackwardIO& io,
                                                                const BackwardPlanMaker& make);

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
