// Fixtures are untrusted input: files that would make the reader open another
// file (external links, external raw storage, virtual datasets), or that use
// objects and filters the format does not have, are refused before anything
// is read, with a message naming the file and the object, and the rest of a
// run goes on.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>

#include "core/error.hpp"
#include "core/sandbox.hpp"
#include "fixtures/fixture.hpp"

using namespace attn;
namespace fs = std::filesystem;

namespace {

const fs::path kGolden = fs::path(ATTN_SOURCE_DIR) / "fixtures" / "golden";

class Hostile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("attn_hostile_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A valid fixture, then `edit` on the open file.
  fs::path make(const std::string& name, const std::function<void(hid_t)>& edit) {
    const fs::path path = dir_ / (name + ".h5");
    fs::copy_file(kGolden / "basic" / "b1_h2_q4_k4_d8_f32.h5", path);
    hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    EXPECT_GE(file, 0);
    edit(file);
    H5Fclose(file);
    return path;
  }
  void expect_refused(const fs::path& path, const std::string& words) {
    try {
      read_fixture(path);
      ADD_FAILURE() << path << " was read";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path.string()), std::string::npos) << what;
      EXPECT_NE(what.find(words), std::string::npos) << what;
      EXPECT_EQ(what.find("root:"), std::string::npos) << "bytes of /etc/passwd in: " << what;
    }
  }
  fs::path dir_;
};

void replace_with(hid_t file, const char* name, const std::function<void()>& make) {
  ASSERT_GE(H5Ldelete(file, name, H5P_DEFAULT), 0);
  make();
}

}  // namespace

TEST_F(Hostile, AnExternalLinkIsRefused) {
  const fs::path other = dir_ / "other.h5";
  fs::copy_file(kGolden / "basic" / "b1_h2_q4_k4_d8_f32.h5", other);
  const fs::path path = make("external_link", [&](hid_t f) {
    replace_with(f, "v", [&] { H5Lcreate_external(other.c_str(), "/v", f, "v", H5P_DEFAULT, H5P_DEFAULT); });
  });
  expect_refused(path, "external or user-defined link");
}

TEST_F(Hostile, ASoftLinkIsRefused) {
  const fs::path path = make("soft_link", [](hid_t f) {
    replace_with(f, "v", [&] { H5Lcreate_soft("/k", f, "v", H5P_DEFAULT, H5P_DEFAULT); });
  });
  expect_refused(path, "soft link");
}

TEST_F(Hostile, ExternalRawStorageIsRefusedAndNoByteOfTheOtherFileShows) {
  const fs::path path = make("external_storage", [](hid_t f) {
    replace_with(f, "v", [&] {
      hsize_t dims[4] = {1, 2, 4, 8};
      hid_t space = H5Screate_simple(4, dims, nullptr);
      hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
      H5Pset_external(dcpl, "/etc/passwd", 0, 64 * sizeof(float));
      hid_t d = H5Dcreate2(f, "v", H5T_NATIVE_FLOAT, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
      H5Dclose(d);
      H5Pclose(dcpl);
      H5Sclose(space);
    });
  });
  expect_refused(path, "external raw files");
}

TEST_F(Hostile, AVirtualDatasetIsRefused) {
  const fs::path path = make("virtual", [](hid_t f) {
    replace_with(f, "v", [&] {
      hsize_t dims[4] = {1, 2, 4, 8};
      hid_t space = H5Screate_simple(4, dims, nullptr);
      hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
      H5Pset_virtual(dcpl, space, "missing_source.h5", "/v", space);
      hid_t d = H5Dcreate2(f, "v", H5T_NATIVE_FLOAT, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
      H5Dclose(d);
      H5Pclose(dcpl);
      H5Sclose(space);
    });
  });
  expect_refused(path, "virtual dataset");
}

TEST_F(Hostile, GroupsFiltersAndHugeChunksAreRefused) {
  expect_refused(make("group", [](hid_t f) { H5Gclose(H5Gcreate2(f, "extra", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)); }),
                 "is a group");
  expect_refused(make("nbit", [](hid_t f) {
                   hsize_t dims[1] = {16}, chunk[1] = {16};
                   hid_t space = H5Screate_simple(1, dims, nullptr);
                   hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
                   H5Pset_chunk(dcpl, 1, chunk);
                   H5Pset_nbit(dcpl);
                   H5Dclose(H5Dcreate2(f, "extra", H5T_NATIVE_INT, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
                   H5Pclose(dcpl);
                   H5Sclose(space);
                 }),
                 "only deflate, shuffle and fletcher32");
  expect_refused(make("huge_chunk", [](hid_t f) {
                   hsize_t dims[1] = {16}, max[1] = {H5S_UNLIMITED}, chunk[1] = {hsize_t{1} << 28};  // 2 GiB of doubles (HDF5 allows up to 4 GiB)
                   hid_t space = H5Screate_simple(1, dims, max);
                   hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
                   H5Pset_chunk(dcpl, 1, chunk);
                   H5Pset_deflate(dcpl, 9);
                   H5Dclose(H5Dcreate2(f, "extra", H5T_NATIVE_DOUBLE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
                   H5Pclose(dcpl);
                   H5Sclose(space);
                 }),
                 "declares chunks of");
}

TEST_F(Hostile, TheRunGoesOnAndExitsTwo) {
  make("soft_link", [](hid_t f) { replace_with(f, "v", [&] { H5Lcreate_soft("/k", f, "v", H5P_DEFAULT, H5P_DEFAULT); }); });
  fs::copy_file(kGolden / "basic" / "b1_h2_q4_k4_d8_f16.h5", dir_ / "good.h5");
  const std::string command = std::string(ATTN_CLI) + " verify " + dir_.string() + " --backend naive --json " +
                              (dir_ / "v.json").string() + " > " + (dir_ / "out.txt").string() + " 2>&1";
  const int status = std::system(command.c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  std::ifstream out(dir_ / "out.txt");
  const std::string text((std::istreambuf_iterator<char>(out)), {});
  EXPECT_NE(text.find("input error: " + (dir_ / "soft_link.h5").string() + ": `v` is a soft link"), std::string::npos) << text;
  EXPECT_NE(text.find("basic/b1_h2_q4_k4_d8_f16"), std::string::npos) << "the good fixture still ran: " << text;
  EXPECT_NE(text.find("PASS"), std::string::npos) << text;
}

TEST_F(Hostile, WorkBeyondTheLimitIsRefusedWithHowToRaiseIt) {
  ::setenv("ATTN_MAX_WORK", "1000", 1);
  try {
    read_fixture(kGolden / "mha" / "b2_h4_q17_k33_d64_f32.h5");
    ADD_FAILURE() << "read past the work limit";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("set ATTN_MAX_WORK"), std::string::npos) << e.what();
  }
  ::setenv("ATTN_MAX_WORK", "1e12", 1);
  EXPECT_NO_THROW(read_fixture(kGolden / "mha" / "b2_h4_q17_k33_d64_f32.h5"));
  ::unsetenv("ATTN_MAX_WORK");
}

// ---- The sandboxed reader ----------------------------------------------------

TEST(Sandbox, ACrashAHangAndAnAllocationBombComeBackAsMessages) {
  SandboxLimits limits;
  limits.wall_seconds = 2;
  limits.memory_gib = 1;
  EXPECT_EQ(run_sandboxed([] {}, limits), "");
  EXPECT_EQ(run_sandboxed([] { throw InputError("bad file"); }, limits), "bad file");
  const std::string crash = run_sandboxed([] { std::raise(SIGSEGV); }, limits);
#if defined(__SANITIZE_ADDRESS__)
  EXPECT_FALSE(crash.empty());  // ASan catches the signal and exits with a status of its own
#else
  EXPECT_NE(crash.find("crashed the reader (signal 11"), std::string::npos) << crash;
#endif
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NE(run_sandboxed([] { for (;;) ::pause(); }, limits).find("did not finish within 2 s"), std::string::npos);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
#if !defined(__SANITIZE_ADDRESS__)
  const std::string bomb = run_sandboxed(
      [] {
        std::vector<char> huge(std::size_t{4} << 30);
        huge[12345] = 1;
      },
      limits);
  EXPECT_NE(bomb.find("more than the 1 GiB"), std::string::npos) << bomb;
#endif
}
