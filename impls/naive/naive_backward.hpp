// naive's backward pass (format version 3): the textbook analytic gradient,
// P materialised per row and recomputed from the scores, D from the forward's
// own output. naive.cpp's prepare_backward makes it.
#pragma once

#include <memory>

#include "attnbench/backend.hpp"

namespace attn {

std::unique_ptr<BackwardPlan> make_naive_backward_plan(const Problem& problem, const BackwardIO& io);

}  // namespace attn
