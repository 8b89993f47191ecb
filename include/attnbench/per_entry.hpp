// Packed (ragged) batches run as one dense problem per batch entry, each on
// views into the packed tensors: no padding and no copies of q, k, v or out.
// A backend whose kernels take dense problems answers a ragged one with
// `plan_per_entry(problem, io, options, *this)` from its prepare().
#pragma once

#include <memory>

#include "attnbench/backend.hpp"

namespace attn {

// The dense problem of entry e of a packed one: batch 1, its own lengths.
Problem entry_problem(const Problem& packed, std::int64_t q_len, std::int64_t k_len);

// Sub-plans prepared here (not timed); run() runs them one after the other
// and writes the rows past the last sequence (out 0, lse the sink or -inf).
// Dropout (AttentionIO::dropout) is refused (attn::Unsupported): an entry's
// dense problem would draw its mask at its own coordinates.
std::unique_ptr<Plan> plan_per_entry(const Problem& problem, const AttentionIO& io, const RunOptions& options,
                                     const Backend& dense);

// The backward pass of a packed problem the same way, with the dense
// backend's prepare_backward per entry; the entries' dsinks are summed in
// entry order (deterministic), and whatever no entry owns gets zero gradients.
std::unique_ptr<BackwardPlan> plan_backward_per_entry(const Problem& problem, const BackwardIO& io,
                                                      const RunOptions& options, const Backend& dense);

}  // namespace attn
