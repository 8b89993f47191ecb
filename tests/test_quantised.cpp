// Format version 4: the decoders against the encodings' definitions, the
// problem strings and their rules, fixtures that other tools wrote (h5py and
// NumPy, tests/data/make_v4_cases.py), a golden computed from the original
// values refused, and the scale-plumbing probe catching a descale dropped
// where the case's own descale is 1.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "attnbench/error.hpp"
#include "attnbench/quant.hpp"
#include "core/quantise.hpp"
#include "core/registry.hpp"
#include "fixtures/fixture.hpp"
#include "fixtures/suite.hpp"
#include "tests/mutants/catalogue.hpp"
#include "verify/invariance.hpp"
#include "verify/relations.hpp"
#include "verify/verifier.hpp"

using namespace attn;
namespace fs = std::filesystem;

namespace {

const fs::path kData = fs::path(ATTN_SOURCE_DIR) / "tests" / "data";

std::string input_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no input error)";
}

const CaseSpec& suite_case(const std::string& name) {
  for (const CaseSpec& spec : standard_suite()) {
    if (spec.name == name) return spec;
  }
  throw std::runtime_error("no suite case " + name);
}

std::unique_ptr<Backend> mutant(const std::string& name) {
  for (const auto& m : attn::testing::mutants()) {
    if (m.name == name) return m.make();
  }
  throw std::runtime_error("no mutant " + name);
}

}  // namespace

TEST(Quantised, E4m3CodesAreTheirDefinition) {
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);             // S.1111.110: the largest
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // the smallest normal
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(e4m3_to_float(0xB8), -1.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)) && std::isnan(e4m3_to_float(0xFF)));
  for (int code = 0; code < 256; ++code) {  // every finite code survives a round trip
    const float x = e4m3_to_float(static_cast<std::uint8_t>(code));
    if (std::isnan(x) || code == 0x80) continue;  // -0 encodes as +0's sign bit kept: checked below
    EXPECT_EQ(float_to_e4m3(x), code) << code;
  }
  EXPECT_EQ(float_to_e4m3(-0.0), 0x80);
  EXPECT_EQ(float_to_e4m3(1.0625), 0x38);   // a tie between 1 and 1.125: the even mantissa
  EXPECT_EQ(float_to_e4m3(1.1875), 0x3A);   // a tie between 1.125 and 1.25: the even one, 1.25
  EXPECT_EQ(float_to_e4m3(1000.0), 0x7E);   // saturated
  EXPECT_EQ(float_to_e4m3(1000.0, false), 0x7F);  // no infinity: NaN
}

TEST(Quantised, E5m2IsTheTopByteOfAHalf) {
  EXPECT_EQ(e5m2_to_float(0x3C), 1.0f);
  EXPECT_EQ(e5m2_to_float(0x7B), 57344.0f);
  EXPECT_EQ(e5m2_to_float(0x01), std::ldexp(1.0f, -16));
  EXPECT_TRUE(std::isinf(e5m2_to_float(0x7C)));
  EXPECT_EQ(float_to_e5m2(1.0), 0x3C);
  EXPECT_EQ(float_to_e5m2(1e6), 0x7B);
  EXPECT_EQ(float_to_e5m2(1e6, false), 0x7C);
  EXPECT_EQ(float_to_e5m2(1.125), 0x3C);  // a tie between 1 and 1.25: the even code
}

TEST(Quantised, NibblesAndBlocksAreReadInTheDocumentedOrder) {
  const std::uint8_t int4[] = {0x21, 0x8F};  // elements 0, 1 in byte 0 (low, high), 2, 3 in byte 1
  float out[4];
  decode_row(Encoding::s4, int4, 4, out);
  EXPECT_EQ(std::vector<float>(out, out + 4), (std::vector<float>{1, 2, -1, -8}));
  decode_row(Encoding::u4, int4, 3, out);  // an odd width: the last high nibble is padding
  EXPECT_EQ(std::vector<float>(out, out + 3), (std::vector<float>{1, 2, 15}));
  std::uint8_t q4[18] = {0x00, 0x40};  // d = 2 (float16 0x4000, little-endian)
  for (int n = 0; n < 16; ++n) q4[2 + n] = static_cast<std::uint8_t>(n | ((15 - n) << 4));
  float block[32];
  decode_row(Encoding::q4_0, q4, 32, block);
  for (int n = 0; n < 16; ++n) {
    EXPECT_EQ(block[n], 2.0f * static_cast<float>(n - 8)) << n;           // low nibble of byte n: element n
    EXPECT_EQ(block[n + 16], 2.0f * static_cast<float>(7 - n)) << n;      // high nibble: element n + 16
  }
  std::uint8_t q8[34] = {0x00, 0xB8};  // d = -0.5
  q8[2] = 0x80;                        // -128
  q8[33] = 0x7F;
  decode_row(Encoding::q8_0, q8, 32, block);
  EXPECT_EQ(block[0], 64.0f);
  EXPECT_EQ(block[31], -63.5f);
  // ggml's reference quantiser, then decode: Q8_0 within half a step of d;
  // Q4_0 maps the block's extreme to -8 and clamps the other side at 7, so
  // values near the opposite extreme lose up to a whole step.
  std::vector<double> x(64);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<double>(i)) * 3.0;
  for (Encoding e : {Encoding::q8_0, Encoding::q4_0}) {
    std::vector<std::uint8_t> row(static_cast<std::size_t>(encoded_row_bytes(e, 64)));
    ggml_quantise_row(e, x.data(), 64, row.data());
    std::vector<float> back(64);
    decode_row(e, row.data(), 64, back.data());
    const double allowed = e == Encoding::q8_0 ? 0.51 * 3.0 / 127 : 1.01 * 3.0 / 8;
    for (std::size_t i = 0; i < x.size(); ++i) EXPECT_LE(std::fabs(back[i] - x[i]), allowed) << encoding_name(e) << i;
  }
}

TEST(Quantised, ProblemStringsRoundTripAndTheRulesNameWhatIsWrong) {
  const Problem p = Problem::parse("dtype=bf16,b=2,hq=8,hkv=2,sq=1,sk=64,d=64,qenc=e4m3,qdescale=head,kenc=u4,kscale=2x2x64x4,kzp,"
                                   "venc=q8_0,vdescale=tensor");
  EXPECT_EQ(Problem::parse(p.to_string()), p);
  EXPECT_EQ(p.k_quant.encoding, Encoding::u4);
  EXPECT_EQ(p.k_quant.scale, (std::array<std::int64_t, 4>{2, 2, 64, 4}));
  EXPECT_EQ(p.encodings(), encoding_bit(Encoding::e4m3) | encoding_bit(Encoding::u4) | encoding_bit(Encoding::q8_0));
  EXPECT_NE(input_error_of([] { Problem::parse("dtype=f32,b=1,hq=1,hkv=1,sq=1,sk=4,d=48,kenc=q4_0"); }).find("not a multiple of 32"),
            std::string::npos);
  EXPECT_NE(input_error_of([] { Problem::parse("dtype=f32,b=1,hq=1,hkv=1,sq=1,sk=4,d=32,kenc=s8,kdescale=tensor"); })
                .find("integer encodings take a scale"),
            std::string::npos);
  EXPECT_NE(input_error_of([] { Problem::parse("dtype=f32,b=1,hq=1,hkv=1,sq=1,sk=4,d=32,kenc=s8,kscale=1x1x3x1"); })
                .find("along seq, expected 1 or 4"),
            std::string::npos);
  EXPECT_NE(input_error_of([] { Problem::parse("dtype=f32,b=1,hq=1,hkv=1,sq=1,sk=4,d=32,kenc=fp9"); }).find("not an encoding"),
            std::string::npos);
  // No backward pass through codes.
  EXPECT_FALSE(backward_defined(p).ok);
}

TEST(Quantised, GeneratedFixturesRoundTripThroughTheFile) {
  const fs::path dir = fs::path(::testing::TempDir()) / "quantised_round_trip";
  for (const char* name : {"quantised/int4_uint4_odd_width_f16", "quantised/q8_0_q4_0_paged_f16", "quantised/e4m3_qkv_ragged_f32"}) {
    const Fixture made = generate_fixture(suite_case(name));
    const fs::path path = dir / (std::string(name) + ".h5");
    write_fixture(made, path);
    const Fixture read = read_fixture(path);
    EXPECT_EQ(read.header.format_version, 4);
    EXPECT_EQ(read.problem(), made.problem());
    for (char t : {'q', 'k', 'v'}) {
      EXPECT_EQ(read.data.quant(t), made.data.quant(t)) << name << " " << t;
      EXPECT_EQ(read.data.values(t), made.data.values(t)) << name << " " << t;
    }
    EXPECT_TRUE(read.header.has_tag("quantised"));
  }
}

TEST(Quantised, FilesThatNumpyWroteLoadAndPass) {
  const std::vector<fs::path> files = {kData / "numpy_v4_e4m3_kv_f32.h5", kData / "numpy_v4_q8_0_k_int4_v_bf16.h5",
                                       kData / "numpy_v4_int8_k_zero_point_f32.h5"};
  const Fixture e4m3 = read_fixture(files[0]);
  EXPECT_EQ(e4m3.problem().k_quant.descale, Descale::tensor);      // a scalar dataset
  EXPECT_EQ(e4m3.problem().v_quant.descale, Descale::entry_head);  // [batch, heads_kv]
  EXPECT_TRUE(e4m3.header.has_tag("fp8") && e4m3.header.has_tag("float8_e4m3fn"));
  const Fixture int8 = read_fixture(files[2]);
  EXPECT_EQ(int8.data.k_quant.codes.size(), 2u * 9 * 8);  // bytes of an int8 dataset, negative codes included
  const VerifySummary summary = verify(files, make_backends(std::vector<std::string>{"naive", "blocked", "streaming"}), {});
  EXPECT_TRUE(summary.input_errors.empty());
  ASSERT_EQ(summary.outcomes.size(), 9u);
  for (const auto& o : summary.outcomes) {
    EXPECT_EQ(o.comparison.verdict, Verdict::pass) << o.backend << " " << o.fixture << ": " << o.comparison.reason;
  }
  // The originals are reported as the quantisation's error, beside the verdict.
  EXPECT_TRUE(summary.outcomes.front().quantisation.has_value());
  EXPECT_GT(summary.outcomes.front().quantisation->relative, 0.0);
}

// Written with other tools' quantisers (tests/data/make_outside_v4_cases.py:
// ml_dtypes' float8 and int4 casts, gguf-py's Q8_0 and Q4_0), from the docs
// page alone. The paged one's free slots hold blocks that dequantise beyond
// float16's range; no entry reads them, so the file is valid, but the same
// block in a slot an entry reads is an input error naming the element.
TEST(Quantised, FilesThatMlDtypesAndGgufWroteLoadAndPass) {
  const std::vector<fs::path> files = {kData / "mldtypes_v4_e4m3_kv_head_descale_gqa_decode_f32.h5",
                                       kData / "mldtypes_gguf_v4_e5m2_q_e4m3_k_q8_0_v_causal_bf16.h5",
                                       kData / "gguf_v4_q8_0_k_q4_0_v_paged_huge_free_slots_f16.h5",
                                       kData / "mldtypes_v4_u8_k_group_zp_int4_v_causal_f32.h5"};
  const VerifySummary summary = verify(files, make_backends(std::vector<std::string>{"naive", "blocked", "streaming"}), {});
  EXPECT_TRUE(summary.input_errors.empty()) << summary.input_errors.front().message;
  ASSERT_EQ(summary.outcomes.size(), 12u);
  for (const auto& o : summary.outcomes) {
    EXPECT_EQ(o.comparison.verdict, Verdict::pass) << o.backend << " " << o.fixture << ": " << o.comparison.reason;
  }

  Fixture paged = read_fixture(files[2]);
  const CaseData& data = paged.data;
  const std::vector<char> read = data.read_rows('k');
  const auto shape = data.problem.stored_shape('k');
  const std::int64_t width = shape[3], row_bytes = shape[3] / 32 * 34;
  double largest_unread = 0;
  std::int64_t first_read = -1, first_unread = -1;
  for (std::int64_t page = 0; page < shape[0]; ++page)
    for (std::int64_t slot = 0; slot < shape[2]; ++slot) {
      const bool is_read = read[static_cast<std::size_t>(page * shape[2] + slot)] != 0;
      const std::int64_t row = page * shape[1] * shape[2] + slot;  // kv head 0
      if (is_read && first_read < 0) first_read = row;
      if (is_read) continue;
      if (first_unread < 0) first_unread = row;
      for (std::int64_t d = 0; d < width; ++d) {
        largest_unread = std::max(largest_unread, std::fabs(data.k[static_cast<std::size_t>(row * width + d)]));
      }
    }
  EXPECT_GT(largest_unread, 65504.0) << "the free slots should hold values beyond float16's range";
  ASSERT_GE(first_read, 0);
  ASSERT_GE(first_unread, 0);
  CaseData poisoned = data;
  std::copy_n(poisoned.k_quant.codes.begin() + first_unread * row_bytes, row_bytes,
              poisoned.k_quant.codes.begin() + first_read * row_bytes);
  poisoned.dequantise();
  const std::string error = input_error_of([&] { poisoned.validate(); });
  EXPECT_NE(error.find("k[" + std::to_string(first_read * width) + "] dequantises to"), std::string::npos) << error;
  EXPECT_NE(error.find("beyond float16's largest finite value"), std::string::npos) << error;
}

TEST(Quantised, AGoldenOfTheOriginalValuesIsAnInputError) {
  const VerifySummary summary =
      verify({kData / "numpy_v4_e4m3_golden_from_originals_f32.refused"}, make_backends(std::vector<std::string>{"naive"}), {});
  ASSERT_EQ(summary.input_errors.size(), 1u);
  EXPECT_NE(summary.input_errors[0].message.find("not the attention of its own inputs"), std::string::npos);
}

TEST(Quantised, ANanCodeAndAWrongDescaleShapeAreInputErrorsNamingThem) {
  Fixture f = generate_fixture(suite_case("quantised/e4m3_kv_saturated_f32"));
  f.data.k_quant.codes[5] = 0x7F;  // NaN
  CaseData data = f.data;
  EXPECT_NE(input_error_of([&] { data.dequantise(); }).find("k[0][0][0][5]: its float8_e4m3fn code is nan"), std::string::npos);
  CaseData wrong = generate_fixture(suite_case("quantised/e4m3_kv_saturated_f32")).data;
  wrong.v_quant.descale.push_back(1.0f);
  EXPECT_NE(input_error_of([&] { wrong.dequantise(); }).find("v_descale has 2 elements, expected 1"), std::string::npos);
}

// A descale of exactly 1 hides a backend that drops it from the plain
// comparison: the probe's descales (powers of two) do not.
TEST(Quantised, TheScaleProbeCatchesADroppedDescaleOfOne) {
  Fixture f = generate_fixture(suite_case("quantised/e4m3_kv_decode_gqa_bf16"));
  std::fill(f.data.v_quant.descale.begin(), f.data.v_quant.descale.end(), 1.0f);
  f.data.dequantise();
  f.out.clear();
  f.lse.reset();
  const std::unique_ptr<Backend> dropped = mutant("quant_v_descale_dropped");
  const VerifySummary summary = verify_fixture(f, {dropped.get()}, {}, /*trusted_golden=*/true);
  ASSERT_EQ(summary.outcomes.size(), 1u);
  const Comparison& c = summary.outcomes[0].comparison;
  EXPECT_EQ(c.verdict, Verdict::fail);
  ASSERT_NE(c.tensor("out"), nullptr);
  EXPECT_FALSE(c.tensor("out")->failed()) << "the plain comparison alone cannot see it";
  EXPECT_NE(c.reason.find("v_descale"), std::string::npos) << c.reason;
  // And the correct naive passes the same probes.
  const auto backends = make_backends(std::vector<std::string>{"naive"});
  const VerifySummary good = verify_fixture(f, {backends.front().get()}, {}, true);
  EXPECT_EQ(good.outcomes[0].comparison.verdict, Verdict::pass) << good.outcomes[0].comparison.reason;
}

TEST(Quantised, FreeSlotsHoldHugeCodesThatNoEntryReads) {
  const CaseData data = generate_inputs(suite_case("quantised/e4m3_kv_paged_decode_bf16"));
  const Problem& p = data.problem;
  std::vector<char> read(static_cast<std::size_t>(p.num_pages * p.page_size), 0);
  for (std::int64_t e = 0; e < p.batch; ++e)
    for (std::int64_t j = 0; j < data.seq_lens[static_cast<std::size_t>(e)]; ++j) {
      read[static_cast<std::size_t>(data.page_table[static_cast<std::size_t>(e * p.pages_per_entry() + j / p.page_size)] * p.page_size +
                                    j % p.page_size)] = 1;
    }
  int poisoned = 0;
  for (std::size_t slot = 0; slot < read.size(); ++slot) {
    if (read[slot]) continue;
    const std::size_t page = slot / static_cast<std::size_t>(p.page_size), s = slot % static_cast<std::size_t>(p.page_size);
    EXPECT_EQ(data.k_quant.codes[((page * static_cast<std::size_t>(p.heads_kv)) * static_cast<std::size_t>(p.page_size) + s) *
                                 static_cast<std::size_t>(p.head_dim)],
              0x7E);
    ++poisoned;
  }
  EXPECT_GT(poisoned, 100);
}

// Batch invariance (verify/invariance.cpp) over quantised cases: every run
// gives each original entry exactly its codes, scales, zero points,
// descales and values, and keeps the scales' shape (an axis broadcast in the
// case stays broadcast), or is not built; per-entry scales cannot go into a
// packed batch (one stored batch), and the reason says so.
TEST(Quantised, BatchInvarianceRunsCarryEveryEntrysCodesInTheScalesOwnShape) {
  std::vector<CaseSpec> specs;
  for (const CaseSpec& spec : standard_suite()) {
    if (spec.tags.find("quantised") != std::string::npos && spec.model_dim == 0) specs.push_back(spec);
  }
  // A packed batch whose first entry has no query (padded neighbours), per-token int8 K with zero points.
  CaseSpec packed = specs.front();
  packed.name = "packed_u8_per_token";
  packed.problem = "dtype=f32,b=3,hq=2,hkv=1,sq=12,sk=30,d=32,causal=bottom_right,ragged,kenc=u8,kscale=1x1x30x2,kzp,"
                   "venc=s4,vscale=1x1x1x4,qenc=e4m3,qdescale=head";
  packed.recipe.q_lens = {0, 5, 7};
  packed.recipe.k_lens = {9, 11, 10};
  specs.push_back(packed);
  int runs_checked = 0, cases_checked = 0;
  for (const CaseSpec& spec : specs) {
    const CaseData data = generate_inputs(spec);
    if (data.problem.batch < 2) continue;
    ++cases_checked;
    const std::vector<BatchEntry> entries = batch_entries(data);
    for (const InvarianceRun& run : invariance_runs(data, 0)) {
      SCOPED_TRACE(spec.name + ", " + run.what);
      ASSERT_NO_THROW(run.data.validate_shapes());
      const std::vector<BatchEntry> got = batch_entries(run.data);
      ASSERT_EQ(got.size(), run.source.size());
      for (std::size_t e = 0; e < got.size(); ++e) {
        if (run.source[e] >= 0) {
          EXPECT_EQ(got[e], entries[static_cast<std::size_t>(run.source[e])]) << "entry " << e;
        }
      }
      for (char t : {'q', 'k', 'v'}) {
        const QuantSpec& was = data.problem.quant(t);
        const QuantSpec& now = run.data.problem.quant(t);
        ASSERT_EQ(was.encoding, now.encoding);
        EXPECT_EQ(was.descale, now.descale);
        const auto shape = run.data.problem.stored_shape(t);
        for (std::size_t a = 0; a < 3 && was.has_scale(); ++a) {
          EXPECT_EQ(now.scale[a], was.scale[a] == 1 ? 1 : shape[a]) << t << " axis " << a;
        }
      }
      ++runs_checked;
    }
  }
  EXPECT_GE(cases_checked, 10);
  EXPECT_GE(runs_checked, 80);

  // Per-entry scales ([batch, 1, 1, 1]) cannot be held by one packed stored batch.
  CaseSpec per_entry = specs.front();
  per_entry.name = "per_entry_scales";
  per_entry.problem = "dtype=f32,b=2,hq=2,hkv=1,sq=3,sk=17,d=32,kenc=s8,kscale=2x1x1x1,venc=e5m2,vdescale=head";
  const CaseData data = generate_inputs(per_entry);
  ASSERT_NE(data.k_quant.scale[0], data.k_quant.scale[1]);
  const Assembled packed_run = assemble(data, batch_entries(data), Arrangement::packed);
  EXPECT_FALSE(packed_run.data);
  EXPECT_NE(packed_run.why_not.find("k's scales of shape [2, 1, 1, 1] cannot keep that shape in a packed batch"),
            std::string::npos) << packed_run.why_not;
  const Assembled paged_run = assemble(data, batch_entries(data), Arrangement::paged, 4);
  ASSERT_TRUE(paged_run.data) << paged_run.why_not;  // a page's scale: each entry's own pages
  EXPECT_EQ(paged_run.data->problem.k_quant.scale[0], paged_run.data->problem.num_pages);
}

// The relations permute a quantised tensor's codes, scales, zero points
// and per-(entry, kv head) descales with its values: the codes of every
// permuted run dequantise to exactly the values the run holds, and naive
// keeps both permutations bitwise on such a case.
TEST(Quantised, PermutationsCarryTheCodesScalesAndDescales) {
  CaseSpec spec = suite_case("quantised/e4m3_kv_decode_gqa_bf16");
  spec.name = "permuted_codes";
  spec.problem = "dtype=f32,b=2,hq=4,hkv=2,sq=5,sk=9,d=32,kenc=u8,kscale=2x2x9x2,kzp,venc=e4m3,vdescale=head,"
                 "vscale=1x2x1x1,qenc=e5m2,qdescale=head";
  Fixture f = generate_fixture(spec);
  std::vector<std::string> left_out;
  const std::vector<RelationRun> runs = relation_runs(f.data, nullptr, 0, &left_out, kRelationHeadPermutation | kRelationKeyPermutation);
  ASSERT_EQ(runs.size(), 2u) << (left_out.empty() ? "" : left_out.front());
  for (const RelationRun& run : runs) {
    SCOPED_TRACE(run.what);
    CaseData again = run.data;
    again.dequantise();
    EXPECT_EQ(again.q, run.data.q);
    EXPECT_EQ(again.k, run.data.k);
    EXPECT_EQ(again.v, run.data.v);
    EXPECT_NE(run.data.k_quant.codes, f.data.k_quant.codes);
    EXPECT_NE(run.data.k_quant.scale, f.data.k_quant.scale);
  }
  EXPECT_NE(runs[0].data.v_quant.descale, f.data.v_quant.descale);  // kv heads reversed
  const auto backends = make_backends(std::vector<std::string>{"naive"});
  VerifyOptions options;
  options.relations = true;
  const VerifySummary summary = verify_fixture(f, {backends.front().get()}, options, /*trusted_golden=*/true);
  int exact = 0;
  for (const CaseOutcome& o : summary.outcomes) {
    if (o.check.find("permutation") == std::string::npos) continue;
    EXPECT_EQ(o.comparison.verdict, Verdict::pass) << o.comparison.reason;
    exact += o.comparison.reason.find("EXACT") != std::string::npos;
  }
  EXPECT_EQ(exact, 2);
}
