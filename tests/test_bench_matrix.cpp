// The benchmark matrix and its counters.
#include <gtest/gtest.h>

#include <set>

#include "bench/matrix.hpp"
#include "bench/runner.hpp"
#include "core/case_data.hpp"
#include "core/registry.hpp"
#include "attnbench/error.hpp"

using namespace attn;

TEST(BenchMatrix, PresetsCoverTheIssuesMatrix) {
  auto standard = bench::benchmark_problems("standard");
  auto full = bench::benchmark_problems("full");
  EXPECT_LT(bench::benchmark_problems("quick").size(), standard.size());
  EXPECT_LT(standard.size(), full.size());
  std::set<std::int64_t> seqs, heads, dims;
  std::set<DType> dtypes;
  bool causal = false, gqa = false, decode_64k = false;
  for (const Problem& p : full) {
    seqs.insert(p.seq_q);
    heads.insert(p.heads_q);
    dims.insert(p.head_dim);
    dtypes.insert(p.dtype);
    causal = causal || p.causal == Causal::bottom_right;
    gqa = gqa || p.heads_q == 8 * p.heads_kv;
    decode_64k = decode_64k || (p.seq_q == 1 && p.seq_k == 65536);
    EXPECT_EQ(Problem::parse(p.to_string()), p);  // names round-trip
  }
  for (std::int64_t s : {512, 1024, 2048, 4096, 8192, 16384}) EXPECT_TRUE(seqs.count(s)) << s;
  EXPECT_TRUE(heads.count(8) && heads.count(16));
  EXPECT_TRUE(dims.count(64) && dims.count(128));
  EXPECT_EQ(dtypes.size(), 3u);
  EXPECT_TRUE(causal && gqa && decode_64k);
  EXPECT_THROW(bench::benchmark_problems("huge"), Error);
}

// The training preset: backward shapes of seq 1k to 8k, 8 to 32 heads,
// head_dim 64 and 128, causal and not, GQA, float32 and bfloat16, each one
// the streaming backend's backward takes; timed backward by default, every
// other preset forward.
TEST(BenchMatrix, TheTrainingPresetTimesBackwardShapes) {
  const auto training = bench::benchmark_problems("training");
  ASSERT_FALSE(training.empty());
  std::set<std::int64_t> dims;
  std::set<DType> dtypes;
  bool causal = false, dense = false, gqa = false, seq_1k = false, seq_8k = false;
  const auto backends = make_backends(std::vector<std::string>{"streaming"});
  ASSERT_EQ(backends.size(), 1u);
  for (const Problem& p : training) {
    EXPECT_EQ(p.seq_q, p.seq_k) << p.to_string();
    EXPECT_TRUE(p.seq_q >= 1024 && p.seq_q <= 8192) << p.to_string();
    EXPECT_TRUE(p.heads_q >= 8 && p.heads_q <= 32) << p.to_string();
    EXPECT_TRUE(backend_accepts(*backends[0], p, Direction::backward)) << p.to_string();
    dims.insert(p.head_dim);
    dtypes.insert(p.dtype);
    causal = causal || p.causal == Causal::bottom_right;
    dense = dense || p.causal == Causal::none;
    gqa = gqa || p.heads_q > p.heads_kv;
    seq_1k = seq_1k || p.seq_q == 1024;
    seq_8k = seq_8k || p.seq_q == 8192;
  }
  EXPECT_EQ(dims, (std::set<std::int64_t>{64, 128}));
  EXPECT_EQ(dtypes, (std::set<DType>{DType::f32, DType::bf16}));
  EXPECT_TRUE(causal && dense && gqa && seq_1k && seq_8k);
  EXPECT_EQ(bench::preset_directions("training"), std::vector<bench::Direction>{bench::Direction::backward});
  for (const char* preset : {"quick", "standard", "full", "gpu"}) {
    EXPECT_EQ(bench::preset_directions(preset), std::vector<bench::Direction>{bench::Direction::forward}) << preset;
  }
}

TEST(BenchMatrix, UsefulFlopsCountOnlyVisiblePairs) {
  Problem p = Problem::parse("dtype=f32,b=2,hq=4,hkv=1,sq=3,sk=5,d=8,dv=4");
  EXPECT_DOUBLE_EQ(bench::useful_flops(p), 2.0 * (8 + 4) * 2 * 4 * 15);
  p.causal = Causal::top_left;  // 1 + 2 + 3 visible pairs
  EXPECT_DOUBLE_EQ(bench::useful_flops(p), 2.0 * (8 + 4) * 2 * 4 * 6);
  EXPECT_DOUBLE_EQ(bench::kv_bytes(p), 4.0 * (2 * 1 * 5 * 8 + 2 * 1 * 5 * 4));
}

TEST(BenchMatrix, Version2CasesCountTheirOwnPairs) {
  // A window of 1 to the left, causal: each query sees itself and one key before it.
  Problem p = Problem::parse("dtype=f32,b=1,hq=2,hkv=2,sq=4,sk=4,d=8,causal=top_left,wl=1");
  EXPECT_DOUBLE_EQ(bench::useful_flops(p), 2.0 * 16 * 2 * (1 + 2 + 2 + 2));
  EXPECT_DOUBLE_EQ(bench::dense_flops(p), 2.0 * 16 * 2 * 16);
  // Packed: 6 sequences sharing 16 tokens as 1, 3, 0, 2, 5, 1 (of 12): lengths 1, 4, 0, 2, 6, 1 after rounding down.
  p = Problem::parse("dtype=f32,b=6,hq=1,hkv=1,sq=16,sk=16,d=8,ragged");
  const bench::Sequences s = bench::benchmark_sequences(p);
  EXPECT_EQ(s.cu_seqlens_q, (std::vector<std::int64_t>{0, 1, 5, 5, 8, 14, 16}));
  double pairs = 0;
  for (std::size_t e = 0; e + 1 < s.cu_seqlens_q.size(); ++e) {
    const double n = static_cast<double>(s.cu_seqlens_q[e + 1] - s.cu_seqlens_q[e]);
    pairs += n * n;
  }
  EXPECT_DOUBLE_EQ(bench::useful_flops(p), 2.0 * 16 * pairs);  // not 16 x 16: no pair across sequences
  // Paged: every entry's keys only, and the table names distinct pages of the pool.
  p = Problem::parse("dtype=bf16,b=3,hq=4,hkv=1,sq=1,sk=64,d=16,paged=16x13");
  const bench::Sequences pages = bench::benchmark_sequences(p);
  ASSERT_EQ(pages.seq_lens.size(), 3u);
  double keys = 0;
  for (std::int64_t n : pages.seq_lens) keys += static_cast<double>(n);
  EXPECT_DOUBLE_EQ(bench::useful_flops(p), 2.0 * 32 * 4 * keys);
  EXPECT_DOUBLE_EQ(bench::kv_bytes(p), keys * 32 * 2);
  CaseData data;
  data.problem = p;
  data.page_table = pages.page_table;
  data.seq_lens = pages.seq_lens;
  data.q.assign(static_cast<std::size_t>(p.q_elements()), 0.0);
  data.k.assign(static_cast<std::size_t>(p.k_elements()), 0.0);
  data.v.assign(static_cast<std::size_t>(p.v_elements()), 0.0);
  EXPECT_NO_THROW(data.validate());
  // The quick preset has one of each, and the paged decode from an fp8 and a Q8_0 cache.
  int window = 0, packed = 0, paged = 0, quantised = 0;
  for (const Problem& q : bench::benchmark_problems("quick")) {
    window += q.has_window();
    packed += q.ragged;
    paged += q.paged() && !q.quantised();
    quantised += q.paged() && q.quantised();
  }
  EXPECT_EQ(window, 1);
  EXPECT_EQ(packed, 1);
  EXPECT_EQ(paged, 1);
  EXPECT_EQ(quantised, 2);
}

// A quantised cache moves the bytes of its codes: fp8 half of bfloat16's, Q8_0
// 34 bytes per 32 elements, int8 per token its codes and a float32 scale.
TEST(BenchMatrix, QuantisedDecodeCountsTheBytesItsCacheMoves) {
  const std::string base = "dtype=bf16,b=8,hq=32,hkv=8,sq=1,sk=4096,d=128,causal=bottom_right,paged=16x2049";
  const double bf16 = bench::kv_bytes(Problem::parse(base));
  EXPECT_DOUBLE_EQ(bench::kv_bytes(Problem::parse(base + ",kenc=e4m3,kdescale=head,venc=e4m3,vdescale=head")), bf16 / 2);
  EXPECT_DOUBLE_EQ(bench::kv_bytes(Problem::parse(base + ",kenc=q8_0,venc=q8_0")), bf16 / 2 * 34 / 32);
  EXPECT_DOUBLE_EQ(bench::kv_bytes(Problem::parse(base + ",kenc=s8,kscale=2049x8x16x1,venc=s8,vscale=2049x8x16x1")),
                   bf16 / 2 * (128 + 4) / 128);
}
