// The benchmark matrix and its counters.
#include <gtest/gtest.h>

#include <set>

#include "bench/matrix.hpp"
#include "core/error.hpp"

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

TEST(BenchMatrix, UsefulFlopsCountOnlyVisiblePairs) {
  Problem p = Problem::parse("dtype=f32,b=2,hq=4,hkv=1,sq=3,sk=5,d=8,dv=4");
  EXPECT_DOUBLE_EQ(bench::useful_flops(p), 2.0 * (8 + 4) * 2 * 4 * 15);
  p.causal = Causal::top_left;  // 1 + 2 + 3 visible pairs
  EXPECT_DOUBLE_EQ(bench::useful_flops(p), 2.0 * (8 + 4) * 2 * 4 * 6);
  EXPECT_DOUBLE_EQ(bench::kv_bytes(p), 4.0 * (2 * 1 * 5 * 8 + 2 * 1 * 5 * 4));
}
