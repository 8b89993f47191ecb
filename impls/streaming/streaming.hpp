// The streaming backend: FlashAttention-2 on the CPU. Query tiles (all query
// heads of a kv head together) meet 64-key blocks of K and V; an online
// softmax with lazy rescaling keeps one running max, sum and output per row,
// so memory stays O(seq) however long the sequence. Fully hidden causal blocks
// are skipped; decode shapes split the keys across threads and merge the
// partial results by their log-sum-exp.
#pragma once

#include <memory>
#include <string>

#include "core/backend.hpp"

namespace attn {

// Planted bugs for the verifier's tests; the real backend has none.
struct StreamingFlaws {
  bool no_rescale = false;           // forgets to rescale O and l when the max grows
  bool drop_last_partial_block = false;  // skips the last key block when it is not full
  bool unweighted_split_merge = false;   // merges split-K partials without their lse weights
  bool causal_skip_one_more = false;     // skips one key block too many under causal
};

std::unique_ptr<Backend> make_streaming_backend();
std::unique_ptr<Backend> make_flawed_streaming_backend(std::string name, const StreamingFlaws& flaws);

}  // namespace attn
