// The blocked backend: the classic optimised approach. For each tile of query
// rows it materialises the scores against every key (one row block at a time,
// never the whole seq_q x seq_k matrix), takes an exact two-pass softmax, then
// multiplies by V, with the same cache-blocked AVX-512 micro-kernels as the
// streaming backend. Decode tiles (a query's GQA group, at most 8 rows) read
// K and V rows in place, dense or paged, fp8 and ggml codes decoded on load,
// in the same two passes.
#pragma once

#include <memory>

#include "attnbench/backend.hpp"

namespace attn {

std::unique_ptr<Backend> make_blocked_backend();

}  // namespace attn
