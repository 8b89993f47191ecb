// The streaming backend: FlashAttention-2 on the CPU. Query tiles (all query
// heads of a kv head together) meet 64-key blocks of K and V; an online
// softmax with lazy rescaling keeps one running max, sum and output per row,
// so memory stays O(seq) however long the sequence. Fully hidden causal blocks
// are skipped; decode shapes split the keys across threads and merge the
// partial results by their log-sum-exp.
#pragma once

#include <memory>

#include "attnbench/backend.hpp"

namespace attn {

std::unique_ptr<Backend> make_streaming_backend();

}  // namespace attn
