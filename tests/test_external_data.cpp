// Files written by other tools in the shared format verify unchanged: the
// h5py-written cases in tests/data, and the ONNX conformance cases in
// ../shared/conformance/onnx when that folder exists beside the project.
#include <gtest/gtest.h>

#include "core/registry.hpp"
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
  EXPECT_TRUE(summary.input_errors.empty()) << (summary.input_errors.empty() ? "" : summary.input_errors.front().message);
  EXPECT_GE(summary.outcomes.size(), at_least);
  for (const auto& o : summary.outcomes) {
    EXPECT_EQ(o.comparison.verdict, Verdict::pass) << o.file << ": " << o.comparison.reason;
  }
}

}  // namespace

TEST(ExternalData, H5pyWrittenFilesLoadAndPass) {
  std::vector<fs::path> files;
  for (const fs::path& f : find_fixture_files({fs::path(ATTN_SOURCE_DIR) / "tests" / "data"})) {
    if (f.filename().string().rfind("h5py_", 0) == 0) files.push_back(f);
  }
  ASSERT_EQ(files.size(), 4u);  // two sdpa cases, a PyTorch-style layer, and one's gradients (kdim, vdim)
  Fixture vlen = read_fixture(fs::path(ATTN_SOURCE_DIR) / "tests/data/h5py_vlen_bool_mask_compressed.h5");
  EXPECT_EQ(vlen.header.tags, (std::vector<std::string>{"h5py", "external"}));
  EXPECT_EQ(vlen.problem().to_string().find("mask=1x4x5,bias=2x1x1,kv_len") != std::string::npos, true);
  for (int j = 0; j < 7; ++j) EXPECT_EQ(vlen.data.mask[(1 * 5 + 2) * 7 + j], 0);  // the hidden row, from a bool enum
  Fixture fixed = read_fixture(fs::path(ATTN_SOURCE_DIR) / "tests/data/h5py_fixed_strings_int8_mask_f16.h5");
  EXPECT_EQ(fixed.problem().dtype, DType::f16);
  EXPECT_EQ(fixed.problem().head_dim_v, 8);
  EXPECT_FALSE(fixed.lse.has_value());
  expect_all_pass(files, 4);
}

TEST(ExternalData, OnnxConformanceCasesPass) {
  fs::path onnx = fs::path(ATTN_SOURCE_DIR) / ".." / "shared" / "conformance" / "onnx";
  if (!fs::is_directory(onnx)) GTEST_SKIP() << "no conformance data at " << onnx << " (shared/ is not beside the project)";
  auto files = find_fixture_files({onnx});
  EXPECT_GE(files.size(), 66u);
  expect_all_pass(files, 66);
}

// Version 2 files that NumPy computed and h5py wrote (tests/data/make_v2_cases.py):
// they load as written (an int32 format_version and window, variable-length
// strings, -1 in unused page slots) and every backend that declares the
// additions passes them; the others SKIP naming what they lack.
TEST(ExternalData, NumpyWrittenVersion2FilesLoadAndPass) {
  const fs::path data = fs::path(ATTN_SOURCE_DIR) / "tests" / "data";
  const Fixture dense = read_fixture(data / "numpy_v2_window_softcap_alibi_sinks_f32.h5");
  EXPECT_EQ(dense.problem().window_left, 3);
  EXPECT_EQ(dense.problem().window_right, 1);
  EXPECT_EQ(dense.problem().align, Align::top_left);
  EXPECT_EQ(dense.problem().softcap, 4.0);
  EXPECT_TRUE(dense.problem().alibi && dense.problem().sinks);
  const Fixture packed = read_fixture(data / "numpy_v2_ragged_f16.h5");
  EXPECT_EQ(packed.data.cu_seqlens_k, (std::vector<std::int64_t>{0, 4, 10, 10, 17}));
  const Fixture paged = read_fixture(data / "numpy_v2_paged_bf16.h5");
  EXPECT_EQ(paged.problem().page_size, 4);
  EXPECT_EQ(paged.problem().num_pages, 7);
  EXPECT_EQ(paged.data.page_table[3], -1);  // entry 1 holds no key: its slots are never read
  const std::vector<fs::path> files = {data / "numpy_v2_window_softcap_alibi_sinks_f32.h5", data / "numpy_v2_ragged_f16.h5",
                                       data / "numpy_v2_paged_bf16.h5"};
  const VerifySummary summary =
      verify(files, make_backends(std::vector<std::string>{"naive", "blocked", "streaming", "openblas", "onednn"}), {});
  EXPECT_TRUE(summary.input_errors.empty());
  int passed = 0;
  for (const auto& o : summary.outcomes) {
    if (o.comparison.verdict == Verdict::skip) {
      EXPECT_NE(o.comparison.reason.find("(format version 2)"), std::string::npos) << o.backend << ": " << o.comparison.reason;
      EXPECT_TRUE(o.backend == "openblas" || o.backend == "onednn") << o.backend << " " << o.fixture;
      continue;
    }
    EXPECT_EQ(o.comparison.verdict, Verdict::pass) << o.backend << " " << o.fixture << ": " << o.comparison.reason;
    ++passed;
  }
  EXPECT_EQ(passed, 3 * 3 + 2 + 1);  // naive, blocked, streaming all; openblas not paged; onednn only the packed one
}
