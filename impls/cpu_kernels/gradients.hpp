// Pieces every CPU backward shares (the fast one in flash_backward.cpp and
// openblas's GEMM formulation): P from the forward's lse, and the rescue of a
// pass whose float32 sums overflowed.
#pragma once

#include <cstdint>
#include <vector>

#include "attnbench/backend.hpp"

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
// The shift of a dense problem's backward, from the largest |dO|, |V|, |Q|,
// |K| in its views (read only when a pass overflowed).
int gradient_overflow_shift(const Problem& p, const BackwardIO& io);

// Where row (b, h, i)'s keys start in dbias sums kept in the bias's stored
// shape, canonical [bb][bh][bq][seq_k] (a broadcast axis gives index 0).
std::int64_t dbias_row(const Problem& p, std::int64_t b, std::int64_t h, std::int64_t i);

// The gradients' float32 results into their views, times 2^shift (a pass
// whose dO was scaled down). Each returns false when a value is not finite
// (the pass overflowed).
// rows [seq][width] (row stride ld) into (b, h, first..first + seq) of a view:
bool store_rows(const MutableTensorView& view, std::int64_t b, std::int64_t h, std::int64_t first, const float* rows,
                std::int64_t seq, std::int64_t width, std::int64_t ld, int shift);
// the dbias sums (dbias_row's layout) into io.dbias:
bool store_dbias(const Problem& p, const MutableTensorView& dbias, const std::vector<double>& sums, int shift);

}  // namespace attn::cpu
