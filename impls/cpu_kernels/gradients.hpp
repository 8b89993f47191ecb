// Pieces every CPU backward shares (the fast one in flash_backward.cpp and
// openblas's GEMM formulation): P from the forward's lse, and the rescue of a
// pass whose float32 sums overflowed.
#pragma once

#include <cstdint>

namespace attn::cpu {

struct Kernels;

// P = 2^(s - lse2) over n log2-domain scores (-inf: hidden, P = 0) from the
// forward's lse in log2 units split as hi + lo (split_lse2): s - hi is exact
// near the row's largest scores, so P keeps its bits however large |lse| is;
// a row holding a weight below 2^-126, which the fast exp2 may flush, is done
// exactly (such a P is a gradient term of its own). hi = -inf: P = 0.
// Returns whether the row holds such a weight (a bfloat16 dot product, which
// treats subnormal inputs as 0, must not be fed it).
bool probabilities_from_lse(const Kernels& kernels, float* s, std::int64_t n, float hi, float lo);
void split_lse2(double lse, float& hi, float& lo);  // natural-log lse -> log2 units, hi + lo

// Every gradient is linear in dO: when a pass's float32 sums overflow (V near
// float32's largest, the true gradients finite), the backwards redo it with
// dO scaled by 2^-shift and the results scaled back. The smallest shift under
// which nothing can overflow, from the largest |dO|, |V|, |Q|, |K|: |dP| and
// |D| are at most a = max|dO| max|V| head_dim_v and sum_j |dS_ij| at most 2a,
// so |dQ| <= 2a scale max|K|, |dK| <= 2a scale max|Q| rows, |dV| <= max|dO| rows.
int gradient_overflow_shift(double max_dout, double max_v, double max_q, double max_k, std::int64_t head_dim_v,
                            double scale, double rows);

}  // namespace attn::cpu
