// The oracle's own teeth: the measured bound, the rounding-bias test, the
// normalisation probe and the golden check. Broken backends (tests/mutants)
// must FAIL, a correct one with the same structure must PASS everything, and
// fixtures whose golden is wrong are refused as input errors.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>

#include "core/registry.hpp"
#include "fixtures/fixture.hpp"
#include "fixtures/layer.hpp"
#include "tests/mutants/flash_mutant.hpp"
#include "reference/backward.hpp"
#include "reference/reference.hpp"
#include "verify/verifier.hpp"

using namespace attn;
using attn::testing::FlashFlaws;
using attn::testing::Rounding;
namespace fs = std::filesystem;

namespace {

const fs::path kGolden = fs::path(ATTN_SOURCE_DIR) / "fixtures" / "golden";

// The smoke tier, and the folders that hold the paths only some cases reach
// (subnormal values, odd 16-bit head dims); make verify runs the rest.
std::vector<fs::path> oracle_files() {
  std::vector<fs::path> files;
  for (const auto& file : find_fixture_files({kGolden})) {
    const FixtureHeader header = read_fixture_header(file);
    const std::string folder = file.parent_path().filename().string();
    if (header.has_tag("smoke") || folder == "subnormal" || folder == "head_dim") files.push_back(file);
  }
  return files;
}

struct OracleMutant {
  const char* name;
  FlashFlaws flaws;
  const char* check;          // words the reason of at least one failure must hold
  bool bshd_only = false;     // fails only where the inputs are laid out BSHD
};

const OracleMutant kOracleMutants[] = {
    {"out_toward_zero", {.out_rounding = Rounding::toward_zero}, "rounding bias"},
    {"out_downward", {.out_rounding = Rounding::downward}, "rounding bias"},
    {"p_toward_zero", {.p_rounding = Rounding::toward_zero}, "normalisation probe"},
    {"o_bf16_between_blocks", {.o_in_bf16 = true}, "plain implementation"},
    {"rescale_bf16", {.rescale_in_bf16 = true}, "plain implementation"},
    {"exp_10x_less_accurate", {.exp_error = 7.4e-7}, "plain implementation"},
    {"reciprocal_12_bits", {.reciprocal_bits = 12}, "plain implementation"},
    {"denominator_bf16", {.l_in_bf16 = true}, "normalisation probe"},
    {"denominator_not_rescaled", {.l_not_rescaled = true}, "normalisation probe"},
    // Paths only some cases reach (README, "Fixtures"): subnormals, odd
    // 16-bit head dims, and BSHD strides (make verify runs both layouts).
    {"flush_subnormals", {.flush_subnormals = true}, ""},
    {"odd_tail_dropped_16bit", {.odd_tail_dropped_16bit = true}, ""},
    {"dense_v_strides", {.dense_v_strides = true}, "", true},
};

}  // namespace

// One run judges the correct flash-style backend and every flawed copy of it
// on the same cases (the truth and the plain formulations are computed once
// per case): the correct one must PASS everything, each flaw must FAIL.
TEST(Oracle, TheCorrectFlashStyleBackendPassesAndEveryPrecisionMutantFails) {
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(attn::testing::make_flash_mutant("flash_correct", {}));
  for (const auto& m : kOracleMutants) backends.push_back(attn::testing::make_flash_mutant(m.name, m.flaws));
  VerifyOptions options;
  options.thread_counts = {2};
  options.layouts = {Layout::bhsd, Layout::bshd};  // as make verify does
  const VerifySummary summary = verify(oracle_files(), backends, options);
  EXPECT_TRUE(summary.input_errors.empty());

  int runs = 0;
  for (const auto& o : summary.outcomes) {
    if (o.backend != "flash_correct" || o.comparison.verdict == Verdict::skip) continue;
    ++runs;
    EXPECT_EQ(o.comparison.verdict, Verdict::pass) << o.fixture << ": " << o.comparison.reason;
  }
  EXPECT_GT(runs, 60);

  for (const auto& m : kOracleMutants) {
    int failures = 0, a_priori = 0;
    bool named = false;
    std::string example;
    for (const auto& o : summary.outcomes) {
      if (o.backend != m.name || o.comparison.verdict != Verdict::fail) continue;
      ++failures;
      const std::string& why = o.comparison.reason;
      a_priori += why.rfind("got ", 0) == 0 || why.rfind("non-finite", 0) == 0 || why.rfind("row with no", 0) == 0;
      named = named || o.comparison.reason.find(m.check) != std::string::npos;
      if (m.bshd_only) {
        EXPECT_EQ(o.config.layout, Layout::bshd) << m.name << " failed in BHSD on " << o.fixture;
      }
      if (example.empty()) example = o.fixture + ": " + o.comparison.reason;
    }
    EXPECT_GE(failures, 2) << m.name << " failed fewer than two runs";
    EXPECT_TRUE(named) << m.name << " was never caught by the '" << m.check << "' check; e.g. " << example;
    std::printf("%-26s %3d failures (%3d of them beyond the a-priori bound), e.g. %s\n", m.name, failures, a_priori,
                example.c_str());
  }
}

// ---- The golden is checked, not trusted -------------------------------------

namespace {

class GoldenCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("attn_golden_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs a correct backend on one file.
  VerifySummary run(const fs::path& file) {
    std::vector<std::unique_ptr<Backend>> one;
    one.push_back(attn::testing::make_flash_mutant("flash_correct", {}));
    return verify({file}, one, {});
  }
  void expect_refused(const fs::path& file, const std::string& words) {
    VerifySummary s = run(file);
    EXPECT_TRUE(s.outcomes.empty()) << "a wrong golden must not be blamed on a backend";
    ASSERT_EQ(s.input_errors.size(), 1u);
    EXPECT_EQ(s.input_errors[0].file, file.string());
    EXPECT_NE(s.input_errors[0].message.find(file.string()), std::string::npos) << s.input_errors[0].message;
    EXPECT_NE(s.input_errors[0].message.find(words), std::string::npos) << s.input_errors[0].message;
  }
  fs::path dir_;
};

}  // namespace

TEST_F(GoldenCheck, AWrongGoldenUnderALooseToleranceIsAnInputError) {
  Fixture f = read_fixture(kGolden / "basic" / "b1_h2_q4_k4_d8_f32.h5");
  f.out[3] += 0.5;
  f.header.atol = 1.0;
  write_fixture(f, dir_ / "wrong.h5");
  expect_refused(dir_ / "wrong.h5", "`out` is not the attention of its own inputs");
  const std::string command = std::string(ATTN_CLI) + " verify " + (dir_ / "wrong.h5").string() + " --quiet > /dev/null";
  const int status = std::system(command.c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
}

TEST_F(GoldenCheck, AFloat32GoldenInAFloat64CaseIsAnInputError) {
  Fixture f = read_fixture(kGolden / "basic" / "b1_h2_q4_k4_d8_f64.h5");
  for (double& x : f.out) x = static_cast<double>(static_cast<float>(x));
  write_fixture(f, dir_ / "f32_golden.h5");
  expect_refused(dir_ / "f32_golden.h5", "float64 case");
}

TEST_F(GoldenCheck, ABitFlipInTheGoldenIsAnInputError) {
  Fixture f = read_fixture(kGolden / "mask" / "random_1x1x17_f16.h5");
  std::uint64_t bits;
  std::memcpy(&bits, &f.out[5], sizeof bits);
  bits ^= std::uint64_t{1} << 50;  // a high mantissa bit
  std::memcpy(&f.out[5], &bits, sizeof bits);
  write_fixture(f, dir_ / "flipped.h5");
  expect_refused(dir_ / "flipped.h5", "golden is wrong or corrupt");
}

TEST_F(GoldenCheck, AWrongLseIsAnInputError) {
  Fixture f = read_fixture(kGolden / "basic" / "b1_h2_q4_k4_d8_bf16.h5");
  ASSERT_TRUE(f.lse.has_value());
  (*f.lse)[1] += 0.01;
  write_fixture(f, dir_ / "lse.h5");
  expect_refused(dir_ / "lse.h5", "`lse`");
}

TEST_F(GoldenCheck, AWrongLayerGoldenIsAnInputError) {
  const auto layers = find_fixture_files({kGolden / "layer"});
  ASSERT_FALSE(layers.empty());
  LayerFixture f = read_layer_fixture(layers.front());
  f.y[0] += 0.25;
  write_layer_fixture(f, dir_ / "layer.h5");
  expect_refused(dir_ / "layer.h5", "`y`");
}

TEST_F(GoldenCheck, ALooseToleranceOnACorrectGoldenIsWarnedAndOurPolicyStillApplies) {
  Fixture f = read_fixture(kGolden / "basic" / "b1_h2_q4_k4_d8_f32.h5");
  f.header.atol = 1.0;
  write_fixture(f, dir_ / "loose.h5");
  VerifySummary s = run(dir_ / "loose.h5");
  ASSERT_EQ(s.outcomes.size(), 1u);
  EXPECT_EQ(s.outcomes[0].comparison.verdict, Verdict::pass) << s.outcomes[0].comparison.reason;
  EXPECT_NE(s.outcomes[0].warning.find("LOOSE TOLERANCE"), std::string::npos);
  ASSERT_EQ(s.warnings.size(), 1u);
  // A backend that is wrong by far less than atol = 1 still fails: the
  // fixture's tolerance is not a licence.
  std::vector<std::unique_ptr<Backend>> broken;
  broken.push_back(attn::testing::make_flash_mutant("denominator_not_rescaled", {.l_not_rescaled = true}));
  broken.push_back(attn::testing::make_flash_mutant("reciprocal_12_bits", {.reciprocal_bits = 12}));
  VerifySummary b = verify({dir_ / "loose.h5"}, broken, {});
  ASSERT_EQ(b.outcomes.size(), 2u);
  EXPECT_EQ(b.outcomes[1].comparison.verdict, Verdict::fail) << b.outcomes[1].comparison.reason;
}

namespace {

// The fixture with its out and lse recomputed by the reference (after its
// problem or inputs were changed); the header takes the data's problem.
Fixture recomputed(Fixture f) {
  f.header.problem = f.data.problem;
  const ReferenceResult truth = reference_attention(f.data);
  if (f.gradients) {
    ReferenceGradients g = reference_backward(f.data, f.gradients->dout, truth, f.gradients->bias_requires_grad);
    f.gradients->dq = std::move(g.dq);
    f.gradients->dk = std::move(g.dk);
    f.gradients->dv = std::move(g.dv);
    f.gradients->dbias = std::move(g.dbias);
    f.gradients->dsinks = std::move(g.dsinks);
  }
  f.out = truth.out;
  f.lse = truth.lse;
  return f;
}

}  // namespace

// A bound derived from an infinite truth is infinite, and every finite number
// is within it: an lse on a row with no visible key must be -inf exactly
// (JAX writes -2.38e38 there; 0, 3 and 7 have been seen too).
TEST_F(GoldenCheck, AFiniteLseOnARowWithNoVisibleKeyIsAnInputError) {
  const Fixture f = read_fixture(kGolden / "bias" / "neg_inf_2x2x17_f32.h5");
  ASSERT_TRUE(f.lse.has_value());
  std::size_t hidden = f.lse->size();
  for (std::size_t r = 0; r < f.lse->size(); ++r) {
    if (std::isinf((*f.lse)[r])) hidden = r;
  }
  ASSERT_LT(hidden, f.lse->size()) << "the case has a row with no visible key";
  for (double wrong : {-2.38e38, 0.0, 3.0, 7.0}) {
    Fixture bad = f;
    (*bad.lse)[hidden] = wrong;
    write_fixture(bad, dir_ / "lse_hidden.h5");
    expect_refused(dir_ / "lse_hidden.h5", "`lse`");
  }
  Fixture plus = f;  // +inf is not a value the format allows there at all
  (*plus.lse)[hidden] = std::numeric_limits<double>::infinity();
  write_fixture(plus, dir_ / "lse_plus_inf.h5");
  expect_refused(dir_ / "lse_plus_inf.h5", "'lse'");
}

// However large the scores make the bound (ALiBi slopes of 2^100, a cap of
// 1e30), an output is a weighted mean of the visible values and never leaves
// their range: a golden outside it is refused, and so is one wrong by far
// less than the score-driven bound.
TEST_F(GoldenCheck, ABoundFromHugeScoresStillRefusesAWrongGolden) {
  Fixture alibi = read_fixture(kGolden / "alibi" / "q33_k17_tl_f32.h5");
  for (double& slope : alibi.data.alibi_slopes) slope = 0x1p100;
  alibi = recomputed(alibi);
  alibi.out[7] = 1e6;
  write_fixture(alibi, dir_ / "alibi_huge.h5");
  expect_refused(dir_ / "alibi_huge.h5", "`out`");

  Fixture capped = read_fixture(kGolden / "softcap" / "q17_k33_cap2_f32.h5");
  capped.data.problem.softcap = 1e30;
  capped = recomputed(capped);
  write_fixture(capped, dir_ / "cap_huge_right.h5");
  const VerifySummary right = run(dir_ / "cap_huge_right.h5");
  EXPECT_TRUE(right.input_errors.empty()) << right.input_errors.front().message;
  double largest = 0;
  for (double x : capped.out) largest = std::max(largest, std::fabs(x));
  capped.out[3] += 0.01 * largest;  // wrong by a hundredth of the output
  write_fixture(capped, dir_ / "cap_huge_wrong.h5");
  expect_refused(dir_ / "cap_huge_wrong.h5", "`out`");
}

// A window of INT64_MAX is valid and hides nothing: the reference, naive,
// blocked and streaming give the attention without it, and nothing overflows
// (UBSan in make asan) or hides every key.
TEST_F(GoldenCheck, WindowsAtTheIntegerLimitsHideNothing) {
  const Fixture plain = read_fixture(kGolden / "causal_bottom_right" / "q17_k65_f32.h5");
  for (std::int64_t reach : {std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::max() - 1,
                             std::int64_t{1} << 62}) {
    Fixture wide = plain;
    wide.data.problem.window_left = reach;
    wide.data.problem.window_right = reach;
    wide = recomputed(wide);
    EXPECT_EQ(wide.out, plain.out) << reach;
    write_fixture(wide, dir_ / "window_max.h5");
    const Fixture back = read_fixture(dir_ / "window_max.h5");
    EXPECT_EQ(back.problem().window_left, reach);
    const VerifySummary s = verify({dir_ / "window_max.h5"},
                                   make_backends(std::vector<std::string>{"naive", "blocked", "streaming"}), {});
    EXPECT_TRUE(s.input_errors.empty());
    ASSERT_EQ(s.outcomes.size(), 3u);
    for (const auto& o : s.outcomes) {
      EXPECT_EQ(o.comparison.verdict, Verdict::pass) << o.backend << " with windows of " << reach << ": "
                                                     << o.comparison.reason;
    }
  }
}

// Valid values at float32's edges, each with one exact float32 answer
// (include/attnbench/value_range.hpp): a cap of 3e38 or 1e300 (the identity
// beside these scores), a cap below float32's normal range (every score 0),
// sinks of +-3e38 (the sink takes all, or none), ALiBi slopes of 3e38 (only a
// row's nearest keys count), with a sink beside them too. Every float32
// backend that implements the features computes them, forward and backward
// (PASS, or MISTRUSTED where the bound is too wide to prove much); the two
// backwards with no float32 answer are refused with the reason.
TEST_F(GoldenCheck, ExtremeValuesAreComputedRight) {
  const auto backends = make_backends(std::vector<std::string>{"naive", "blocked", "streaming", "openblas", "onednn"});
  const double huge = static_cast<float>(3e38);
  auto set_sinks = [](Fixture& f, std::initializer_list<double> values) {
    for (std::size_t h = 0; h < f.data.sinks.size(); ++h) f.data.sinks[h] = *(values.begin() + h % values.size());
  };
  struct Extreme {
    std::string name, source;
    std::function<void(Fixture&)> change;
    const char* backward_refusal = nullptr;  // the backward is SKIP with this reason
  };
  const std::vector<Extreme> extremes = {
      {"cap_3e38", "softcap/q17_k33_cap2_f32", [&](Fixture& f) { f.data.problem.softcap = huge; }},
      {"cap_1e300", "softcap/q17_k33_cap2_f32", [](Fixture& f) { f.data.problem.softcap = 1e300; }},
      {"cap_1e300_f64", "softcap/q17_k33_cap2_f64", [](Fixture& f) { f.data.problem.softcap = 1e300; }},
      {"cap_tiny", "softcap/q17_k33_cap2_f32", [](Fixture& f) { f.data.problem.softcap = 5e-324; }},
      {"sinks_pm3e38", "sinks/fully_masked_rows_f32", [&](Fixture& f) { set_sinks(f, {huge, -huge}); }},
      {"alibi_3e38", "alibi/q33_k17_tl_f32",
       [&](Fixture& f) {
         for (double& slope : f.data.alibi_slopes) slope = huge;
       }},
      {"alibi_3e38_sink", "alibi/q33_k17_tl_f32",
       [&](Fixture& f) {
         for (double& slope : f.data.alibi_slopes) slope = huge;
         f.data.problem.sinks = true;
         f.data.sinks.assign(static_cast<std::size_t>(f.data.problem.heads_q), 0.5);
       }},
      {"paged_sinks_pm3e38", "paged/window_alibi_softcap_sinks_ps16_f32", [&](Fixture& f) { set_sinks(f, {huge, -huge}); }},
      {"ragged_sinks_pm3e38_bf16", "ragged/window_sinks_tl_bf16", [&](Fixture& f) { set_sinks(f, {-huge, huge}); }},
      {"paged_alibi_3e38_bf16", "paged/window_alibi_softcap_sinks_ps16_bf16",
       [&](Fixture& f) {
         for (double& slope : f.data.alibi_slopes) slope = -huge;  // the farthest visible keys take the weight
         set_sinks(f, {0.5, -3.0});
       }},
      {"backward_cap_3e38", "backward/softcap_f32", [&](Fixture& f) { f.data.problem.softcap = huge; }},
      {"backward_cap_1e300", "backward/softcap_f32", [](Fixture& f) { f.data.problem.softcap = 1e300; }},
      {"backward_cap_tiny", "backward/softcap_f32", [](Fixture& f) { f.data.problem.softcap = 5e-324; },
       "its gradient's slope is 1 where a score is exactly 0"},
      {"backward_sinks_pm3e38", "backward/sinks_masked_rows_f32", [&](Fixture& f) { set_sinks(f, {huge, -huge}); }},
      {"backward_alibi_3e38", "backward/alibi_causal_br_bf16",
       [&](Fixture& f) {
         for (double& slope : f.data.alibi_slopes) slope = huge;
       },
       "the backward recomputes the weights from it"},
  };
  for (const Extreme& x : extremes) {
    Fixture f = read_fixture(kGolden / (x.source + ".h5"));
    x.change(f);
    f = recomputed(f);
    const fs::path file = dir_ / (x.name + ".h5");
    write_fixture(f, file);
    const VerifySummary s = verify({file}, backends, {});
    ASSERT_TRUE(s.input_errors.empty()) << x.name << ": " << s.input_errors.front().message;
    int judged = 0;
    for (const auto& o : s.outcomes) {
      const std::string what = x.name + " " + o.backend + " " + o.check + ": " + o.comparison.reason;
      const bool unimplemented = o.comparison.reason.find("does not implement") != std::string::npos ||
                                 o.comparison.reason.find("does not compute") != std::string::npos;
      if (o.comparison.verdict == Verdict::skip && (unimplemented || o.check == "batch invariance")) continue;
      if (o.direction == Direction::backward && x.backward_refusal) {
        EXPECT_EQ(o.comparison.verdict, Verdict::skip) << what;
        EXPECT_NE(o.comparison.reason.find(x.backward_refusal), std::string::npos) << what;
        continue;
      }
      EXPECT_TRUE(o.comparison.verdict == Verdict::pass || o.comparison.verdict == Verdict::mistrusted) << what;
      ++judged;
    }
    // float64: naive alone; float32: naive, blocked and streaming at least.
    EXPECT_GE(judged, x.name.ends_with("_f64") ? 1 : 3) << x.name << ": too few of its checks were computed";
  }
}
