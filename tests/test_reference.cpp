// The float64 reference against cases worked out independently, and every
// masking rule of the format.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "reference/reference.hpp"

using namespace attn;

namespace {

CaseData make_case(const std::string& problem) {
  CaseData data;
  data.problem = Problem::parse(problem);
  const Problem& p = data.problem;
  data.q.assign(static_cast<std::size_t>(p.q_elements()), 0.0);
  data.k.assign(static_cast<std::size_t>(p.k_elements()), 0.0);
  data.v.assign(static_cast<std::size_t>(p.v_elements()), 0.0);
  return data;
}

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

}  // namespace

// seq_q = 2, seq_k = 3, head_dim = 4, worked out by hand:
//   q0 = [1,0,0,0], q1 = [0,1,0,0]; k0 = [1,0,0,0], k1 = [0,1,0,0], k2 = [1,1,0,0]
//   scale = 1 (given as 0.5 with q doubled): scores q0: [1,0,1], q1: [0,1,1]
//   v = [[1,0,0,0],[0,2,0,0],[0,0,4,0]]
//   q0: weights [e, 1, e]/(2e+1) -> out = [e, 2, 4e, 0] / (2e + 1)
//   q1: weights [1, e, e]/(2e+1) -> out = [1, 2e, 4e, 0] / (2e + 1)
TEST(Reference, HandWorked2x3x4) {
  CaseData data = make_case("dtype=f64,b=1,hq=1,hkv=1,sq=2,sk=3,d=4,scale=0.5");
  data.q = {2, 0, 0, 0, 0, 2, 0, 0};
  data.k = {1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0};
  data.v = {1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 4, 0};
  ReferenceResult r = reference_attention(data);
  const double e = std::exp(1.0), z = 2 * e + 1;
  const double expected[] = {e / z, 2 / z, 4 * e / z, 0, 1 / z, 2 * e / z, 4 * e / z, 0};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(r.out[i], expected[i], 1e-15) << i;
  EXPECT_NEAR(r.lse[0], std::log(z), 1e-15);
  EXPECT_NEAR(r.lse[1], std::log(z), 1e-15);
  std::vector<double> w = reference_weights(data, 0, 0);
  EXPECT_NEAR(w[0], e / z, 1e-15);
  EXPECT_NEAR(w[1], 1 / z, 1e-15);
  EXPECT_NEAR(w[5], e / z, 1e-15);
}

TEST(Reference, CausalAlignmentsHideTheRightKeys) {
  // One-dimensional keys with v = key index: out is the weighted mean index.
  // With all scores equal, out[i] = mean of the visible indices.
  CaseData data = make_case("dtype=f64,b=1,hq=1,hkv=1,sq=2,sk=4,d=1,dv=1,causal=top_left");
  data.v = {0, 1, 2, 3};
  ReferenceResult tl = reference_attention(data);
  EXPECT_DOUBLE_EQ(tl.out[0], 0.0);        // sees key 0
  EXPECT_DOUBLE_EQ(tl.out[1], 0.5);        // sees keys 0, 1
  EXPECT_DOUBLE_EQ(tl.lse[1], std::log(2.0));
  data.problem.causal = Causal::bottom_right;  // j <= i + 2
  ReferenceResult br = reference_attention(data);
  EXPECT_DOUBLE_EQ(br.out[0], 1.0);        // keys 0..2
  EXPECT_DOUBLE_EQ(br.out[1], 1.5);        // keys 0..3
}

TEST(Reference, RowsWithoutVisibleKeysAreZeroWithMinusInfinityLse) {
  // seq_q > seq_k with bottom_right: the first rows see nothing.
  CaseData data = make_case("dtype=f32,b=1,hq=1,hkv=1,sq=3,sk=1,d=2,causal=bottom_right");
  data.v = {5, 7};
  ReferenceResult r = reference_attention(data);
  EXPECT_EQ(r.out[0], 0.0);
  EXPECT_EQ(r.out[1], 0.0);
  EXPECT_EQ(r.lse[0], kNegInf);
  EXPECT_EQ(r.lse[1], kNegInf);
  EXPECT_EQ(r.out[4], 5.0);
  EXPECT_EQ(r.out[5], 7.0);
  EXPECT_EQ(r.lse[2], 0.0);  // one key with score 0
}

TEST(Reference, NoKeysAtAll) {
  CaseData data = make_case("dtype=f32,b=1,hq=1,hkv=1,sq=2,sk=0,d=2");
  ReferenceResult r = reference_attention(data);
  for (double x : r.out) EXPECT_EQ(x, 0.0);
  for (double x : r.lse) EXPECT_EQ(x, kNegInf);
}

TEST(Reference, MaskBiasAndKvLenAllHide) {
  CaseData data = make_case("dtype=f64,b=2,hq=1,hkv=1,sq=1,sk=4,d=1,dv=1,mask=1x1x1,bias=2x1x1,kv_len");
  data.v = {1, 10, 100, 1000, 1, 10, 100, 1000};
  data.mask = {1, 0, 1, 1};                    // hides key 1 everywhere
  data.bias = {0, 0, kNegInf, 0, 0, 0, 0, 0};  // hides key 2 in batch 0
  data.kv_len = {4, 3};                        // hides key 3 in batch 1
  ReferenceResult r = reference_attention(data);
  EXPECT_DOUBLE_EQ(r.out[0], (1 + 1000) / 2.0);
  EXPECT_DOUBLE_EQ(r.out[1], (1 + 100) / 2.0);
  EXPECT_TRUE(reference_visible(data, 0, 0, 0, 0));
  EXPECT_FALSE(reference_visible(data, 0, 0, 0, 1));
  EXPECT_FALSE(reference_visible(data, 0, 0, 0, 2));
  EXPECT_FALSE(reference_visible(data, 1, 0, 0, 3));
}

TEST(Reference, BiasShiftsScoresAndGqaMapsHeadsByDivision) {
  // hq = 4, hkv = 2: heads 0, 1 read kv head 0 and heads 2, 3 read kv head 1.
  CaseData data = make_case("dtype=f64,b=1,hq=4,hkv=2,sq=1,sk=2,d=1,dv=1,scale=1,bias=1x1x1");
  data.v = {1, 2, 3, 4};  // kv head 0: keys (1, 2); kv head 1: keys (3, 4)
  data.bias = {0, std::log(3.0)};  // key 1 three times as likely
  ReferenceResult r = reference_attention(data);
  EXPECT_NEAR(r.out[0], (1 + 3 * 2) / 4.0, 1e-15);
  EXPECT_NEAR(r.out[1], (1 + 3 * 2) / 4.0, 1e-15);
  EXPECT_NEAR(r.out[2], (3 + 3 * 4) / 4.0, 1e-15);
  EXPECT_NEAR(r.out[3], (3 + 3 * 4) / 4.0, 1e-15);
}

TEST(Reference, HugeScoresDoNotOverflow) {
  CaseData data = make_case("dtype=f64,b=1,hq=1,hkv=1,sq=1,sk=2,d=1,dv=1,scale=1");
  data.q = {1e4};
  data.k = {1.0, 0.5};  // scores 1e4 and 5e3
  data.v = {2, 3};
  ReferenceResult r = reference_attention(data);
  EXPECT_EQ(r.out[0], 2.0);
  EXPECT_DOUBLE_EQ(r.lse[0], 1e4);
}

TEST(Reference, StatisticsDescribeTheRow) {
  CaseData data = make_case("dtype=f64,b=1,hq=1,hkv=1,sq=1,sk=2,d=1,dv=1,scale=1");
  data.q = {0};
  data.k = {1, 1};
  data.v = {-1, 3};  // equal weights: out = 1
  ReferenceStats stats;
  ReferenceResult r = reference_attention(data, &stats);
  EXPECT_DOUBLE_EQ(r.out[0], 1.0);
  EXPECT_DOUBLE_EQ(stats.weighted_abs_v[0], 2.0);  // (1 + 3) / 2
  EXPECT_DOUBLE_EQ(stats.weighted_dev_v[0], 2.0);  // (2 + 2) / 2
  EXPECT_EQ(stats.visible[0], 2);
}

TEST(Reference, ResultDoesNotDependOnThreads) {
  CaseData data = make_case("dtype=f32,b=1,hq=2,hkv=1,sq=64,sk=300,d=8");
  for (std::size_t i = 0; i < data.q.size(); ++i) data.q[i] = static_cast<double>(static_cast<float>(std::sin(static_cast<double>(i) * 0.37)));
  for (std::size_t i = 0; i < data.k.size(); ++i) data.k[i] = static_cast<double>(static_cast<float>(std::cos(static_cast<double>(i) * 0.11)));
  for (std::size_t i = 0; i < data.v.size(); ++i) data.v[i] = static_cast<double>(static_cast<float>(std::sin(static_cast<double>(i) * 0.05)));
  ReferenceResult one = reference_attention(data, nullptr, 1);
  ReferenceResult two = reference_attention(data, nullptr, 2);
  EXPECT_EQ(one.out, two.out);
  EXPECT_EQ(one.lse, two.lse);
}
