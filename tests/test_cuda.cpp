// The CUDA backends are built here (nvcc, no GPU): without a device they are
// listed as unavailable with the reason and every case is SKIP with it; no
// test passes or fails in their name. With a device, scripts/gpu-check is the
// check, so these tests skip.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include "core/registry.hpp"
#include "fixtures/fixture.hpp"
#include "verify/verifier.hpp"

using namespace attn;
namespace fs = std::filesystem;

TEST(CudaBackends, WithoutADeviceTheyAreUnavailableAndSkipWithTheReason) {
  auto backends = make_backends(std::vector<std::string>{"cuda-cublas", "cuda-flash"});
  ASSERT_EQ(backends.size(), 2u);
  Status status = backends[0]->available();
  if (status) GTEST_SKIP() << "a CUDA device is present: run scripts/gpu-check to verify the CUDA backends";
  // The reason names what is missing: no driver at all, or a driver without a GPU.
  void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  const std::string expected = driver ? "no CUDA device" : "no NVIDIA driver on this machine";
  if (driver) ::dlclose(driver);
  EXPECT_NE(status.reason.find(expected), std::string::npos) << status.reason;
  EXPECT_EQ(status.reason.find("insufficient"), std::string::npos) << status.reason;
  VerifySummary summary = verify(find_fixture_files({fs::path(ATTN_SOURCE_DIR) / "fixtures/golden/basic"}), backends, {});
  ASSERT_EQ(summary.outcomes.size(), 8u);
  for (const auto& o : summary.outcomes) {
    EXPECT_EQ(o.comparison.verdict, Verdict::skip);
    EXPECT_NE(o.comparison.reason.find(expected), std::string::npos) << o.comparison.reason;
  }
  EXPECT_EQ(summary.failed(), 0);
}
