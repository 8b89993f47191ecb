// The four fast CPU backends: they pass every fixture and the external data,
// their micro-kernels agree across instruction sets, results do not depend on
// the thread count beyond the tolerance, and streaming is bitwise
// reproducible at a fixed thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/registry.hpp"
#include "fixtures/fixture.hpp"
#include "impls/cpu_kernels/kernels.hpp"
#include "verify/run_case.hpp"
#include "verify/verifier.hpp"

using namespace attn;
namespace fs = std::filesystem;

namespace {

const fs::path kGolden = fs::path(ATTN_SOURCE_DIR) / "fixtures" / "golden";
const std::vector<std::string> kFast = {"blocked", "streaming", "openblas", "onednn"};

VerifySummary verify_fast(const std::vector<fs::path>& paths, int threads = 0) {
  VerifyOptions options;
  options.run.threads = threads;
  return verify(find_fixture_files(paths), make_backends(kFast), options);
}

void expect_pass_or_f64_skip(const VerifySummary& summary) {
  EXPECT_TRUE(summary.input_errors.empty());
  for (const auto& o : summary.outcomes) {
    if (read_fixture_header(o.file).problem.dtype == DType::f64) {
      EXPECT_EQ(o.comparison.verdict, Verdict::skip) << o.backend << " " << o.fixture;
      EXPECT_NE(o.comparison.reason.find("float64"), std::string::npos);
    } else {
      EXPECT_EQ(o.comparison.verdict, Verdict::pass) << o.backend << " " << o.fixture << ": " << o.comparison.reason;
    }
  }
}

}  // namespace

// Results may depend on the thread count only within the tolerance: every
// fixture passes with two threads, and the thread-sensitive ones with one.
TEST(CpuBackends, PassEveryCommittedFixtureWithTwoThreadsAndOne) {
  VerifySummary two = verify_fast({kGolden}, 2);
  EXPECT_EQ(two.outcomes.size(), 4 * find_fixture_files({kGolden}).size());
  expect_pass_or_f64_skip(two);
  VerifySummary one = verify_fast({kGolden / "mask", kGolden / "decode", kGolden / "causal_bottom_right"}, 1);
  expect_pass_or_f64_skip(one);
}

TEST(CpuBackends, PassTheExternalData) {
  expect_pass_or_f64_skip(verify_fast({fs::path(ATTN_SOURCE_DIR) / "tests" / "data"}));
  fs::path onnx = fs::path(ATTN_SOURCE_DIR) / ".." / "shared" / "conformance" / "onnx";
  if (!fs::is_directory(onnx)) GTEST_SKIP() << "no conformance data at " << onnx;
  VerifySummary summary = verify_fast({onnx});
  EXPECT_EQ(summary.outcomes.size(), 4 * 66u);
  expect_pass_or_f64_skip(summary);
}

TEST(CpuBackends, BshdLayoutPasses) {
  VerifyOptions options;
  options.layout = Layout::bshd;
  VerifySummary summary = verify(find_fixture_files({kGolden / "gqa", kGolden / "mask", kGolden / "head_dim"}),
                                 make_backends(kFast), options);
  expect_pass_or_f64_skip(summary);
}

TEST(CpuBackends, StreamingIsBitwiseReproducibleAtAFixedThreadCount) {
  auto backends = make_backends(std::vector<std::string>{"streaming"});
  for (const char* name : {"decode/q1_k4096_hq8_hkv1_d32_f32", "mask/fully_masked_rows_bf16", "long/q16_k16384_hq4_hkv1_d16_f16"}) {
    Fixture f = read_fixture(kGolden / (std::string(name) + ".h5"));
    for (int threads : {1, 2}) {
      BackendRun first = run_backend(*backends[0], f.data, {threads});
      for (int again = 0; again < 3; ++again) {
        BackendRun next = run_backend(*backends[0], f.data, {threads});
        ASSERT_EQ(std::memcmp(first.out.data(), next.out.data(), first.out.size() * sizeof(double)), 0) << name;
        ASSERT_EQ(*first.lse, *next.lse) << name;
      }
    }
  }
}

TEST(CpuKernels, Avx512AndPortableAgree) {
  const cpu::Kernels* avx = cpu::avx512_kernels();
  if (!avx) GTEST_SKIP() << "this CPU lacks AVX-512 BF16: only the portable kernels run here";
  const cpu::Kernels& portable = cpu::portable_kernels();
  std::mt19937 gen(3);
  std::normal_distribution<float> normal;
  const std::int64_t rows = 13, head_dim = 40, pairs = 20, dv_pad = 80, keys = 64;
  std::vector<float> q(rows * head_dim), kp(head_dim * 64), p(rows * 64), v(keys * dv_pad);
  for (auto* a : {&q, &kp, &p, &v})
    for (float& x : *a) x = normal(gen);
  std::vector<float> s1(rows * 64), s2(rows * 64);
  avx->qk_f32(q.data(), rows, head_dim, kp.data(), s1.data());
  portable.qk_f32(q.data(), rows, head_dim, kp.data(), s2.data());
  for (std::size_t e = 0; e < s1.size(); ++e) EXPECT_NEAR(s1[e], s2[e], 1e-4f);
  std::vector<bf16> qb(rows * pairs * 2), kb(pairs * 64 * 2), pb(rows * 64), vb(keys * dv_pad);
  avx->to_bf16(q.data(), static_cast<std::int64_t>(qb.size()), qb.data());
  for (std::size_t e = 0; e < qb.size(); ++e) EXPECT_EQ(qb[e].bits, float_to_bf16(q[e]).bits);  // RNE, as the scalar path
  portable.to_bf16(kp.data(), static_cast<std::int64_t>(kb.size() / 2), kb.data());
  portable.to_bf16(kp.data(), static_cast<std::int64_t>(kb.size() / 2), kb.data() + kb.size() / 2);
  avx->qk_bf16(qb.data(), rows, pairs, kb.data(), s1.data());
  portable.qk_bf16(qb.data(), rows, pairs, kb.data(), s2.data());
  for (std::size_t e = 0; e < s1.size(); ++e) EXPECT_NEAR(s1[e], s2[e], 1e-3f);
  std::vector<float> o1(rows * dv_pad, 0.5f), o2(rows * dv_pad, 0.5f);
  avx->pv_f32(p.data(), rows, 37, v.data(), dv_pad, dv_pad, o1.data());
  portable.pv_f32(p.data(), rows, 37, v.data(), dv_pad, dv_pad, o2.data());
  for (std::size_t e = 0; e < o1.size(); ++e) EXPECT_NEAR(o1[e], o2[e], 1e-4f);
  portable.to_bf16(p.data(), static_cast<std::int64_t>(pb.size()), pb.data());
  portable.to_bf16(v.data(), static_cast<std::int64_t>(vb.size()), vb.data());
  std::fill(o1.begin(), o1.end(), 0.0f);
  std::fill(o2.begin(), o2.end(), 0.0f);
  avx->pv_bf16(pb.data(), rows, 38, vb.data(), dv_pad, o1.data());
  portable.pv_bf16(pb.data(), rows, 38, vb.data(), dv_pad, o2.data());
  for (std::size_t e = 0; e < o1.size(); ++e) EXPECT_NEAR(o1[e], o2[e], 1e-3f);
  std::vector<float> x1(70), x2;
  for (float& x : x1) x = normal(gen) * 10;
  x1[5] = -INFINITY;
  x2 = x1;
  float sum1 = avx->exp2_sum(x1.data(), 70, 3.0f), sum2 = portable.exp2_sum(x2.data(), 70, 3.0f);
  EXPECT_NEAR(sum1, sum2, 1e-6f * sum2);
  EXPECT_EQ(x1[5], 0.0f);
  for (std::size_t e = 0; e < x1.size(); ++e) EXPECT_NEAR(x1[e], x2[e], 2e-7f * x2[e] + 1e-30f);
  std::vector<float> r1(64, 2.0f), r2(64, 2.0f);
  r1[3] = r2[3] = 5.0f;
  EXPECT_EQ(avx->scale_row(r1.data(), 0.5f, 40), portable.scale_row(r2.data(), 0.5f, 40));
  EXPECT_EQ(r1, r2);
  EXPECT_EQ(r1[40], -INFINITY);
}
