// The fuzzer has teeth: `attn fuzz` on a fixed seed finds every mutant of the
// catalogue (tests/mutants) within the budget CI gives it, and shrinks the
// failure to a case from which no size can be lowered, no feature dropped and
// no thread removed without the failure going away. The shrunk fixture, read
// back from its file, fails the mutant and passes the real backend it copies.
// (That `make verify` catches every mutant is asserted by the ctest entries
// mutants.make_verify_catches.*, which run attn-mutants with make verify's options.)
#include <algorithm>
#include <gtest/gtest.h>

#include <unistd.h>

#include <map>
#include <set>

#include "core/registry.hpp"
#include "fixtures/fixture.hpp"
#include "tests/mutants/catalogue.hpp"
#include "verify/fuzz.hpp"

using namespace attn;
namespace fs = std::filesystem;

namespace {

constexpr std::uint64_t kSeed = 1;      // the seed CI fuzzes with
constexpr std::int64_t kBudget = 600;   // cases a mutant may take to be found (the slowest, bwd_sink_*, took 125)

fs::path scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("attn_test_fuzz_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  return dir;
}

}  // namespace

// One fuzz run over the whole catalogue (each case's truth is computed once
// for every mutant not found yet): every mutant is found within the budget,
// and each failure is shrunk, checked minimal, and reproduced from its file.
TEST(Catalogue, TheFuzzerFindsEveryMutantAndShrinksItToAMinimalCaseThatReproducesFromItsFile) {
  // A mutant unavailable on this machine (the AVX-512 kernels' exp2 elsewhere)
  // is left out, with its reason.
  std::vector<std::unique_ptr<Backend>> all;
  std::vector<const attn::testing::MutantEntry*> entries;
  for (const auto& m : attn::testing::mutants()) {
    auto backend = m.make();
    if (const Status here = backend->available(); !here) {
      std::printf("%-40s left out: %s\n", std::string(m.name).c_str(), here.reason.c_str());
      continue;
    }
    all.push_back(std::move(backend));
    entries.push_back(&m);
  }
  FuzzOptions options;
  options.seed = kSeed;
  options.cases = kBudget;
  options.out_dir = scratch("catalogue");
  const FuzzSummary summary = run_fuzz(all, options);
  std::map<std::string, const FuzzFailure*> found;
  for (const FuzzFailure& f : summary.failures) found[f.backend] = &f;
  for (std::size_t b = 0; b < all.size(); ++b) {
    const attn::testing::MutantEntry& m = *entries[b];
    SCOPED_TRACE(std::string(m.name));
    const auto it = found.find(std::string(m.name));
    if (it == found.end()) {
      ADD_FAILURE() << m.name << " survived " << summary.cases << " fuzz cases of seed " << kSeed;
      continue;
    }
    const FuzzFailure& f = *it->second;
    const Backend& mutant = *all[b];
    EXPECT_TRUE(f.shrunk.minimal) << "shrink budget spent after " << f.shrunk.evaluations << " cases";
    // Nothing one step simpler still fails: no size is larger than the failure needs.
    for (const FuzzCase& simpler : simpler_fuzz_cases(f.shrunk.smallest)) {
      EXPECT_FALSE(judge_fuzz_case(mutant, simpler, &f.check).failed)
          << "shrunk case " << f.shrunk.smallest.describe() << " could still become " << simpler.describe();
    }
    // The file is a standard fixture that reproduces the failure, and the real backend passes it.
    ASSERT_TRUE(fs::exists(f.file));
    VerifyOptions config;
    config.thread_counts = f.shrunk.smallest.thread_counts();
    config.layouts = {f.shrunk.smallest.layout};
    config.invariance = config.relations = true;  // as the fuzzer judged it
    // (the golden comparison's unit, or the check that found it; a relation
    // or the invariance check may catch the same bug again on the file)
    const int reproduced = f.shrunk.smallest.layer() ? verify_layer_fixture(read_layer_fixture(f.file), {&mutant}, config).failed()
                                                     : verify_fixture(read_fixture(f.file), {&mutant}, config).failed();
    EXPECT_GE(reproduced, 1) << f.file;
    std::vector<std::string> real = {m.target == "flash" ? "streaming" : std::string(m.target)};
    const VerifySummary by_real = verify({f.file}, make_backends(real), config);
    EXPECT_TRUE(by_real.input_errors.empty());
    EXPECT_EQ(by_real.failed(), 0) << "the real " << real[0] << " fails the shrunk case too";
    std::printf("%-40s found at case %4lld, shrunk in %2d steps to %s\n", std::string(m.name).c_str(),
                static_cast<long long>(f.index), f.shrunk.steps, f.shrunk.smallest.describe().c_str());
  }
  fs::remove_all(options.out_dir);
}

TEST(FuzzDraw, TheSameSeedDrawsTheSameCasesAndDifferentSeedsDiffer) {
  for (std::int64_t i = 0; i < 20; ++i) {
    EXPECT_EQ(draw_fuzz_case(7, i).describe(), draw_fuzz_case(7, i).describe());
    EXPECT_EQ(fuzz_fixture(draw_fuzz_case(7, i)).data.q, fuzz_fixture(draw_fuzz_case(7, i)).data.q);
  }
  int same = 0;
  for (std::int64_t i = 0; i < 20; ++i) same += draw_fuzz_case(7, i).describe() == draw_fuzz_case(8, i).describe();
  EXPECT_LT(same, 3);
}

TEST(FuzzDraw, CoversEveryDtypeLayoutMaskBiasKvLenAndCausalRule) {
  std::set<std::string> seen;
  for (std::int64_t i = 0; i < 400; ++i) {
    const FuzzCase c = draw_fuzz_case(kSeed, i);
    const Problem p = Problem::parse(c.spec.problem);
    seen.insert(std::string(dtype_short_name(p.dtype)));
    seen.insert(std::string(layout_name(c.layout)));
    seen.insert("causal=" + std::string(causal_name(p.causal)));
    seen.insert("threads=" + std::to_string(c.threads));
    if (p.mask.present) seen.insert("mask");
    if (p.bias.present) seen.insert("bias");
    if (p.kv_len) seen.insert("kv_len");
    if (p.seq_k == 0) seen.insert("seq_k=0");
    if (p.seq_k > 1024 && p.seq_q <= 4) seen.insert("decode");
    if (p.head_dim != p.head_dim_v) seen.insert("dv!=d");
    if (p.heads_q > p.heads_kv) seen.insert("gqa");
    if (p.head_dim % 2 == 1) seen.insert("odd head_dim");
    if (p.has_window()) seen.insert("window");
    if (p.window_left == 0 || p.window_right == 0) seen.insert("window 0");
    if (p.softcap != 0) seen.insert("softcap");
    if (p.alibi) seen.insert("alibi");
    if (p.sinks) seen.insert("sinks");
    if (p.ragged) seen.insert("ragged");
    if (p.ragged && std::count(c.spec.recipe.k_lens.begin(), c.spec.recipe.k_lens.end(), 0) > 0) seen.insert("empty sequence");
    if (p.paged()) seen.insert("paged");
    if (c.layer()) {
      seen.insert("layer");
      if (c.spec.recipe.backward) seen.insert("layer backward");
      if (c.spec.kdim > 0) seen.insert("layer kdim");
      if (p.mask.present || p.kv_len) seen.insert("layer masked");
    }
    if (p.paged() && p.page_size == 1) seen.insert("page_size 1");
    for (const QuantSpec* spec : {&p.q_quant, &p.k_quant, &p.v_quant}) {
      if (!spec->quantised()) continue;
      seen.insert(std::string(encoding_short_name(spec->encoding)));
      if (spec->descale == Descale::entry_head) seen.insert("descale per head");
      if (spec->zero_point) seen.insert("zero point");
      if (spec->has_scale() && spec->scale[3] > 1) seen.insert("grouped scale");
      if (p.paged()) seen.insert("quantised paged");
    }
  }
  for (const char* want : {"f64", "f32", "f16", "bf16", "bhsd", "bshd", "causal=none", "causal=top_left",
                           "causal=bottom_right", "threads=1", "threads=8", "mask", "bias", "kv_len", "seq_k=0",
                           "decode", "dv!=d", "gqa", "odd head_dim", "window", "window 0", "softcap", "alibi", "sinks",
                           "ragged", "empty sequence", "paged", "page_size 1", "e4m3", "e5m2", "s8", "u8", "s4", "u4",
                           "q8_0", "q4_0", "descale per head", "zero point", "grouped scale", "quantised paged", "layer",
                           "layer backward", "layer kdim", "layer masked"}) {
    EXPECT_TRUE(seen.count(want)) << "400 cases of seed " << kSeed << " never drew " << want;
  }
}
