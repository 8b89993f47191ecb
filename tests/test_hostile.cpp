// Fixtures are untrusted input: files that would make the reader open another
// file (external links, external raw storage, virtual datasets), or that use
// objects and filters the format does not have, are refused before anything
// is read, with a message naming the file and the object, and the rest of a
// run goes on.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <hdf5.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <cstring>
#include <functional>
#include <thread>

#include "attnbench/error.hpp"
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

// ---- Every hostile file through `attn verify`, measured -----------------------
//
// Each hostile file sits in a folder with a good fixture. `attn verify` must
// exit 2 naming the file and the problem, within a few seconds and well under
// 1 GB (the peak resident size of attn and of its reader processes, from
// wait4), still verify the good fixture, write whole JSON and JUnit, and show
// no byte of another file and no raw control character.

namespace {

struct Outcome {
  int exit_code = -1;
  int signal = 0;
  double seconds = 0;
  double peak_mib = 0;
  std::string output;
};

Outcome run_attn(const std::vector<std::string>& args, const fs::path& log) {
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> argv{const_cast<char*>(ATTN_CLI)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(ATTN_CLI, argv.data());
    ::_exit(127);
  }
  Outcome outcome;
  int status = 0;
  rusage usage{};
  while (::wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  outcome.peak_mib = static_cast<double>(usage.ru_maxrss) / 1024.0;  // the largest of attn and its reaped children
  if (WIFEXITED(status)) outcome.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) outcome.signal = WTERMSIG(status);
  std::ifstream in(log, std::ios::binary);
  outcome.output.assign(std::istreambuf_iterator<char>(in), {});
  return outcome;
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void set_integer(hid_t file, const char* name, std::int64_t value) {
  H5Adelete(file, name);
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t attr = H5Acreate2(file, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(attr, H5T_NATIVE_INT64, &value);
  H5Aclose(attr);
  H5Sclose(space);
}

// A dataset of `dims` with nothing written, its creation properties set by
// `configure` (external storage, a virtual layout, chunks), replacing any old one.
void put_declared(hid_t file, const char* name, std::vector<hsize_t> dims, hid_t type,
                  const std::function<void(hid_t dcpl, hid_t space)>& configure) {
  if (H5Lexists(file, name, H5P_DEFAULT) > 0) H5Ldelete(file, name, H5P_DEFAULT);
  hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  configure(dcpl, space);
  H5Dclose(H5Dcreate2(file, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
  H5Pclose(dcpl);
  H5Sclose(space);
}

// A zlib stream of `mib` MiB of zeros.
std::vector<unsigned char> deflated_zeros(std::size_t mib, int level) {
  std::vector<unsigned char> zeros(std::size_t{1} << 20), buffer(std::size_t{1} << 20), out;
  z_stream z{};
  deflateInit(&z, level);
  for (std::size_t i = 0; i < mib; ++i) {
    z.next_in = zeros.data();
    z.avail_in = static_cast<uInt>(zeros.size());
    const int flush = i + 1 == mib ? Z_FINISH : Z_NO_FLUSH;
    do {
      z.next_out = buffer.data();
      z.avail_out = static_cast<uInt>(buffer.size());
      deflate(&z, flush);
      out.insert(out.end(), buffer.data(), buffer.data() + (buffer.size() - z.avail_out));
    } while (z.avail_out == 0);
  }
  deflateEnd(&z);
  return out;
}

// A deflated dataset whose every chunk is the given raw (already compressed) bytes.
void put_raw_chunks(hid_t file, const char* name, std::vector<hsize_t> dims, std::vector<hsize_t> chunk, hid_t type,
                    const std::vector<unsigned char>& raw) {
  H5Ldelete(file, name, H5P_DEFAULT);
  hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
  H5Pset_deflate(dcpl, 1);
  hid_t d = H5Dcreate2(file, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  std::vector<hsize_t> offset(dims.size(), 0);
  for (;;) {
    H5Dwrite_chunk(d, H5P_DEFAULT, 0, offset.data(), raw.size(), raw.data());
    std::size_t a = offset.size();
    while (a-- > 0) {
      offset[a] += chunk[a];
      if (offset[a] < dims[a]) break;
      offset[a] = 0;
    }
    if (a == static_cast<std::size_t>(-1)) break;
  }
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(space);
}

// Zeros of the given shape, stored in full (deflated).
void put_zeros(hid_t file, const char* name, std::vector<hsize_t> dims, hid_t type) {
  std::size_t count = 1;
  for (hsize_t d : dims) count *= static_cast<std::size_t>(d);
  std::vector<double> zeros(count, 0.0);
  H5Ldelete(file, name, H5P_DEFAULT);
  hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, static_cast<int>(dims.size()), dims.data());
  H5Pset_deflate(dcpl, 9);
  hid_t d = H5Dcreate2(file, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros.data());
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(space);
}

// Makes a long, thin case: one head dimension, seq_q = seq_k = n, zeros.
void make_long_thin(hid_t f, std::int64_t n) {
  set_integer(f, "seq_q", n);
  set_integer(f, "seq_k", n);
  set_integer(f, "head_dim", 1);
  set_integer(f, "head_dim_v", 1);
  H5Ldelete(f, "lse", H5P_DEFAULT);
  const hsize_t len = static_cast<hsize_t>(n);
  for (const char* name : {"q", "k", "v"}) put_zeros(f, name, {1, 2, len, 1}, H5T_IEEE_F32LE);
  put_zeros(f, "out", {1, 2, len, 1}, H5T_IEEE_F64LE);
}

// A copy of `source` with one object's 8-byte field in the global heap
// collection (where variable-length strings live) replaced.
void damage_heap(const fs::path& path, std::size_t field_offset, std::uint64_t value) {
  std::string bytes = slurp(path);
  const std::size_t heap = bytes.find("GCOL");
  ASSERT_NE(heap, std::string::npos) << "no global heap in " << path;
  std::memcpy(bytes.data() + heap + field_offset, &value, sizeof value);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

struct HostileFile {
  std::string name;
  std::string words;  // in the message
  std::function<void(const fs::path&)> make;  // writes the file at this path
};

void PrintTo(const HostileFile& file, std::ostream* os) { *os << file.name; }

class HostileRun : public Hostile, public ::testing::WithParamInterface<HostileFile> {};

const fs::path kGood = kGolden / "basic" / "b1_h2_q4_k4_d8_f32.h5";

void edit(const fs::path& path, const std::function<void(hid_t)>& change) {
  fs::copy_file(kGood, path, fs::copy_options::overwrite_existing);
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  change(file);
  H5Fclose(file);
}

// A fixture whose description is a variable-length string (as h5py writes).
void with_vlen_description(const fs::path& path) {
  edit(path, [](hid_t f) {
    H5Adelete(f, "description");
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(f, "description", type, space, H5P_DEFAULT, H5P_DEFAULT);
    const char* text = "a description held in the global heap";
    H5Awrite(attr, type, &text);
    H5Aclose(attr);
    H5Sclose(space);
    H5Tclose(type);
  });
}

std::vector<HostileFile> hostile_files() {
  return {
      {"external_link", "external or user-defined link",
       [](const fs::path& p) {
         edit(p, [&](hid_t f) {
           H5Ldelete(f, "v", H5P_DEFAULT);
           H5Lcreate_external(kGood.c_str(), "/v", f, "v", H5P_DEFAULT, H5P_DEFAULT);
         });
       }},
      {"soft_link", "is a soft link",
       [](const fs::path& p) {
         edit(p, [](hid_t f) {
           H5Ldelete(f, "v", H5P_DEFAULT);
           H5Lcreate_soft("/k", f, "v", H5P_DEFAULT, H5P_DEFAULT);
         });
       }},
      {"external_storage", "keeps its data in external raw files",
       [](const fs::path& p) {
         edit(p, [](hid_t f) {
           put_declared(f, "v", {1, 2, 4, 8}, H5T_NATIVE_FLOAT,
                        [](hid_t dcpl, hid_t) { H5Pset_external(dcpl, "/etc/passwd", 0, 64 * sizeof(float)); });
         });
       }},
      {"virtual_dataset", "is a virtual dataset",
       [](const fs::path& p) {
         edit(p, [](hid_t f) {
           put_declared(f, "v", {1, 2, 4, 8}, H5T_NATIVE_FLOAT, [](hid_t dcpl, hid_t space) {
             H5Pset_virtual(dcpl, space, "missing_source.h5", "/v", space);
           });
         });
       }},
      // 256 bytes of v whose one chunk inflates to 1.5 GiB (7 MB stored,
      // more than deflating 256 bytes can ever take).
      {"deflate_bomb", "stored bytes, more than a chunk of 256 bytes can take",
       [](const fs::path& p) {
         const std::vector<unsigned char> bomb = deflated_zeros(1536, 1);
         edit(p, [&](hid_t f) { put_raw_chunks(f, "v", {1, 2, 4, 8}, {1, 2, 4, 8}, H5T_IEEE_F32LE, bomb); });
       }},
      // A bomb small enough to be stored: the first 250 bytes of 1 MiB of
      // zeros deflated at level 9 (1039 bytes) inflate to 240 KB, far past
      // the chunk's 256 bytes: inflating stops at the chunk.
      {"small_deflate_bomb", "does not inflate to at most the chunk's 256 bytes",
       [](const fs::path& p) {
         std::vector<unsigned char> bomb = deflated_zeros(1, 9);
         bomb.resize(250);  // a prefix of the stream: it still inflates far past 256 bytes before it ends
         edit(p, [&](hid_t f) { put_raw_chunks(f, "v", {1, 2, 4, 8}, {1, 2, 4, 8}, H5T_IEEE_F32LE, bomb); });
       }},
      // A chunk that inflates to less than a chunk: HDF5 would leave the rest unset.
      {"short_chunk", "holds 16 bytes once unfiltered; a chunk is 256 bytes",
       [](const fs::path& p) {
         const std::vector<unsigned char> bytes(16, 0);
         std::vector<unsigned char> raw(compressBound(16));
         uLongf size = raw.size();
         compress2(raw.data(), &size, bytes.data(), 16, 6);
         raw.resize(size);
         edit(p, [&](hid_t f) { put_raw_chunks(f, "v", {1, 2, 4, 8}, {1, 2, 4, 8}, H5T_IEEE_F32LE, raw); });
       }},
      // A 2^30-element mask declared and never written: 8 KB of file.
      {"declared_mask", "`mask` stores 0 of its",
       [](const fs::path& p) {
         edit(p, [](hid_t f) {
           make_long_thin(f, 32768);
           put_declared(f, "mask", {1, 1, 32768, 32768}, H5T_STD_U8LE, [](hid_t dcpl, hid_t) {
             const hsize_t chunk[4] = {1, 1, 64, 32768};
             H5Pset_chunk(dcpl, 4, chunk);
             H5Pset_deflate(dcpl, 1);
           });
         });
       }},
      // The same mask really stored (four 256 MiB chunks of zeros, 1 MB of
      // file): 2^31 multiply-adds pass the work limit, the memory limit refuses.
      {"stored_huge_mask", "more than the limit of 2.00 GiB; set ATTN_MAX_CASE_GIB",
       [](const fs::path& p) {
         const std::vector<unsigned char> chunk = deflated_zeros(256, 9);
         edit(p, [&](hid_t f) {
           make_long_thin(f, 32768);
           put_raw_chunks(f, "mask", {1, 1, 32768, 32768}, {1, 1, 8192, 32768}, H5T_STD_U8LE, chunk);
         });
       }},
      // A 2^34-element bias declared and never written.
      {"declared_bias", "`bias` stores 0 of its",
       [](const fs::path& p) {
         edit(p, [](hid_t f) {
           make_long_thin(f, 4);
           set_integer(f, "seq_q", 131072);
           set_integer(f, "seq_k", 131072);
           put_declared(f, "bias", {1, 1, 131072, 131072}, H5T_IEEE_F64LE, [](hid_t dcpl, hid_t) {
             const hsize_t chunk[4] = {1, 1, 256, 131072};
             H5Pset_chunk(dcpl, 4, chunk);
           });
         });
       }},
      // 2^33 multiply-adds of stored zeros: hours of work in a small file.
      {"time_bomb", "set ATTN_MAX_WORK", [](const fs::path& p) { edit(p, [](hid_t f) { make_long_thin(f, 65536); }); }},
      // The length of the description's heap object made huge: libhdf5 1.10.8
      // reads past its buffer in H5HG_read and dies of SIGSEGV.
      {"damaged_heap_object",
#if defined(__SANITIZE_ADDRESS__)
       "reading it",  // ASan reports the fault itself and exits with its own status
#else
       "reading it crashed the reader (signal 11",
#endif
       [](const fs::path& p) {
         with_vlen_description(p);
         damage_heap(p, 24, 0x7fffffffffffff00u);
       }},
      // The heap collection's own size made huge.
      {"damaged_heap_collection", "cannot read attribute 'description'",
       [](const fs::path& p) {
         with_vlen_description(p);
         damage_heap(p, 8, 0xffffffffffffu);
       }},
      {"truncated", "cannot open the HDF5 file (truncated or damaged?)",
       [](const fs::path& p) {
         fs::copy_file(kGood, p);
         fs::resize_file(p, fs::file_size(p) / 2);
       }},
  };
}

}  // namespace

TEST_P(HostileRun, ExitsTwoQuicklyInBoundedMemoryAndTheRunGoesOn) {
  const HostileFile& hostile = GetParam();
  const fs::path path = dir_ / (hostile.name + ".h5");
  hostile.make(path);
  ASSERT_TRUE(fs::exists(path));
  EXPECT_LT(fs::file_size(path), std::uintmax_t{16} << 20) << "the hostile file itself is small";
  fs::copy_file(kGolden / "basic" / "b1_h2_q4_k4_d8_f16.h5", dir_ / "good.h5");
  const fs::path json = dir_ / "out" / "v.json", junit = dir_ / "out" / "v.xml";
  const Outcome run = run_attn({"verify", dir_.string(), "-b", "naive", "--json", json.string(), "--junit",
                                junit.string()},
                               dir_ / "log.txt");
  EXPECT_EQ(run.signal, 0) << run.output;
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("input error: " + path.string() + ": "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find(hostile.words), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("basic/b1_h2_q4_k4_d8_f16"), std::string::npos) << "the good fixture ran: " << run.output;
  EXPECT_LT(run.seconds, 10.0) << run.output;
  EXPECT_LT(run.peak_mib, 1024.0) << "peak resident MiB of attn and its readers";
  RecordProperty("seconds", std::to_string(run.seconds));
  RecordProperty("peak_mib", std::to_string(run.peak_mib));
  const std::string outputs = run.output + slurp(json) + slurp(junit);
  EXPECT_EQ(outputs.find("root:x:"), std::string::npos) << "a byte of /etc/passwd reached an output";
  for (char c : run.output) {
    const auto byte = static_cast<unsigned char>(c);
    EXPECT_TRUE(byte == '\n' || (byte >= 0x20 && byte < 0x7f)) << "raw byte " << int(byte) << " in the output";
  }
  const std::string check = "python3 -c \"import json, sys, xml.dom.minidom; d = json.load(open(sys.argv[1])); "
                            "assert d['summary']['input_errors'] >= 1, d['summary']; xml.dom.minidom.parse(sys.argv[2])\" " +
                            json.string() + " " + junit.string();
  EXPECT_EQ(std::system(check.c_str()), 0) << "JSON and JUnit are whole and well-formed";
}

INSTANTIATE_TEST_SUITE_P(Files, HostileRun, ::testing::ValuesIn(hostile_files()),
                         [](const auto& param_info) { return param_info.param.name; });

// Names that a terminal or an XML parser would choke on: control characters
// and invalid UTF-8 in the file name.
TEST_F(Hostile, ControlCharactersAndInvalidUtf8InANameAreEscapedEverywhere) {
  const fs::path path = dir_ / "evil\x1b[31m\xff\x01name.h5";
  edit(path, [](hid_t f) {
    H5Ldelete(f, "v", H5P_DEFAULT);
    H5Lcreate_soft("/k", f, "v", H5P_DEFAULT, H5P_DEFAULT);
  });
  fs::copy_file(kGolden / "basic" / "b1_h2_q4_k4_d8_f16.h5", dir_ / "good.h5");
  const fs::path json = dir_ / "v.json", junit = dir_ / "v.xml";
  const Outcome run =
      run_attn({"verify", dir_.string(), "-b", "naive", "--json", json.string(), "--junit", junit.string()},
               dir_ / "log.txt");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("is a soft link"), std::string::npos) << run.output;
  for (char c : run.output) {
    const auto byte = static_cast<unsigned char>(c);
    EXPECT_TRUE(byte == '\n' || (byte >= 0x20 && byte < 0x7f)) << "raw byte " << int(byte) << " in the output";
  }
  EXPECT_NE(run.output.find("evil\\x1b[31m\\xff\\x01name.h5"), std::string::npos) << "escaped name: " << run.output;
  const std::string check = "python3 -c \"import json, sys, xml.dom.minidom; json.load(open(sys.argv[1], "
                            "encoding='utf-8')); xml.dom.minidom.parse(sys.argv[2])\" " +
                            json.string() + " " + junit.string();
  EXPECT_EQ(std::system(check.c_str()), 0) << "JSON and JUnit are whole and well-formed";
}

// A file truncated while it is read: libhdf5 reads the missing bytes of
// uncompressed data as zeros. Every read either gives the file's true values
// or an input error.
TEST_F(Hostile, AFileTruncatedWhileItIsReadIsNeverReadAsZeros) {
  const fs::path source = dir_ / "contiguous.h5";  // 530 KB, every dataset uncompressed
  const std::string repack = "h5repack -l CONTIG " +
                             (kGolden / "accumulation" / "q4_k4096_d16_positive_v_f32.h5").string() + " " +
                             source.string();
  ASSERT_EQ(std::system(repack.c_str()), 0);
  const Fixture truth = read_fixture(source);
  const fs::path path = dir_ / "moving.h5";
  int errors = 0, whole = 0;
  for (int attempt = 0; attempt < 100; ++attempt) {
    fs::copy_file(source, path, fs::copy_options::overwrite_existing);
    const auto half = fs::file_size(path) / 2;
    std::thread cut([&, attempt] {
      std::this_thread::sleep_for(std::chrono::microseconds(20 * attempt));
      ::truncate(path.c_str(), static_cast<off_t>(half));
    });
    try {
      const Fixture f = read_fixture(path);
      EXPECT_EQ(f.data.v, truth.data.v) << "attempt " << attempt << " read wrong values without an error";
      EXPECT_EQ(f.out, truth.out) << "attempt " << attempt;
      ++whole;
    } catch (const InputError& e) {
      ++errors;
    }
    cut.join();
  }
  RecordProperty("whole", whole);
  RecordProperty("errors", errors);
  EXPECT_GT(errors, 0) << "no read was cut: the test did not test anything";
}

// Folders a user cannot read or write (as root, the check drops to `nobody`,
// for whom permissions hold). Found with the reason, exit 2, before any work.
TEST_F(Hostile, AnUnreadableInputAndAnUnwritableOutputAreExitTwoWithTheReason) {
  const fs::path locked = dir_ / "locked", read_only = dir_ / "read_only";
  fs::create_directories(locked);
  fs::create_directories(read_only);
  fs::copy_file(kGood, locked / "case.h5");
  fs::copy_file(kGood, dir_ / "case.h5");
  fs::permissions(dir_, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                            fs::perms::others_read | fs::perms::others_exec);
  fs::permissions(locked, fs::perms::none);
  fs::permissions(read_only, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::others_read |
                                 fs::perms::others_exec);
  const std::string as_user = ::geteuid() == 0 ? "setpriv --reuid=65534 --regid=65534 --clear-groups " : "";
  auto run = [&](const std::string& args) {
    const std::string command = "cd / && " + as_user + ATTN_CLI + " " + args + " > " + (dir_ / "log.txt").string() +
                                " 2>&1";
    const int status = std::system(command.c_str());
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(dir_ / "log.txt"));
  };
  auto [code, text] = run("verify " + locked.string() + " -b naive");
  EXPECT_EQ(code, 2) << text;
  EXPECT_NE(text.find(locked.string() + ": cannot list the folder: Permission denied"), std::string::npos) << text;
  std::tie(code, text) = run("verify " + (locked / "case.h5").string() + " -b naive");
  EXPECT_EQ(code, 2) << text;
  EXPECT_NE(text.find("Permission denied"), std::string::npos) << text;
  fs::copy_file(kGood, dir_ / "unreadable.h5");
  fs::permissions(dir_ / "unreadable.h5", fs::perms::none);
  std::tie(code, text) = run("verify " + (dir_ / "unreadable.h5").string() + " -b naive");
  EXPECT_EQ(code, 2) << text;
  EXPECT_NE(text.find((dir_ / "unreadable.h5").string() + ": cannot read it: Permission denied"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("not an HDF5 file"), std::string::npos) << text;
  std::tie(code, text) = run("verify " + (dir_ / "case.h5").string() + " -b naive --json " +
                             (read_only / "v.json").string());
  EXPECT_EQ(code, 2) << text;
  EXPECT_NE(text.find((read_only / "v.json").string() + ": cannot create it in " + read_only.string() +
                      ": Permission denied"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("PASS"), std::string::npos) << "refused before the run: " << text;
  fs::permissions(locked, fs::perms::owner_all);
  fs::permissions(read_only, fs::perms::owner_all);
}

// ---- The sandboxed reader ----------------------------------------------------

// Work that allocates `gib` GiB and touches it.
std::function<void()> touch_gib(double gib) {
  return [gib] {
    std::vector<char> block(static_cast<std::size_t>(gib * 1024 * 1024 * 1024));
    block[12345] = 1;
  };
}

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
  const std::string bomb = run_sandboxed(touch_gib(4), limits);
  EXPECT_NE(bomb.find("more than the 1 GiB"), std::string::npos) << bomb;
#endif
}

// The reader's address-space limit counts from what the process it is forked
// from maps: a Python process with PyTorch and JAX loaded maps several GiB it
// never touches (4.5 GiB with torch 2.15 and jax 0.10), and with a limit on
// the total every read of python.frameworks failed ("needs 0.00 GiB, more than
// the 0.00 GiB of address space this process may still map"). A reservation
// larger than the limit stands in for them; the bomb is still caught.
TEST(Sandbox, TheAddressLimitCountsFromWhatTheParentAlreadyMaps) {
  constexpr std::size_t kReserved = std::size_t{12} << 30;
  void* reserved = ::mmap(nullptr, kReserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(reserved, MAP_FAILED);
  SandboxLimits limits;
  limits.wall_seconds = 10;
  limits.memory_gib = 1;
  EXPECT_EQ(run_sandboxed(touch_gib(0.25), limits), "");
#if !defined(__SANITIZE_ADDRESS__)
  const std::string bomb = run_sandboxed(touch_gib(4), limits);
  EXPECT_NE(bomb.find("more than the 1 GiB"), std::string::npos) << bomb;
#endif
  ::munmap(reserved, kReserved);
}
