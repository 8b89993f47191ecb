// The problem descriptor: canonical strings round-trip, validation names the rule.
#include <gtest/gtest.h>

#include <cmath>

#include "attnbench/error.hpp"
#include "attnbench/problem.hpp"
#include "attnbench/tensor.hpp"

using namespace attn;

namespace {
std::string error_of(std::string_view text) {
  try {
    Problem::parse(text);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Problem, CanonicalStringsRoundTrip) {
  const char* cases[] = {
      "dtype=f16,b=2,hq=4,hkv=2,sq=17,sk=33,d=64,dv=64,scale=0.125",
      "dtype=bf16,b=1,hq=8,hkv=1,sq=1,sk=65536,d=128,dv=128,scale=0.08838834764831845,causal=bottom_right",
      "dtype=f64,b=3,hq=2,hkv=2,sq=5,sk=0,d=8,dv=4,scale=0.3,causal=top_left,mask=1x2x5,bias=3x1x1,kv_len,layout=bshd",
  };
  for (const char* text : cases) {
    Problem p = Problem::parse(text);
    EXPECT_EQ(p.to_string(), text);
    EXPECT_EQ(Problem::parse(p.to_string()), p);
  }
}

TEST(Problem, ParseFillsDefaultsAndAcceptsAnyOrder) {
  Problem p = Problem::parse("sk=33,d=64,hkv=1,hq=4,b=1,sq=7,dtype=float32,mask=1x1x7");
  EXPECT_EQ(p.head_dim_v, 64);
  EXPECT_DOUBLE_EQ(p.scale, 0.125);
  EXPECT_EQ(p.dtype, DType::f32);
  EXPECT_TRUE(p.mask.present);
  EXPECT_EQ(p.mask.rows, 7);
  EXPECT_EQ(p.to_string(), "dtype=f32,b=1,hq=4,hkv=1,sq=7,sk=33,d=64,dv=64,scale=0.125,mask=1x1x7");
}

TEST(Problem, ScaleSurvivesTheRoundTripBitForBit) {
  Problem p = Problem::parse("dtype=f32,b=1,hq=1,hkv=1,sq=1,sk=1,d=3");
  EXPECT_EQ(p.scale, 1.0 / std::sqrt(3.0));
  EXPECT_EQ(Problem::parse(p.to_string()).scale, p.scale);
}

TEST(Problem, ValidationNamesTheBrokenRule) {
  EXPECT_NE(error_of("dtype=f32,b=1,hq=6,hkv=4,sq=1,sk=1,d=8").find("heads_q=6 is not a multiple of heads_kv=4"), std::string::npos);
  EXPECT_NE(error_of("dtype=f32,b=0,hq=1,hkv=1,sq=1,sk=1,d=8").find("batch is 0"), std::string::npos);
  EXPECT_NE(error_of("dtype=f32,b=1,hq=1,hkv=1,sq=-3,sk=1,d=8").find("seq_q is -3"), std::string::npos);
  EXPECT_NE(error_of("dtype=f32,b=1,hq=1,hkv=1,sq=1,sk=-1,d=8").find("seq_k is -1"), std::string::npos);
  EXPECT_NE(error_of("dtype=f32,b=1,hq=1,hkv=1,sq=1,sk=1,d=0").find("head_dim is 0"), std::string::npos);
  EXPECT_NE(error_of("dtype=f32,b=1,hq=1,hkv=1,sq=1,sk=1,d=8,scale=inf").find("scale is inf"), std::string::npos);
  EXPECT_NE(error_of("dtype=f32,b=1,hq=1,hkv=1,sq=1,sk=1,d=8,scale=nan").find("scale is nan"), std::string::npos);
  EXPECT_NE(error_of("dtype=f32,b=1000000,hq=1000000,hkv=1,sq=1000000,sk=1000000,d=64").find("overflows"),
            std::string::npos);
  EXPECT_NE(error_of("dtype=f32,b=1,hq=1,hkv=1,sq=100000000000,sk=1,d=100000000").find("q"), std::string::npos);
  EXPECT_NE(error_of("dtype=f32,b=2,hq=1,hkv=1,sq=4,sk=1,d=8,mask=3x1x1").find("mask batch dimension is 3"), std::string::npos);
  EXPECT_NE(error_of("dtype=f32,b=2,hq=2,hkv=1,sq=4,sk=1,d=8,bias=1x1x2").find("bias query dimension is 2"), std::string::npos);
  EXPECT_NE(error_of("dtype=f8,b=1,hq=1,hkv=1,sq=1,sk=1,d=8").find("dtype='f8'"), std::string::npos);
  EXPECT_NE(error_of("dtype=f32,b=1,hq=1,hkv=1,sq=1,sk=1,d=8,colour=red").find("unknown field 'colour'"), std::string::npos);
  EXPECT_NE(error_of("dtype=f32,b=1,hq=1,hkv=1,sq=1,d=8").find("missing sk="), std::string::npos);
  EXPECT_NE(error_of("dtype=f32,b=1,hq=1,hkv=1,sq=x,sk=1,d=8").find("sq='x' is not an integer"), std::string::npos);
  EXPECT_NE(error_of("dtype=f32,b=1,b=1,hq=1,hkv=1,sq=1,sk=1,d=8").find("given twice"), std::string::npos);
  EXPECT_NE(error_of("dtype=f32,b=1,hq=1,hkv=1,sq=1,sk=1,d=8,causal=diagonal").find("causal='diagonal'"), std::string::npos);
  EXPECT_NE(error_of("dtype=f32,b=1,hq=1,hkv=1,sq=1,sk=1,d=8,mask=1x1").find("BATCHxHEADSxROWS"), std::string::npos);
}

TEST(Problem, CausalVisibilityFollowsTheFormat) {
  Problem p = Problem::parse("dtype=f32,b=1,hq=1,hkv=1,sq=3,sk=5,d=8,causal=top_left");
  EXPECT_TRUE(p.causal_visible(0, 0));
  EXPECT_FALSE(p.causal_visible(0, 1));
  EXPECT_EQ(p.causal_visible_pairs(), 1 + 2 + 3);
  p.causal = Causal::bottom_right;  // j <= i + 2
  EXPECT_TRUE(p.causal_visible(0, 2));
  EXPECT_FALSE(p.causal_visible(0, 3));
  EXPECT_EQ(p.causal_visible_pairs(), 3 + 4 + 5);
  Problem tall = Problem::parse("dtype=f32,b=1,hq=1,hkv=1,sq=5,sk=3,d=8,causal=bottom_right");  // j <= i - 2
  EXPECT_FALSE(tall.causal_visible(1, 0));
  EXPECT_TRUE(tall.causal_visible(2, 0));
  EXPECT_EQ(tall.causal_visible_pairs(), 0 + 0 + 1 + 2 + 3);
}

TEST(TensorView, LayoutStridesDescribeBothLayouts) {
  Dims4 shape{2, 3, 5, 7};
  EXPECT_EQ(layout_strides(shape, Layout::bhsd), (Dims4{105, 35, 7, 1}));
  EXPECT_EQ(layout_strides(shape, Layout::bshd), (Dims4{105, 7, 21, 1}));  // [b, s, h, d] storage
  BroadcastShape mask{true, 1, 3, 1};
  EXPECT_EQ(broadcast_strides(mask, 4), (Dims4{0, 4, 0, 1}));
  TensorView view{nullptr, DType::f32, shape, layout_strides(shape, Layout::bshd)};
  EXPECT_EQ(view.extent(), 210);
}

TEST(Problem, Version2FieldsRoundTripAndAreValidated) {
  for (const char* text : {"dtype=f32,b=1,hq=2,hkv=1,sq=3,sk=5,d=8,dv=8,scale=0.5,align=top_left,wl=2,wr=0",
                           "dtype=bf16,b=2,hq=4,hkv=2,sq=1,sk=64,d=16,dv=16,scale=0.25,causal=bottom_right,wl=7,softcap=30,"
                           "alibi,sinks,paged=16x9",
                           "dtype=f16,b=3,hq=2,hkv=2,sq=10,sk=12,d=4,dv=4,scale=0.5,causal=top_left,ragged"}) {
    const Problem p = Problem::parse(text);
    EXPECT_EQ(p.to_string(), text);
    EXPECT_EQ(Problem::parse(p.to_string()), p);
  }
  const Problem paged = Problem::parse("dtype=f32,b=2,hq=2,hkv=1,sq=1,sk=64,d=8,paged=16x9");
  EXPECT_EQ(paged.k_elements(), 9 * 1 * 16 * 8);  // the pool, not batch x seq_k
  EXPECT_EQ(paged.pages_per_entry(), 4);
  EXPECT_EQ(paged.features(), unsigned{kFeaturePaged});
  const Problem packed = Problem::parse("dtype=f32,b=3,hq=2,hkv=1,sq=10,sk=12,d=8,ragged");
  EXPECT_EQ(packed.q_elements(), 2 * 10 * 8);  // one packed batch
  EXPECT_EQ(packed.rows(), 20);
  EXPECT_EQ(feature_names(kFeatureWindow | kFeatureSinks), "sliding window, sinks");
  auto error = [](const char* text) {
    try {
      Problem::parse(text);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error("dtype=f32,b=1,hq=1,hkv=1,sq=1,sk=10,d=8,paged=3x4").find("not a multiple of page_size"), std::string::npos);
  EXPECT_NE(error("dtype=f32,b=1,hq=1,hkv=1,sq=1,sk=10,d=8,wl=-2").find("window_left is -2"), std::string::npos);
  EXPECT_NE(error("dtype=f32,b=1,hq=1,hkv=1,sq=1,sk=10,d=8,softcap=-1").find("softcap is -1"), std::string::npos);
  EXPECT_NE(error("dtype=f32,b=1,hq=1,hkv=1,sq=1,sk=10,d=8,ragged,kv_len").find("take no mask, bias or kv_len"), std::string::npos);
  EXPECT_NE(error("dtype=f32,b=1,hq=1,hkv=1,sq=1,sk=10,d=8,causal=top_left,align=bottom_right").find("contradicts"),
            std::string::npos);
  EXPECT_NE(error("dtype=f32,b=1,hq=1,hkv=1,sq=1,sk=10,d=8,alibi=3").find("alibi takes no value"), std::string::npos);
}

TEST(Problem, KeyRangesFollowTheWindowAndStayInsideTheKeys) {
  const Problem p = Problem::parse("dtype=f32,b=1,hq=1,hkv=1,sq=4,sk=3,d=8,align=top_left,wl=1,wr=0");
  for (std::int64_t i = 0; i < 4; ++i) {
    const Problem::KeyRange r = p.key_range(i, 4, 3, 3);
    EXPECT_GE(r.lo, 0);
    EXPECT_LE(r.lo, r.hi);
    EXPECT_LE(r.hi, 3);
  }
  EXPECT_EQ(p.key_range(2, 4, 3, 3).lo, 1);
  EXPECT_EQ(p.key_range(2, 4, 3, 3).hi, 3);
  EXPECT_TRUE(p.key_range(3, 4, 3, 3).empty() == false);  // keys 2 (the window reaches back one)
  EXPECT_TRUE(Problem::parse("dtype=f32,b=1,hq=1,hkv=1,sq=5,sk=2,d=8,causal=bottom_right").key_range(0, 5, 2, 2).empty());
  EXPECT_EQ(p.causal_visible_pairs(), 1 + 2 + 2 + 1);
}
