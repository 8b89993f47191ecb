// The verifier has teeth: each deliberately broken variant of the naive
// backend must FAIL on the standard suite, and on the fixture designed to
// catch it.
#include <gtest/gtest.h>

#include <map>

#include "fixtures/fixture.hpp"
#include "impls/blocked/blocked.hpp"
#include "impls/naive/naive.hpp"
#include "impls/streaming/streaming.hpp"
#include "verify/verifier.hpp"

using namespace attn;
namespace fs = std::filesystem;

namespace {

struct Mutant {
  const char* name;
  NaiveFlaws flaws;
  const char* caught_by;  // a fixture that must fail
};

const Mutant kMutants[] = {
    {"no_scale", {.no_scale = true}, "basic/b1_h2_q4_k4_d8_f32"},
    {"scale_sqrt_dv", {.scale_sqrt_head_dim_v = true}, "head_dim/d64_dv32_f32"},
    {"scale_on_bias", {.scale_on_bias = true}, "bias/normal_1x1x17_f32"},
    {"no_max_sub", {.no_max_subtraction = true}, "large_logits/scores_300_f32"},
    {"causal_off1", {.causal_off_by_one = true}, "causal_top_left/q33_k33_f32"},
    {"causal_swap", {.causal_swapped = true}, "causal_bottom_right/q17_k65_f32"},
    {"gqa_modulo", {.gqa_modulo = true}, "gqa/b2_hq8_hkv2_q33_k65_d32_f32"},
    {"mask_axis", {.mask_ignores_query_axis = true}, "mask/random_1x1x17_f32"},
    {"f16_accum", {.f16_accumulation = true}, "accumulation/q4_k4096_d16_positive_v_f16"},
    {"masked_mean", {.masked_row_mean = true}, "mask/fully_masked_rows_f32"},
    {"drop_last", {.drop_last_key = true}, "rescale/last_key_max_k257_f32"},
};

class Mutants : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::vector<std::unique_ptr<Backend>> backends;
    for (const Mutant& m : kMutants) backends.push_back(make_flawed_naive_backend(m.name, m.flaws));
    backends.push_back(make_naive_backend());
    std::vector<fs::path> files;
    for (const auto& file : find_fixture_files({fs::path(ATTN_SOURCE_DIR) / "fixtures" / "golden"})) {
      if (!read_fixture_header(file).has_tag("long")) files.push_back(file);
    }
    summary_ = new VerifySummary(verify(files, backends, {}));
  }
  static void TearDownTestSuite() { delete summary_; }
  static VerifySummary* summary_;
};
VerifySummary* Mutants::summary_ = nullptr;

}  // namespace

TEST_F(Mutants, EveryMutantFailsOnTheStandardSuiteAndOnItsOwnFixture) {
  std::map<std::string, int> failures;
  std::map<std::string, Verdict> on_target;
  for (const auto& o : summary_->outcomes) {
    if (o.comparison.verdict == Verdict::fail) ++failures[o.backend];
    for (const Mutant& m : kMutants) {
      if (o.backend == m.name && o.fixture == m.caught_by) on_target[m.name] = o.comparison.verdict;
    }
  }
  for (const Mutant& m : kMutants) {
    EXPECT_GT(failures[m.name], 0) << m.name << " passed the whole suite";
    ASSERT_TRUE(on_target.count(m.name)) << m.caught_by << " not found";
    EXPECT_EQ(on_target[m.name], Verdict::fail) << m.name << " was not caught by " << m.caught_by;
  }
}

TEST_F(Mutants, TheRealNaiveBackendPassesAlongsideThem) {
  int runs = 0;
  for (const auto& o : summary_->outcomes) {
    if (o.backend != "naive") continue;
    ++runs;
    EXPECT_EQ(o.comparison.verdict, Verdict::pass) << o.fixture << ": " << o.comparison.reason;
  }
  EXPECT_GT(runs, 100);
}

// Tiling bugs of the blocked and streaming backends, run with two threads so
// the split-K path is taken on decode shapes whatever the machine.
TEST(TilingMutants, EveryTilingMutantFailsOnItsOwnFixture) {
  struct TilingMutant {
    std::unique_ptr<Backend> backend;
    const char* caught_by;
  };
  std::vector<TilingMutant> mutants;
  mutants.push_back({make_flawed_streaming_backend("no_rescale", {.no_rescale = true}), "rescale/last_key_max_k1025_f32"});
  mutants.push_back({make_flawed_streaming_backend("drop_tail", {.drop_last_partial_block = true}), "rescale/last_key_max_k257_f32"});
  mutants.push_back({make_flawed_streaming_backend("split_merge", {.unweighted_split_merge = true}), "decode/q1_k4096_hq8_hkv1_d32_f32"});
  mutants.push_back({make_flawed_streaming_backend("causal_skip", {.causal_skip_one_more = true}), "causal_top_left/q129_k257_f32"});
  mutants.push_back({make_flawed_blocked_backend("wrong_tail", {.wrong_tail = true}), "mha/b2_h4_q17_k33_d64_f32"});
  const fs::path golden = fs::path(ATTN_SOURCE_DIR) / "fixtures" / "golden";
  std::vector<fs::path> files;
  for (const auto& file : find_fixture_files({golden})) {
    if (!read_fixture_header(file).has_tag("long")) files.push_back(file);
  }
  VerifyOptions options;
  options.run.threads = 2;
  for (auto& m : mutants) {
    std::vector<std::unique_ptr<Backend>> one;
    std::string name(m.backend->name());
    one.push_back(std::move(m.backend));
    VerifySummary summary = verify(files, one, options);
    EXPECT_GT(summary.failed(), 0) << name << " passed the whole suite";
    bool caught = false;
    for (const auto& o : summary.outcomes) caught = caught || (o.fixture == m.caught_by && o.comparison.verdict == Verdict::fail);
    EXPECT_TRUE(caught) << name << " was not caught by " << m.caught_by;
  }
}
