// The float64 backward reference against central finite differences of the
// forward reference, for every feature the format defines gradients for,
// and the rules the format states exactly (hidden keys receive nothing, a row
// with no visible key contributes nothing, paged caches have no backward).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "attnbench/error.hpp"
#include "core/rng.hpp"
#include "fixtures/suite.hpp"
#include "reference/backward.hpp"
#include "reference/reference.hpp"
#include "verify/tolerance.hpp"

using namespace attn;

namespace {

// L = sum(dout * out) of the forward reference.
double loss(const CaseData& data, const std::vector<double>& dout) {
  const ReferenceResult r = reference_attention(data, nullptr, 1);
  double sum = 0;
  for (std::size_t e = 0; e < dout.size(); ++e) sum += dout[e] * r.out[e];
  return sum;
}

struct Checked {
  double worst = 0;  // worst |fd - analytic| / (1e-7 + 1e-5 * |analytic| + 1e-6 * scale)
  int elements = 0;
};

// Compares every element of `analytic` with the central difference of the
// loss in the matching input `values` (skipping -inf, whose gradient must be 0).
Checked finite_differences(CaseData& data, std::vector<double>& values, const std::vector<double>& analytic,
                           const std::vector<double>& dout, const char* what) {
  EXPECT_EQ(values.size(), analytic.size()) << what;
  double scale = 0;
  for (double g : analytic) scale = std::max(scale, std::fabs(g));
  Checked c;
  for (std::size_t e = 0; e < values.size() && e < analytic.size(); ++e) {
    const double x = values[e];
    if (std::isinf(x)) {
      EXPECT_EQ(analytic[e], 0.0) << what << "[" << e << "] sits at -inf and must receive nothing";
      continue;
    }
    // A power of two below |x|'s exponent, so that x +- 2 step stay exact in
    // float32 where x is (sinks are float32 values), and the fourth-order
    // central difference.
    const double step = std::ldexp(1.0, std::ilogb(std::max(1.0, std::fabs(x))) - 12);
    auto at = [&](double y) {
      values[e] = y;
      return loss(data, dout);
    };
    const double fd = (8 * (at(x + step) - at(x - step)) - (at(x + 2 * step) - at(x - 2 * step))) / (12 * step);
    values[e] = x;
    const double tolerance = 1e-7 + 1e-5 * std::fabs(analytic[e]) + 1e-6 * scale;
    const double ratio = std::fabs(fd - analytic[e]) / tolerance;
    EXPECT_LE(ratio, 1.0) << what << "[" << e << "]: finite difference " << fd << ", analytic " << analytic[e];
    c.worst = std::max(c.worst, ratio);
    ++c.elements;
  }
  return c;
}

CaseData inputs(const std::string& name, const std::string& problem, InputRecipe recipe = {}) {
  CaseSpec spec{name, "test", "", problem, recipe};
  return generate_inputs(spec);
}

std::vector<double> upstream(const CaseData& data, std::uint64_t seed) {
  Rng rng = Rng::from_name("dout " + std::to_string(seed));
  std::vector<double> dout(static_cast<std::size_t>(data.problem.out_elements()));
  for (double& x : dout) x = rng.normal();
  return dout;
}

void check_all(CaseData data, bool bias_gradient) {
  const std::vector<double> dout = upstream(data, data.q.size());
  ReferenceStats stats;
  const ReferenceResult fwd = reference_attention(data, &stats, 1);
  const ReferenceGradients g = reference_backward(data, dout, fwd, bias_gradient);
  int checked = 0;
  checked += finite_differences(data, data.q, g.dq, dout, "dq").elements;
  checked += finite_differences(data, data.k, g.dk, dout, "dk").elements;
  checked += finite_differences(data, data.v, g.dv, dout, "dv").elements;
  if (bias_gradient && data.problem.bias.present) checked += finite_differences(data, data.bias, g.dbias, dout, "dbias").elements;
  if (data.problem.sinks) {
    // Sinks are float32 values in the format; the reference reads them as doubles.
    checked += finite_differences(data, data.sinks, g.dsinks, dout, "dsinks").elements;
  }
  EXPECT_GT(checked, 0);
}

}  // namespace

TEST(Backward, MatchesFiniteDifferencesPlain) {
  check_all(inputs("b/plain", "dtype=f64,b=2,hq=2,hkv=2,sq=5,sk=7,d=3,dv=4"), false);
}

TEST(Backward, MatchesFiniteDifferencesGqaCausalBothAlignments) {
  check_all(inputs("b/gqa_br", "dtype=f64,b=1,hq=4,hkv=2,sq=6,sk=4,d=3,causal=bottom_right"), false);
  check_all(inputs("b/mqa_tl", "dtype=f64,b=1,hq=3,hkv=1,sq=4,sk=6,d=2,dv=3,causal=top_left"), false);
}

TEST(Backward, MatchesFiniteDifferencesMaskBiasKvLen) {
  InputRecipe r;
  r.mask = MaskPattern::fully_masked_rows;
  r.bias = BiasPattern::with_neg_inf;
  r.kv_len = {5, 0};
  check_all(inputs("b/masked", "dtype=f64,b=2,hq=2,hkv=1,sq=4,sk=6,d=3,mask=2x1x4,bias=1x2x4,kv_len", r), true);
  InputRecipe broadcast;
  broadcast.bias = BiasPattern::normal;
  check_all(inputs("b/bias_rows", "dtype=f64,b=2,hq=2,hkv=2,sq=3,sk=5,d=2,bias=1x1x1"), true);
}

TEST(Backward, MatchesFiniteDifferencesVersion2) {
  check_all(inputs("b/window", "dtype=f64,b=1,hq=2,hkv=1,sq=7,sk=9,d=3,align=top_left,wl=2,wr=1"), false);
  check_all(inputs("b/softcap", "dtype=f64,b=1,hq=2,hkv=2,sq=4,sk=5,d=3,softcap=1.5",
                   InputRecipe{.q_std = 2, .k_std = 2}), false);
  check_all(inputs("b/alibi", "dtype=f64,b=1,hq=2,hkv=1,sq=4,sk=6,d=2,causal=bottom_right,alibi"), false);
  check_all(inputs("b/sinks", "dtype=f64,b=1,hq=2,hkv=2,sq=4,sk=5,d=3,causal=top_left,sinks"), false);
  InputRecipe packed;
  packed.q_lens = {3, 0, 2};
  packed.k_lens = {2, 3, 0};
  check_all(inputs("b/ragged", "dtype=f64,b=3,hq=2,hkv=1,sq=6,sk=6,d=2,causal=bottom_right,ragged", packed), false);
}

// The exact rules: hidden keys get exactly 0 in dK and dV, a row with no
// visible key exactly 0 in dQ.
TEST(Backward, HiddenKeysAndEmptyRowsReceiveExactlyNothing) {
  InputRecipe r;
  r.kv_len = {3};
  CaseData data = inputs("b/rules", "dtype=f64,b=1,hq=2,hkv=1,sq=4,sk=6,d=2,causal=bottom_right,kv_len", r);
  const std::vector<double> dout = upstream(data, 7);
  ReferenceStats stats;
  const ReferenceResult fwd = reference_attention(data, &stats, 1);
  const ReferenceGradients g = reference_backward(data, dout, fwd, false);
  const Problem& p = data.problem;
  for (std::int64_t j = 3; j < p.seq_k; ++j) {  // beyond kv_len
    for (std::int64_t d = 0; d < p.head_dim; ++d) EXPECT_EQ(g.dk[static_cast<std::size_t>(j * p.head_dim + d)], 0.0) << j;
    for (std::int64_t d = 0; d < p.head_dim_v; ++d) EXPECT_EQ(g.dv[static_cast<std::size_t>(j * p.head_dim_v + d)], 0.0) << j;
  }
  // Bottom-right with 4 queries and 2 keys: rows 0 and 1 see no key.
  CaseData empty = inputs("b/empty", "dtype=f64,b=1,hq=1,hkv=1,sq=4,sk=2,d=2,causal=bottom_right");
  const std::vector<double> dout2 = upstream(empty, 9);
  const ReferenceResult fwd2 = reference_attention(empty, &stats, 1);
  const ReferenceGradients g2 = reference_backward(empty, dout2, fwd2, false);
  for (std::size_t e = 0; e < 4; ++e) EXPECT_EQ(g2.dq[e], 0.0) << e;
  for (double x : g2.dq) EXPECT_TRUE(std::isfinite(x));
  CaseData none = inputs("b/none", "dtype=f64,b=1,hq=1,hkv=1,sq=2,sk=0,d=2");
  const ReferenceResult fwd3 = reference_attention(none, &stats, 1);
  const ReferenceGradients g3 = reference_backward(none, upstream(none, 3), fwd3, false);
  for (double x : g3.dq) EXPECT_EQ(x, 0.0);
}

TEST(Backward, APagedCaseHasNone) {
  InputRecipe r;
  r.seq_lens = {5};
  CaseData data = inputs("b/paged", "dtype=f64,b=1,hq=1,hkv=1,sq=1,sk=8,d=2,paged=4x3", r);
  ReferenceStats stats;
  const ReferenceResult fwd = reference_attention(data, &stats, 1);
  EXPECT_THROW(reference_backward(data, upstream(data, 1), fwd, false), InputError);
}

// The gradients' bounds are finite, non-negative, grow with the dtype's
// roundoff, and come with the truth unchanged.
TEST(Backward, BoundsScaleWithTheRoundoff) {
  CaseData data = inputs("b/errors", "dtype=f64,b=1,hq=2,hkv=1,sq=5,sk=7,d=4,causal=bottom_right,sinks,softcap=3");
  const std::vector<double> dout = upstream(data, 5);
  ReferenceStats stats;
  const ReferenceResult fwd = reference_attention(data, &stats, 1);
  const ReferenceGradients truth = reference_backward(data, dout, fwd, false);
  std::vector<GradientBounds> by_dtype;
  for (DType dtype : {DType::f64, DType::f32, DType::f16}) {
    data.problem.dtype = dtype;  // the same values, judged in a coarser precision
    by_dtype.push_back(derive_gradient_bounds(data, dout, fwd, stats, false));
    EXPECT_EQ(by_dtype.back().value.dq, truth.dq);
    EXPECT_EQ(by_dtype.back().value.dsinks, truth.dsinks);
  }
  for (std::size_t n = 1; n < by_dtype.size(); ++n) {
    const ReferenceGradients& finer = by_dtype[n - 1].bound;
    const ReferenceGradients& coarser = by_dtype[n].bound;
    for (auto [a, b] : {std::pair{&finer.dq, &coarser.dq}, std::pair{&finer.dk, &coarser.dk},
                        std::pair{&finer.dv, &coarser.dv}, std::pair{&finer.dsinks, &coarser.dsinks}}) {
      ASSERT_EQ(a->size(), b->size());
      ASSERT_FALSE(a->empty());
      for (std::size_t e = 0; e < a->size(); ++e) {
        EXPECT_TRUE(std::isfinite((*a)[e]) && (*a)[e] > 0);
        EXPECT_LT((*a)[e], (*b)[e]);
      }
    }
  }
}
