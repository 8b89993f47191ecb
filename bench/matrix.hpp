// The benchmark matrix as data: which problems each preset times. A
// benchmark's name is "<backend>/<canonical problem string>", so
// --benchmark_filter can pick one backend and shape.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnbench/problem.hpp"

namespace attn::bench {

// quick (about a minute), standard (about ten), full (everything in the
// issue's matrix), training (backward shapes), gpu.
std::vector<Problem> benchmark_problems(const std::string& preset);

// Useful floating-point operations: 2 (head_dim + head_dim_v) per visible
// (query, key) pair per head: causal, a window, each packed sequence's or
// paged entry's own lengths count only the pairs they leave visible.
double useful_flops(const Problem& p);
// Every (query, key) pair of each entry counted, as tools that ignore causal
// and windows report: the base of the report's dense-equivalent figure.
double dense_flops(const Problem& p);
// Bytes of K and V read once (the decode roofline): a paged entry's keys only.
double kv_bytes(const Problem& p);

// The lengths of a benchmark's packed sequences or paged entries, fixed by the
// problem: packed sequences share seq_q and seq_k in the proportions 1, 3, 0
// (an empty one), 2, 5, 1, 4, 2, ...; paged entries hold seq_k minus a few
// hundred keys each, in pages drawn in a shuffled order from the pool.
struct Sequences {
  std::vector<std::int64_t> cu_seqlens_q, cu_seqlens_k, page_table, seq_lens;
};
Sequences benchmark_sequences(const Problem& p);

}  // namespace attn::bench
