// Dropout (docs/verification/dropout.md): the Philox generator against its
// published answers, the binomial test's arithmetic, the mask's tests
// catching a wrong rate, a correlated or unwritten mask and calibrated at
// their significance, and the verifier's dropout rows on the standard cases.
// (The broken dropouts of tests/mutants, caught by make verify and by the
// fuzzer, are asserted by their own ctest entries and the Catalogue.)
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include <unistd.h>

#include "attnbench/dropout.hpp"
#include "attnbench/error.hpp"
#include "core/registry.hpp"
#include "fixtures/fixture.hpp"
#include "fixtures/suite.hpp"
#include "impls/naive/naive.hpp"
#include "verify/dropout.hpp"
#include "verify/run_case.hpp"
#include "verify/verifier.hpp"

using namespace attn;
namespace fs = std::filesystem;

namespace {

// Random123's known answers for philox4x32 10 (tests/kat_vectors).
TEST(Philox, GivesRandom123sKnownAnswers) {
  Philox4x32 zero = philox4x32_10({{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(zero.v[0], 0x6627e8d5u);
  EXPECT_EQ(zero.v[1], 0xe169c58du);
  EXPECT_EQ(zero.v[2], 0xbc57ac4cu);
  EXPECT_EQ(zero.v[3], 0x9b00dbd8u);
  Philox4x32 ones = philox4x32_10({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu);
  EXPECT_EQ(ones.v[0], 0x408f276du);
  EXPECT_EQ(ones.v[3], 0x6d5451fdu);
  Philox4x32 pi = philox4x32_10({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(pi.v[0], 0xd16cfe09u);
  EXPECT_EQ(pi.v[1], 0x94fdccebu);
  EXPECT_EQ(pi.v[2], 0x5001e420u);
  EXPECT_EQ(pi.v[3], 0x24126ea1u);
}

// A row drawn at once is the elements drawn one by one, from any start; the
// seed and the offset each change the bits.
TEST(DropoutMask, RowsAreTheElementsAndSeedAndOffsetMatter) {
  const Problem p = Problem::parse("dtype=f32,b=2,hq=3,hkv=3,sq=5,sk=11,d=4");
  const DropoutMask mask(p, {.p = 0.3, .seed = 42, .offset = 7});
  std::uint8_t row[11];
  for (std::int64_t j0 : {0, 1, 3, 6}) {
    mask.row(1, 2, 4, j0, 11 - j0, row);
    for (std::int64_t j = j0; j < 11; ++j) EXPECT_EQ(row[j - j0], mask.keeps(1, 2, 4, j) ? 1 : 0) << j0 << " " << j;
  }
  int differ_seed = 0, differ_offset = 0;
  const DropoutMask reseeded(p, {.p = 0.3, .seed = 43, .offset = 7}), shifted(p, {.p = 0.3, .seed = 42, .offset = 8});
  for (std::int64_t j = 0; j < 11; ++j)
    for (std::int64_t i = 0; i < 5; ++i) {
      differ_seed += mask.keeps(0, 0, i, j) != reseeded.keeps(0, 0, i, j);
      differ_offset += mask.keeps(0, 0, i, j) != shifted.keeps(0, 0, i, j);
    }
  EXPECT_GT(differ_seed, 5);
  EXPECT_GT(differ_offset, 5);
  EXPECT_DOUBLE_EQ(mask.keep_scale(), 1 / 0.7);
}

TEST(Binomial, TwoSidedPValuesAreTwiceTheSmallerTail) {
  EXPECT_DOUBLE_EQ(binomial_two_sided(10, 0, 0.5), 2.0 / 1024);
  EXPECT_NEAR(binomial_two_sided(20, 3, 0.5), 2.0 * 1351 / 1048576, 1e-15);   // 1 + 20 + 190 + 1140
  EXPECT_NEAR(binomial_two_sided(20, 17, 0.5), 2.0 * 1351 / 1048576, 1e-15);  // the upper tail, alike
  EXPECT_DOUBLE_EQ(binomial_two_sided(100, 50, 0.5), 1.0);
  EXPECT_NEAR(binomial_two_sided(5, 5, 0.9), 2 * std::pow(0.9, 5) > 1 ? 1.0 : 2 * std::pow(0.9, 5), 1e-15);
  // Far in a tail of a million trials: tiny, not 0 or NaN.
  const double far = binomial_two_sided(1000000, 895000, 0.9);
  EXPECT_GT(far, 0);
  EXPECT_LT(far, 1e-50);
}

// Visible everywhere: a dense case without masking.
std::vector<std::uint8_t> all_visible(const Problem& p) {
  return std::vector<std::uint8_t>(static_cast<std::size_t>(p.batch * p.heads_q * p.seq_q * p.seq_k), 1);
}

std::vector<std::uint8_t> drawn(const Problem& p, double rate, std::uint64_t seed) {
  std::vector<std::uint8_t> kept(static_cast<std::size_t>(p.batch * p.heads_q * p.seq_q * p.seq_k));
  const DropoutMask mask(p, {.p = rate, .seed = seed});
  for (std::int64_t e = 0; e < p.batch; ++e)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.seq_q; ++i)
        mask.row(e, h, i, 0, p.seq_k, &kept[static_cast<std::size_t>(((e * p.heads_q + h) * p.seq_q + i) * p.seq_k)]);
  return kept;
}

const Problem kCase = Problem::parse("dtype=f32,b=2,hq=4,hkv=2,sq=128,sk=128,d=32");

TEST(MaskTests, PassTheRateAskedForAndFailARateOnePercentOff) {
  const std::vector<std::uint8_t> visible = all_visible(kCase);
  const MaskVerdict right = test_dropout_mask(kCase, 0.1, visible, drawn(kCase, 0.1, 1));
  EXPECT_TRUE(right.failure.empty()) << right.failure;
  EXPECT_EQ(right.statistics.size(), 5u);  // kept, and neighbours along each of the four axes
  const MaskVerdict off = test_dropout_mask(kCase, 0.1, visible, drawn(kCase, 0.11, 1));
  EXPECT_NE(off.failure.find("mask: kept in 89."), std::string::npos) << off.failure;
}

TEST(MaskTests, FailAMaskSharedAcrossHeadsOrKeysAndOneLeftUnwritten) {
  const std::vector<std::uint8_t> visible = all_visible(kCase);
  std::vector<std::uint8_t> heads = drawn(kCase, 0.1, 3);
  for (std::size_t n = 0; n < heads.size(); ++n) {  // every head copies head 0 of its entry
    const std::size_t per_head = 128 * 128, per_entry = 4 * per_head;
    heads[n] = heads[n / per_entry * per_entry + n % per_head];
  }
  EXPECT_NE(test_dropout_mask(kCase, 0.1, visible, heads).failure.find("heads h, h+1 agree in 100.000%"), std::string::npos);
  std::vector<std::uint8_t> pairs = drawn(kCase, 0.1, 3);
  for (std::size_t n = 1; n < pairs.size(); n += 2) pairs[n] = pairs[n - 1];  // keys drawn in pairs
  EXPECT_NE(test_dropout_mask(kCase, 0.1, visible, pairs).failure.find("keys j, j+1 agree"), std::string::npos);
  std::vector<std::uint8_t> unwritten = drawn(kCase, 0.1, 3);
  unwritten[(((1 * 4 + 2) * 128 + 5) * 128) + 9] = kNotWritten;
  const MaskVerdict v = test_dropout_mask(kCase, 0.1, visible, unwritten);
  EXPECT_NE(v.failure.find("1 of 131072 visible pairs not written"), std::string::npos) << v.failure;
  EXPECT_NE(v.failure.find("[1, 2, 5, 9]"), std::string::npos) << v.failure;
  // Elements that are not visible are never read.
  std::vector<std::uint8_t> hidden = visible, masked = drawn(kCase, 0.1, 3);
  hidden[7] = 0;
  masked[7] = kNotWritten;
  EXPECT_TRUE(test_dropout_mask(kCase, 0.1, hidden, masked).failure.empty());
}

// Calibrated: at significance 0.05 a correct generator fails about 5% of its
// runs (400 seeds: 20 expected, 5 and 40 beyond four standard deviations);
// at the verifier's significance, none.
TEST(MaskTests, FalseAlarmsMatchTheSignificance) {
  const Problem small = Problem::parse("dtype=f32,b=2,hq=2,hkv=2,sq=32,sk=64,d=8");
  const std::vector<std::uint8_t> visible = all_visible(small);
  int at_five_percent = 0, at_default = 0;
  for (std::uint64_t seed = 1; seed <= 400; ++seed) {
    const std::vector<std::uint8_t> kept = drawn(small, 0.2, seed);
    at_five_percent += !test_dropout_mask(small, 0.2, visible, kept, 0.05).failure.empty();
    at_default += !test_dropout_mask(small, 0.2, visible, kept).failure.empty();
  }
  EXPECT_GE(at_five_percent, 5);
  EXPECT_LE(at_five_percent, 40);
  EXPECT_EQ(at_default, 0);
}

// The same measurement through a backend: naive's forward, as attn dropout runs it.
TEST(Calibration, CountsFalseAlarmsAndPowerThroughABackend) {
  const std::unique_ptr<Backend> naive = make_naive_backend();
  const CaseData data = generate_inputs(CaseSpec{"calibration", "", "", kCase.to_string(), {}});
  const DropoutCalibration right = calibrate_dropout(*naive, data, 0.1, 0.1, 1, 20, DropoutConstants::significance, {});
  EXPECT_EQ(right.runs, 20);
  EXPECT_EQ(right.visible, 131072);
  EXPECT_EQ(right.failed, 0);
  const DropoutCalibration off = calibrate_dropout(*naive, data, 0.1, 0.11, 1, 20, DropoutConstants::significance, {});
  EXPECT_EQ(off.failed, 20);
  EXPECT_EQ(off.failed_by_test[1], 20);  // "kept"
  EXPECT_EQ(off.tests[1], "kept");
}

// naive with its dropout undeclared.
class WithoutDropout final : public Backend {
 public:
  std::string_view name() const override { return "without-dropout"; }
  std::string_view description() const override { return "naive, dropout not declared"; }
  Capabilities capabilities() const override {
    Capabilities c = naive_->capabilities();
    c.dropout = false;
    return c;
  }
  Status supports(const Problem& p) const override { return naive_->supports(p); }
  std::unique_ptr<Plan> prepare(const Problem& p, const AttentionIO& io, const RunOptions& o) const override {
    return naive_->prepare(p, io, o);
  }
  std::unique_ptr<BackwardPlan> prepare_backward(const Problem& p, const BackwardIO& io, const RunOptions& o) const override {
    return naive_->prepare_backward(p, io, o);
  }

 private:
  std::unique_ptr<Backend> naive_ = make_naive_backend();
};

// The verifier: a dropout row per backend and direction on each dropout
// case; naive, blocked and streaming pass every one they run (the fast ones
// SKIP packed batches, which they run entry by entry), a backend without
// dropout is SKIP saying so.
TEST(Verifier, JudgesEveryDropoutCaseForwardAndBackward) {
  const fs::path folder = fs::path(ATTN_SOURCE_DIR) / "fixtures/golden/dropout";
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(make_naive_backend());
  for (auto& b : make_backends(std::vector<std::string>{"blocked", "streaming"})) backends.push_back(std::move(b));
  backends.push_back(std::make_unique<WithoutDropout>());
  VerifyOptions options;
  options.thread_counts = {1};
  std::map<std::string, int> passed, skipped;
  const VerifySummary summary = verify(find_fixture_files({folder}), backends, options, [&](const CaseOutcome& o) {
    if (o.check != "dropout") return;
    if (o.backend == "without-dropout") {
      EXPECT_EQ(o.comparison.verdict, Verdict::skip);
      EXPECT_EQ(o.comparison.reason, "it does not declare dropout");
      ++skipped[o.backend];
    } else if (o.backend != "naive" && o.fixture == "dropout/ragged_p0.5_f32") {
      EXPECT_EQ(o.comparison.verdict, Verdict::skip);
      EXPECT_NE(o.comparison.reason.find("dropout on packed sequences is not implemented"), std::string::npos);
      ++skipped[o.backend];
    } else {
      EXPECT_EQ(o.comparison.verdict, Verdict::pass) << o.backend << " " << o.fixture << " "
                                                     << direction_name(o.direction) << ": " << o.comparison.reason;
      EXPECT_FALSE(o.comparison.tensors.empty());
      ++passed[o.backend];
    }
  });
  EXPECT_TRUE(summary.input_errors.empty());
  EXPECT_EQ(passed["naive"], 10);  // five cases, each forward and backward
  EXPECT_EQ(passed["blocked"], 8);
  EXPECT_EQ(passed["streaming"], 8);
  EXPECT_EQ(skipped["without-dropout"], 10);
}

TEST(FixtureFormat, DropoutPRoundTripsAndOnlyAProbabilityIsAccepted) {
  const fs::path dir = fs::temp_directory_path() / ("attn_test_dropout_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  Fixture f = generate_fixture(CaseSpec{"dropout/io", "", "", "dtype=f32,b=1,hq=1,hkv=1,sq=3,sk=4,d=2", {.dropout_p = 0.3}});
  ASSERT_TRUE(f.header.dropout_p);
  write_fixture(f, dir / "a.h5");
  const FixtureHeader back = read_fixture_header(dir / "a.h5");
  ASSERT_TRUE(back.dropout_p);
  EXPECT_EQ(*back.dropout_p, 0.3);
  EXPECT_TRUE(back.has_tag("dropout"));
  for (double bad : {0.0, 1.0, -0.1, 1.5, std::nan("")}) {
    f.header.dropout_p = bad;
    write_fixture(f, dir / "b.h5");
    try {
      read_fixture_header(dir / "b.h5");
      ADD_FAILURE() << "dropout_p " << bad << " accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("attribute 'dropout_p' is"), std::string::npos) << e.what();
    }
  }
  fs::remove_all(dir);
}

}  // namespace

#include "tests/cli_run.hpp"

namespace {

// attn dropout as a user runs it: the table of each test's failures, and a
// clear refusal of a backend without dropout or a packed problem.
TEST(DropoutCli, CountsFailuresPerTestAndRefusesWhatItCannotRun) {
  const attn::test::CliRun right = attn::test::run_attn("dropout -b streaming --seeds 5 --threads 1");
  EXPECT_EQ(right.code, 0) << right.output;
  EXPECT_NE(right.output.find("131072 visible weights a run"), std::string::npos) << right.output;
  EXPECT_NE(right.output.find("any test (the run's verdict)                          0"), std::string::npos) << right.output;
  const attn::test::CliRun off = attn::test::run_attn("dropout -b naive --drop-with 0.11 --seeds 3");
  EXPECT_EQ(off.code, 0) << off.output;
  EXPECT_NE(off.output.find("kept                                                  3    1.0000"), std::string::npos) << off.output;
  const attn::test::CliRun none = attn::test::run_attn("dropout -b openblas --seeds 1");
  EXPECT_EQ(none.code, 2);
  EXPECT_NE(none.output.find("openblas does not declare dropout"), std::string::npos) << none.output;
  const attn::test::CliRun packed = attn::test::run_attn("dropout -b naive --problem dtype=f32,b=2,hq=1,hkv=1,sq=8,sk=8,d=4,ragged");
  EXPECT_EQ(packed.code, 2);
  EXPECT_NE(packed.output.find("must be a dense batch"), std::string::npos) << packed.output;
}

}  // namespace
