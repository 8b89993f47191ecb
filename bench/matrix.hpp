// The benchmark matrix as data: which problems each preset times. A
// benchmark's name is "<backend>/<canonical problem string>", so
// --benchmark_filter can pick one backend and shape.
#pragma once

#include <string>
#include <vector>

#include "core/problem.hpp"

namespace attn::bench {

// quick (about a minute), standard (about ten), full (everything in the matrix).
std::vector<Problem> benchmark_problems(const std::string& preset);

// Useful floating-point operations: 2 (head_dim + head_dim_v) per visible
// (query, key) pair per head; causal counts only visible pairs.
double useful_flops(const Problem& p);
// Bytes of K and V read once (the decode roofline).
double kv_bytes(const Problem& p);

}  // namespace attn::bench
