// Files written by other tools in the shared format verify unchanged: the
// h5py-written cases in tests/data, and the ONNX conformance cases in
// ../shared/conformance/onnx when that folder exists beside the project.
#include <gtest/gtest.h>

#include "fixtures/fixture.hpp"
#include "impls/naive/naive.hpp"
#include "verify/verifier.hpp"

using namespace attn;
namespace fs = std::filesystem;

namespace {

void expect_all_pass(const std::vector<fs::path>& files, std::size_t at_least) {
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(make_naive_backend());
  VerifySummary summary = verify(files, backends, {});
  EXPECT_TRUE(summary.input_errors.empty()) << (summary.input_errors.empty() ? "" : summary.input_errors.front());
  EXPECT_GE(summary.outcomes.size(), at_least);
  for (const auto& o : summary.outcomes) {
    EXPECT_EQ(o.comparison.verdict, Verdict::pass) << o.file << ": " << o.comparison.reason;
  }
}

}  // namespace

TEST(ExternalData, H5pyWrittenFilesLoadAndPass) {
  auto files = find_fixture_files({fs::path(ATTN_SOURCE_DIR) / "tests" / "data"});
  ASSERT_EQ(files.size(), 3u);  // two sdpa cases and a PyTorch-style layer
  Fixture vlen = read_fixture(fs::path(ATTN_SOURCE_DIR) / "tests/data/h5py_vlen_bool_mask_compressed.h5");
  EXPECT_EQ(vlen.header.tags, (std::vector<std::string>{"h5py", "external"}));
  EXPECT_EQ(vlen.problem().to_string().find("mask=1x4x5,bias=2x1x1,kv_len") != std::string::npos, true);
  for (int j = 0; j < 7; ++j) EXPECT_EQ(vlen.data.mask[(1 * 5 + 2) * 7 + j], 0);  // the hidden row, from a bool enum
  Fixture fixed = read_fixture(fs::path(ATTN_SOURCE_DIR) / "tests/data/h5py_fixed_strings_int8_mask_f16.h5");
  EXPECT_EQ(fixed.problem().dtype, DType::f16);
  EXPECT_EQ(fixed.problem().head_dim_v, 8);
  EXPECT_FALSE(fixed.lse.has_value());
  expect_all_pass(files, 3);
}

TEST(ExternalData, OnnxConformanceCasesPass) {
  fs::path onnx = fs::path(ATTN_SOURCE_DIR) / ".." / "shared" / "conformance" / "onnx";
  if (!fs::is_directory(onnx)) GTEST_SKIP() << "no conformance data at " << onnx << " (shared/ is not beside the project)";
  auto files = find_fixture_files({onnx});
  EXPECT_GE(files.size(), 66u);
  expect_all_pass(files, 66);
}
