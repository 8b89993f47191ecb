// The float64 reference against cases worked out independently, and every
// masking rule of the format.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/detmath.hpp"
#include "attnbench/error.hpp"
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

// Format version 2 (docs/format/v2.md), each addition on a case small
// enough to work out by hand. With q = k = 0 every score is 0 (plus ALiBi), so
// out is the mean of the visible v, or the ALiBi/sink weighting written below.

TEST(ReferenceV2, WindowsAreMeasuredFromTheAlignmentsDiagonal) {
  CaseData data = make_case("dtype=f64,b=1,hq=1,hkv=1,sq=3,sk=3,d=1,dv=1,align=top_left,wl=0,wr=0");
  data.v = {1, 2, 4};
  ReferenceResult r = reference_attention(data);
  EXPECT_EQ(r.out, (std::vector<double>{1, 2, 4}));  // each row sees its own key only
  EXPECT_EQ(r.lse, (std::vector<double>{0, 0, 0}));
  data.problem.window_left = 1;  // row i sees i - 1 and i
  r = reference_attention(data);
  EXPECT_EQ(r.out, (std::vector<double>{1, 1.5, 3}));
  EXPECT_DOUBLE_EQ(r.lse[1], std::log(2.0));
  // seq_q 2 < seq_k 3, bottom_right: row i's diagonal is key i + 1.
  data = make_case("dtype=f64,b=1,hq=1,hkv=1,sq=2,sk=3,d=1,dv=1,align=bottom_right,wl=0,wr=0");
  data.v = {1, 2, 4};
  EXPECT_EQ(reference_attention(data).out, (std::vector<double>{2, 4}));
  // Right of the diagonal only (wl = 0, wr = 1), top_left, seq_q 3 > seq_k 2:
  // row 2's diagonal is past the last key, so it sees nothing.
  data = make_case("dtype=f64,b=1,hq=1,hkv=1,sq=3,sk=2,d=1,dv=1,align=top_left,wl=0,wr=1");
  data.v = {1, 2};
  r = reference_attention(data);
  EXPECT_EQ(r.out, (std::vector<double>{1.5, 2, 0}));
  EXPECT_EQ(r.lse[2], kNegInf);
  // Causal with a window: the causal rule bounds the right side.
  data = make_case("dtype=f64,b=1,hq=1,hkv=1,sq=3,sk=3,d=1,dv=1,causal=top_left,wl=1,wr=5");
  data.v = {1, 2, 4};
  EXPECT_EQ(reference_attention(data).out, (std::vector<double>{1, 1.5, 3}));
}

TEST(ReferenceV2, SoftcapComesAfterTheScaleAndBeforeTheBias) {
  // q = 1, k = [10, 0], scale 0.5: scaled scores 5 and 0; cap 1: tanh(5) and 0.
  CaseData data = make_case("dtype=f64,b=1,hq=1,hkv=1,sq=1,sk=2,d=1,dv=1,scale=0.5,softcap=1");
  data.q = {1};
  data.k = {10, 0};
  data.v = {1, 0};
  const double t = std::tanh(5.0);
  ReferenceResult r = reference_attention(data);
  EXPECT_NEAR(r.out[0], std::exp(t) / (std::exp(t) + 1), 1e-15);
  EXPECT_NEAR(r.lse[0], std::log(std::exp(t) + 1), 1e-15);
  // A bias is added to the capped score, not capped itself: bias 3 on key 0.
  data.problem.bias = BroadcastShape{true, 1, 1, 1};
  data.bias = {3, 0};
  r = reference_attention(data);
  EXPECT_NEAR(r.out[0], std::exp(t + 3) / (std::exp(t + 3) + 1), 1e-15);
  // -inf stays -inf: the key stays hidden (a cap after the mask would make it -1).
  data.bias = {0, kNegInf};
  r = reference_attention(data);
  EXPECT_EQ(r.out[0], 1.0);
  EXPECT_NEAR(r.lse[0], t, 1e-15);
}

TEST(ReferenceV2, AlibiPenalisesDistanceFromTheDiagonalPerHead) {
  // One query, three keys, scores 0; slopes 1 (head 0) and 0.5 (head 1).
  CaseData data = make_case("dtype=f64,b=1,hq=2,hkv=1,sq=1,sk=3,d=1,dv=1,align=bottom_right,alibi");
  data.alibi_slopes = {1, 0.5};
  data.v = {1, 0, 0};
  ReferenceResult r = reference_attention(data);
  // bottom_right: the diagonal is key 2, so biases -2, -1, 0 (head 0).
  const double z0 = std::exp(-2.0) + std::exp(-1.0) + 1, z1 = std::exp(-1.0) + std::exp(-0.5) + 1;
  EXPECT_NEAR(r.out[0], std::exp(-2.0) / z0, 1e-15);
  EXPECT_NEAR(r.out[1], std::exp(-1.0) / z1, 1e-15);  // GQA: both heads read kv head 0, each its own slope
  EXPECT_NEAR(r.lse[0], std::log(z0), 1e-15);
  // top_left: the diagonal is key 0, so biases 0, -1, -2.
  data.problem.align = Align::top_left;
  r = reference_attention(data);
  EXPECT_NEAR(r.out[0], 1 / z0, 1e-15);
}

TEST(ReferenceV2, SinksJoinTheDenominatorAndGiveTheirLogitToEmptyRows) {
  CaseData data = make_case("dtype=f64,b=1,hq=1,hkv=1,sq=2,sk=1,d=1,dv=1,causal=bottom_right,sinks");
  // sk 1 < sq 2, bottom_right: row 0 sees nothing, row 1 sees key 0.
  data.sinks = {1.0};  // exact in float32, as the format asks
  data.v = {8};
  ReferenceResult r = reference_attention(data);
  EXPECT_EQ(r.out[0], 0.0);
  EXPECT_EQ(r.lse[0], 1.0);                           // the sink, not -inf
  EXPECT_NEAR(r.out[1], 8.0 / (1 + std::exp(1.0)), 1e-15);  // weight e^0 / (e^0 + e^1)
  EXPECT_NEAR(r.lse[1], std::log(1 + std::exp(1.0)), 1e-15);
  data.sinks = {0.1};  // not a float32
  EXPECT_THROW(data.validate_shapes(), InputError);
}

TEST(ReferenceV2, PackedSequencesSeeOnlyTheirOwnKeys) {
  // Entries: q 2 and k 1; q 1 and k 0; q 0 and k 2; then a tail of one
  // query and one key. Scores 0, so out is the mean of the entry's v.
  CaseData data = make_case("dtype=f64,b=3,hq=1,hkv=1,sq=4,sk=4,d=1,dv=1,ragged");
  data.cu_seqlens_q = {0, 2, 3, 3};
  data.cu_seqlens_k = {0, 1, 1, 3};
  data.v = {5, 7, 9, 1000};
  ReferenceResult r = reference_attention(data);
  EXPECT_EQ(r.out, (std::vector<double>{5, 5, 0, 0}));  // entry 0, entry 1 (no keys), the tail row
  EXPECT_EQ(r.lse[2], kNegInf);
  EXPECT_EQ(r.lse[3], kNegInf);
  // Causal bottom_right per entry: entry 0 (q 2, k 1) row 0 has diagonal -1.
  data.problem.causal = Causal::bottom_right;
  data.problem.align = Align::bottom_right;
  r = reference_attention(data);
  EXPECT_EQ(r.out[0], 0.0);
  EXPECT_EQ(r.out[1], 5.0);
  EXPECT_NO_THROW(data.validate_shapes());
  data.cu_seqlens_k = {0, 2, 1, 3};
  EXPECT_THROW(data.validate_shapes(), InputError);  // offsets must not decrease
}

TEST(ReferenceV2, PagesAreReadThroughTheTableUpToSeqLens) {
  // Pages of one key in a pool of 3; the entry's table is [2, 0].
  CaseData data = make_case("dtype=f64,b=1,hq=1,hkv=1,sq=1,sk=2,d=1,dv=1,paged=1x3");
  data.page_table = {2, 0};
  data.seq_lens = {2};
  data.v = {10, 20, 30};
  EXPECT_EQ(reference_attention(data).out[0], 20.0);  // keys 30 and 10
  data.seq_lens = {1};
  EXPECT_EQ(reference_attention(data).out[0], 30.0);
  data.page_table = {2, -1};  // a slot past seq_lens is never read
  EXPECT_EQ(reference_attention(data).out[0], 30.0);
  data.page_table = {3, -1};
  EXPECT_THROW(data.validate_shapes(), InputError);  // a used page outside the pool
}

TEST(ReferenceV2, DeterministicTanhAgreesWithTheCLibrary) {
  for (double x = -30; x <= 30; x += 0.0137) {
    EXPECT_NEAR(detmath::tanh(x), std::tanh(x), 4e-16 * std::max(1.0, std::fabs(std::tanh(x)))) << x;
  }
  for (double x : {1e-300, 1e-8, 0.2499, 0.25, 0.2501}) EXPECT_NEAR(detmath::tanh(x) / std::tanh(x), 1.0, 4e-16) << x;
}
