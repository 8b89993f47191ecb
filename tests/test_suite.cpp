// The standard suite: it covers what the foundation promises, and the
// committed golden files are exactly what the generator writes today.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>

#include "core/detmath.hpp"
#include "core/rng.hpp"
#include "fixtures/fixture.hpp"
#include "fixtures/suite.hpp"

using namespace attn;
namespace fs = std::filesystem;

namespace {

template <typename Pred> bool any_case(Pred pred) {
  for (const auto& spec : standard_suite()) {
    if (pred(Problem::parse(spec.problem), spec)) return true;
  }
  return false;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST(StandardSuite, NamesAreUniqueAndProblemsValid) {
  std::set<std::string> names;
  for (const auto& spec : standard_suite()) {
    EXPECT_TRUE(names.insert(spec.name).second) << spec.name;
    EXPECT_NO_THROW(Problem::parse(spec.problem)) << spec.name;
    EXPECT_FALSE(spec.tags.empty()) << spec.name;
  }
}

TEST(StandardSuite, CoversWhatTheFoundationPromises) {
  for (DType d : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    EXPECT_TRUE(any_case([&](const Problem& p, const CaseSpec&) { return p.dtype == d; })) << dtype_name(d);
  }
  EXPECT_TRUE(any_case([](const Problem& p, const CaseSpec&) { return p.heads_kv > 1 && p.heads_kv < p.heads_q; }));  // GQA
  EXPECT_TRUE(any_case([](const Problem& p, const CaseSpec&) { return p.heads_kv == 1 && p.heads_q > 1; }));         // MQA
  EXPECT_TRUE(any_case([](const Problem& p, const CaseSpec&) { return p.seq_q < p.seq_k; }));
  EXPECT_TRUE(any_case([](const Problem& p, const CaseSpec&) { return p.seq_q > p.seq_k; }));
  EXPECT_TRUE(any_case([](const Problem& p, const CaseSpec&) { return p.seq_q == 1 && p.seq_k >= 1000; }));  // decode
  EXPECT_TRUE(any_case([](const Problem& p, const CaseSpec&) { return p.seq_q == 1 && p.seq_k == 1; }));
  EXPECT_TRUE(any_case([](const Problem& p, const CaseSpec&) { return p.seq_k == 0; }));
  EXPECT_TRUE(any_case([](const Problem& p, const CaseSpec&) { return p.seq_q >= 4096 && p.seq_k >= 4096; }));
  for (int len : {1, 2, 3, 17, 33, 65, 127, 129, 257, 1023, 1025}) {
    EXPECT_TRUE(any_case([&](const Problem& p, const CaseSpec&) { return p.seq_q == len || p.seq_k == len; })) << len;
  }
  for (int d : {1, 8, 40, 64, 80, 96, 128, 192, 256}) {
    EXPECT_TRUE(any_case([&](const Problem& p, const CaseSpec&) { return p.head_dim == d; })) << d;
  }
  EXPECT_TRUE(any_case([](const Problem& p, const CaseSpec&) { return p.head_dim != p.head_dim_v; }));
  for (Causal c : {Causal::top_left, Causal::bottom_right}) {
    EXPECT_TRUE(any_case([&](const Problem& p, const CaseSpec&) { return p.causal == c && p.seq_q < p.seq_k; }));
    EXPECT_TRUE(any_case([&](const Problem& p, const CaseSpec&) { return p.causal == c && p.seq_q > p.seq_k; }));
  }
  for (bool full_batch : {false, true})
    for (bool full_heads : {false, true})
      for (bool full_rows : {false, true}) {
        EXPECT_TRUE(any_case([&](const Problem& p, const CaseSpec&) {
          return p.mask.present && (p.mask.batch == p.batch && p.batch > 1) == full_batch &&
                 (p.mask.heads == p.heads_q && p.heads_q > 1) == full_heads &&
                 (p.mask.rows == p.seq_q && p.seq_q > 1) == full_rows;
        })) << full_batch << full_heads << full_rows;
      }
  for (MaskPattern m : {MaskPattern::random, MaskPattern::block, MaskPattern::fully_masked_rows,
                        MaskPattern::hidden_tile, MaskPattern::fully_masked_batch}) {
    EXPECT_TRUE(any_case([&](const Problem&, const CaseSpec& s) { return s.recipe.mask == m; }));
  }
  EXPECT_TRUE(any_case([](const Problem&, const CaseSpec& s) { return s.recipe.bias == BiasPattern::with_neg_inf; }));
  EXPECT_TRUE(any_case([](const Problem&, const CaseSpec& s) {
    return std::find(s.recipe.kv_len.begin(), s.recipe.kv_len.end(), 0) != s.recipe.kv_len.end();
  }));
  EXPECT_TRUE(any_case([](const Problem&, const CaseSpec& s) { return s.recipe.poison_hidden_v; }));
  EXPECT_TRUE(any_case([](const Problem&, const CaseSpec& s) { return s.recipe.last_key_max; }));
  EXPECT_TRUE(any_case([](const Problem& p, const CaseSpec& s) { return p.dtype == DType::bf16 && s.recipe.q_std >= 1e5; }));
  for (const char* tag : {"smoke", "full", "long"}) {
    EXPECT_TRUE(any_case([&](const Problem&, const CaseSpec& s) { return s.tags.find(tag) != std::string::npos; })) << tag;
  }
}

TEST(StandardSuite, LargeLogitCasesReallyHaveLargeScores) {
  for (const auto& spec : standard_suite()) {
    if (spec.name.rfind("large_logits/", 0) != 0) continue;
    ASSERT_EQ(spec.model_dim, 0);
    Fixture f = generate_fixture(spec);
    double max_lse = 0;
    for (double x : *f.lse) max_lse = std::max(max_lse, std::fabs(x));
    EXPECT_GE(max_lse, 100.0) << spec.name;  // lse >= max score, so some |score| >= 100
  }
}

// In `make test`, the first case of every folder and every fourth case (each
// of the generator's paths); every case with ATTN_TEST_FULL set (`make
// test-full`, StandardSuite.golden_full).
TEST(StandardSuite, CommittedGoldenFilesAreWhatTheGeneratorWrites) {
  const fs::path golden = fs::path(ATTN_SOURCE_DIR) / "fixtures" / "golden";
  const fs::path scratch = fs::temp_directory_path() / ("attn_golden_" + std::to_string(::getpid()));
  const bool every = std::getenv("ATTN_TEST_FULL") != nullptr;
  std::set<fs::path> expected;
  std::set<std::string> folders;
  std::size_t index = 0;
  for (const auto& spec : standard_suite()) {
    fs::path relative = spec.name + ".h5";
    expected.insert(relative);
    ASSERT_TRUE(fs::exists(golden / relative)) << relative << " missing: run `make fixtures`";
    const bool first_of_folder = folders.insert(relative.parent_path().string()).second;
    if (!every && !first_of_folder && index++ % 4 != 0) continue;
    write_generated_case(spec, scratch / relative);
    EXPECT_EQ(read_bytes(scratch / relative), read_bytes(golden / relative))
        << relative << " differs from the generator's output: run `make fixtures`";
  }
  for (const auto& file : find_fixture_files({golden})) {
    EXPECT_TRUE(expected.count(fs::relative(file, golden))) << file << " is not in the case list";
  }
  fs::remove_all(scratch);
}

TEST(Rng, SameSeedSameNumbersOnEveryMachine) {
  // xoshiro256** seeded by splitmix64(42), computed independently in Python
  // from the published algorithms.
  Rng rng(42);
  EXPECT_EQ(rng.next(), 0x15780b2e0c2ec716ull);
  Rng a(7), b(7);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(a.normal(), b.normal());
}

TEST(Rng, NormalHasTheRightMoments) {
  Rng rng(1);
  double sum = 0, sum2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    double x = rng.normal();
    sum += x;
    sum2 += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum2 / n, 1.0, 0.01);
}

TEST(DetMath, ExpAndLogAgreeWithTheCLibraryWithinAFewUlps) {
  for (double x = -708; x < 709; x += 0.0137) {  // results in the normal range
    double ours = detmath::exp(x), libm = std::exp(x);
    EXPECT_LE(std::fabs(ours - libm), 2 * std::fabs(std::nextafter(libm, INFINITY) - libm)) << x;
  }
  EXPECT_NEAR(detmath::exp(-740.0) / std::exp(-740.0), 1.0, 1e-3);  // subnormal results keep few bits
  for (double x = 1e-300; x < 1e300; x *= 1.37) {
    double ours = detmath::log(x), libm = std::log(x);
    EXPECT_LE(std::fabs(ours - libm), 3 * std::fabs(std::nextafter(libm, INFINITY) - libm)) << x;
  }
  EXPECT_EQ(detmath::log(1.0), 0.0);
  EXPECT_EQ(detmath::exp(0.0), 1.0);
  EXPECT_EQ(detmath::log(0.0), -INFINITY);
}

// exp_n (four lanes at a time where the CPU has AVX2) gives exp's bits on
// every input: the edges of each branch, the powers of two that are not
// normal, specials, a sweep, odd lengths and the array in place.
TEST(DetMath, ExpOfAnArrayHasTheBitsOfExpOneByOne) {
  std::vector<double> x = {0.0, -0.0, 1.0, -1.0, 709.782712893384, 709.7827128933841, 709.79, -745.2, -745.20000000000005,
                           -745.3, -708.3964, -708.4, -709.0, -709.1, -744.44, 708.0, 709.5, 1e-300, -1e-300, 5e-324,
                           std::nan(""), INFINITY, -INFINITY, 1e308, -1e308, 0.3465735902799726, -0.3465735902799727};
  for (double v = -760; v < 720; v += 0.0731) x.push_back(v);
  for (double v = -1; v < 1; v += 1e-3) x.push_back(v * 3.1);
  for (int extra = 0; extra < 4; ++extra) {  // every tail length
    std::vector<double> in(x.begin(), x.end() - extra), out(in.size(), -7.0);
    detmath::exp_n(in.data(), out.data(), in.size());
    for (std::size_t i = 0; i < in.size(); ++i) {
      const double one = detmath::exp(in[i]);
      ASSERT_EQ(std::bit_cast<std::uint64_t>(out[i]), std::bit_cast<std::uint64_t>(one)) << "exp(" << in[i] << ")";
    }
    detmath::exp_n(in.data(), in.data(), in.size());  // in place
    EXPECT_EQ(0, std::memcmp(in.data(), out.data(), in.size() * sizeof(double)));
  }
}
