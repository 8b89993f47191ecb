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
// `lift` > 0: P times 2^lift, every row done exactly (a rescue pass's
// weights, GradientPass). Returns whether the row holds a weight (lifted)
// below 2^-126 (a bfloat16 dot product, which treats subnormal inputs as 0,
// must not be fed it).
bool probabilities_from_lse(const Kernels& kernels, float* s, std::int64_t n, float hi, float lo, int lift = 0);
void split_lse2(double lse, float& hi, float& lo);  // natural-log lse -> log2 units, hi + lo

// Every gradient is linear in dO: when a pass's float32 sums overflow (V near
// float32's largest, the true gradients finite), the backwards redo it with
// dO scaled by 2^-dout_shift, so dP = dO V^T and D = dO . O fit. With
// weight_lift = dout_shift, P is scaled up by as much (exact: a power of two
// of weights at most 1), so dS = P (dP - D), dV = P^T dO and everything
// summed from them keep their true size: a weight e^-80 times dO stays out of
// float32's subnormals, where scaling the results back would multiply their
// lost bits (dV off by 3e-4 relative, fuzz seed 4 case 1810). Only when a
// true dS or its sums overflow too is weight_lift 0 and every result scaled
// back by 2^dout_shift.
struct GradientPass {
  int dout_shift = 0;
  int weight_lift = 0;
  int result_shift() const { return dout_shift - weight_lift; }  // of what is summed from lifted P
};

// The rescue passes' shifts from the largest |dO|, |V|, |Q|, |K| in the
// views (read only when a pass overflowed): |dP| and |D| are at most a =
// max|dO| max|V| head_dim_v and sum_j |dS_ij| at most 2a, so |dQ| <= 2a scale
// max|K|, |dK| <= 2a scale max|Q| rows, |dV| <= max|dO| rows. `scores`: the
// smallest under which dP and D fit; `all`: under which nothing can overflow.
struct GradientShifts {
  int scores = 0, all = 0;
};
GradientShifts gradient_overflow_shifts(const Problem& p, const BackwardIO& io);
// The same from one (batch entry, kv head)'s own rows and keys: a backward
// that declares batch invariance rescues each such unit on its own data, so
// an entry's gradients do not follow what else is in the batch.
GradientShifts gradient_overflow_shifts(const Problem& p, const BackwardIO& io, std::int64_t b, std::int64_t kv_head);

// The next pass of a unit that overflowed in `pass`: dO down and P up by the
// scores' shift, or (from there, or when that lift would be too large) every
// result scaled back; false when `pass` was already that last one.
bool next_gradient_pass(GradientPass& pass, const GradientShifts& shifts);

// Runs `pass(GradientPass) -> bool overflowed` as is, then, when it
// overflowed, with dO down and P up by the scores' shift, then, when that
// overflowed too, with every result scaled back.
template <class Pass>
void run_gradient_passes(const Problem& p, const BackwardIO& io, Pass&& pass) {
  GradientPass current;
  if (!pass(current)) return;
  const GradientShifts shifts = gradient_overflow_shifts(p, io);
  while (next_gradient_pass(current, shifts) && pass(current)) {
  }
}

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
