// Fixture files: round trip, bit-identical writes, and a clear error for every
// kind of malformed input.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <thread>
#include <variant>

#include "attnbench/error.hpp"
#include "fixtures/fixture.hpp"
#include "fixtures/h5.hpp"
#include "fixtures/suite.hpp"

using namespace attn;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir() {
  fs::path dir = fs::temp_directory_path() / ("attn_fixture_io_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A small valid case written field by field, so each test can break one thing.
struct RawCase {
  std::map<std::string, std::variant<std::string, std::int64_t, double>> attrs = {
      {"format", std::string("attn-fixture")}, {"format_version", std::int64_t{1}},
      {"name", std::string("raw/case")},       {"dtype", std::string("float32")},
      {"batch", std::int64_t{2}},              {"heads_q", std::int64_t{2}},
      {"heads_kv", std::int64_t{1}},           {"seq_q", std::int64_t{3}},
      {"seq_k", std::int64_t{4}},              {"head_dim", std::int64_t{2}},
      {"head_dim_v", std::int64_t{2}},         {"scale", 0.5},
      {"causal", std::string("none")}};
  struct Dataset {
    std::vector<std::int64_t> dims;
    std::vector<double> values;
    h5::File::Stored stored = h5::File::Stored::float32;
  };
  std::map<std::string, Dataset> datasets = {
      {"q", {{2, 2, 3, 2}, std::vector<double>(24, 0.5)}},
      {"k", {{2, 1, 4, 2}, std::vector<double>(16, 0.25)}},
      {"v", {{2, 1, 4, 2}, std::vector<double>(16, 1.0)}},
      {"out", {{2, 2, 3, 2}, std::vector<double>(24, 1.0), h5::File::Stored::float64}},
  };

  void write(const fs::path& path) const {
    h5::File file = h5::File::create(path);
    for (const auto& [name, value] : attrs) std::visit([&](const auto& v) { file.write_attribute(name, v); }, value);
    for (const auto& [name, d] : datasets) {
      if (d.stored == h5::File::Stored::int64) {
        std::vector<std::int64_t> ints(d.values.begin(), d.values.end());
        file.write_dataset(name, d.dims, ints.data());
      } else if (d.stored == h5::File::Stored::uint8) {
        std::vector<std::uint8_t> bytes(d.values.begin(), d.values.end());
        file.write_dataset(name, d.dims, bytes.data());
      } else {
        file.write_dataset(name, d.dims, d.values.data(), d.stored);
      }
    }
  }
};

class FixtureIo : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = temp_dir(); }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `raw` after `edit` and returns the reader's error message ("" if it loaded).
  std::string error_after(const std::function<void(RawCase&)>& edit) {
    RawCase raw;
    edit(raw);
    fs::path path = dir_ / "case.h5";
    raw.write(path);
    return error_of(path);
  }
  static std::string error_of(const fs::path& path) {
    try {
      read_fixture(path);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

#define EXPECT_ERROR(message, expected)                                              \
  do {                                                                               \
    std::string got_ = (message);                                                    \
    EXPECT_NE(got_.find(expected), std::string::npos) << "error was: '" << got_ << "'"; \
  } while (0)

}  // namespace

TEST_F(FixtureIo, TheRawCaseIsValid) { EXPECT_EQ(error_after([](RawCase&) {}), ""); }

TEST_F(FixtureIo, RoundTripKeepsEveryField) {
  const CaseSpec* spec = nullptr;
  for (const auto& s : standard_suite()) {
    if (s.name == "bias/mask_and_bias_2x1x1_f16") spec = &s;
  }
  ASSERT_NE(spec, nullptr);
  Fixture written = generate_fixture(*spec);
  written.header.atol = 1e-3;
  fs::path path = dir_ / "nested" / "case.h5";
  write_fixture(written, path);
  Fixture read = read_fixture(path);
  EXPECT_EQ(read.header.name, written.header.name);
  EXPECT_EQ(read.header.description, written.header.description);
  EXPECT_EQ(read.header.tags, written.header.tags);
  EXPECT_EQ(read.header.atol, 1e-3);
  EXPECT_FALSE(read.header.rtol.has_value());
  EXPECT_EQ(read.problem(), written.problem());
  EXPECT_EQ(read.data.q, written.data.q);
  EXPECT_EQ(read.data.k, written.data.k);
  EXPECT_EQ(read.data.v, written.data.v);
  EXPECT_EQ(read.data.mask, written.data.mask);
  EXPECT_EQ(read.data.bias, written.data.bias);
  EXPECT_EQ(read.out, written.out);
  EXPECT_EQ(read.lse, written.lse);
}

TEST_F(FixtureIo, WritesAreBitIdenticalAcrossTime) {
  Fixture f = generate_fixture(standard_suite().front());
  write_fixture(f, dir_ / "a.h5");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // any timestamp would now differ
  write_fixture(f, dir_ / "b.h5");
  EXPECT_EQ(read_bytes(dir_ / "a.h5"), read_bytes(dir_ / "b.h5"));
}

TEST_F(FixtureIo, MissingAndNonHdf5Files) {
  EXPECT_ERROR(error_of(dir_ / "absent.h5"), "no such file");
  std::ofstream(dir_ / "text.h5") << "not hdf5 at all";
  EXPECT_ERROR(error_of(dir_ / "text.h5"), "not an HDF5 file");
}

TEST_F(FixtureIo, TruncatedFilesFailWithThePath) {
  RawCase raw;
  raw.datasets["q"].values.assign(24, 0.75);
  fs::path whole = dir_ / "whole.h5";
  raw.write(whole);
  std::string bytes = read_bytes(whole);
  for (double keep : {0.1, 0.5, 0.9, 0.99}) {
    fs::path cut = dir_ / "cut.h5";
    std::ofstream(cut, std::ios::binary) << bytes.substr(0, static_cast<std::size_t>(static_cast<double>(bytes.size()) * keep));
    std::string error = error_of(cut);
    EXPECT_ERROR(error, cut.string());
  }
}

TEST_F(FixtureIo, WrongRootAttributes) {
  EXPECT_ERROR(error_after([](RawCase& r) { r.attrs["format"] = std::string("attn-fixtur"); }),
               "attribute 'format' is 'attn-fixtur', expected 'attn-fixture'");
  EXPECT_ERROR(error_after([](RawCase& r) { r.attrs["format_version"] = std::int64_t{5}; }), "'format_version' is 5, expected 1, 2, 3 or 4");
  // A version 1 file carrying a version 4 field (quantised inputs).
  EXPECT_ERROR(error_after([](RawCase& r) { r.attrs["k_encoding"] = std::string("int8"); }),
               "'k_encoding' belongs to format version 4 (quantised inputs), but 'format_version' is 1");
  // A version 1 file carrying a version 2 field: its writer did not mean it.
  EXPECT_ERROR(error_after([](RawCase& r) { r.attrs["window_left"] = std::int64_t{2}; }),
               "attribute 'window_left' belongs to format version 2, but 'format_version' is 1");
  EXPECT_ERROR(error_after([](RawCase& r) { r.attrs.erase("seq_k"); }), "missing root attribute 'seq_k'");
  EXPECT_ERROR(error_after([](RawCase& r) { r.attrs["seq_q"] = std::string("three"); }), "'seq_q' is string, expected an integer");
  EXPECT_ERROR(error_after([](RawCase& r) { r.attrs["seq_q"] = 2.5; }), "'seq_q' is 2.5, expected an integer");
  EXPECT_ERROR(error_after([](RawCase& r) { r.attrs["dtype"] = std::string("float8"); }), "'dtype' is 'float8'");
  EXPECT_ERROR(error_after([](RawCase& r) { r.attrs["dtype"] = std::string("f32"); }), "'dtype' is 'f32'");
  EXPECT_ERROR(error_after([](RawCase& r) { r.attrs["causal"] = std::string("lower"); }), "'causal' is 'lower'");
  EXPECT_ERROR(error_after([](RawCase& r) { r.attrs["scale"] = std::numeric_limits<double>::infinity(); }), "scale is inf");
  EXPECT_ERROR(error_after([](RawCase& r) {
                 r.attrs["heads_q"] = std::int64_t{3};
                 r.attrs["heads_kv"] = std::int64_t{2};
               }),
               "heads_q=3 is not a multiple of heads_kv=2");
  EXPECT_ERROR(error_after([](RawCase& r) { r.attrs["atol"] = -1.0; }), "'atol' is -1");
  EXPECT_ERROR(error_after([](RawCase& r) { r.attrs["kind"] = std::string("conv"); }), "'kind' is 'conv'");
  EXPECT_ERROR(error_after([](RawCase& r) { r.attrs["head_dim"] = std::int64_t{0}; }), "head_dim is 0");
}

TEST_F(FixtureIo, WrongDatasetShapesAndTypes) {
  EXPECT_ERROR(error_after([](RawCase& r) { r.datasets["q"].dims = {2, 2, 2, 3}; }), "dataset 'q' has shape [2, 2, 2, 3], expected [2, 2, 3, 2]");
  EXPECT_ERROR(error_after([](RawCase& r) { r.datasets.erase("out"); }), "missing dataset 'out'");
  EXPECT_ERROR(error_after([](RawCase& r) { r.datasets["k"].stored = h5::File::Stored::int64; }), "dataset 'k' is int64, expected floating point");
  EXPECT_ERROR(error_after([](RawCase& r) { r.datasets["mask"] = {{1, 1, 3}, std::vector<double>(3, 1), h5::File::Stored::uint8}; }),
               "dataset 'mask' has rank 3");
  EXPECT_ERROR(error_after([](RawCase& r) { r.datasets["mask"] = {{3, 1, 1, 4}, std::vector<double>(12, 1), h5::File::Stored::uint8}; }),
               "mask batch dimension is 3");
  EXPECT_ERROR(error_after([](RawCase& r) { r.datasets["mask"] = {{1, 1, 1, 5}, std::vector<double>(5, 1), h5::File::Stored::uint8}; }),
               "'mask' has last dimension 5, expected seq_k = 4");
  EXPECT_ERROR(error_after([](RawCase& r) { r.datasets["mask"] = {{1, 1, 1, 4}, std::vector<double>(4, 1), h5::File::Stored::float32}; }),
               "dataset 'mask' is float32, expected uint8, int8 or bool");
  EXPECT_ERROR(error_after([](RawCase& r) { r.datasets["kv_len"] = {{2}, {1.0, 2.0}, h5::File::Stored::float64}; }),
               "dataset 'kv_len' is float64, expected int64");
  EXPECT_ERROR(error_after([](RawCase& r) { r.datasets["kv_len"] = {{3}, {1, 2, 3}, h5::File::Stored::int64}; }),
               "dataset 'kv_len' has shape [3], expected [2]");
  EXPECT_ERROR(error_after([](RawCase& r) { r.datasets["lse"] = {{2, 2, 3}, std::vector<double>(12, std::nan("")), h5::File::Stored::float64}; }),
               "dataset 'lse' holds nan");
}

TEST_F(FixtureIo, ValuesTheFormatForbids) {
  EXPECT_ERROR(error_after([](RawCase& r) { r.datasets["q"].values[5] = std::nan(""); }), "dataset 'q' holds nan at flat index 5");
  EXPECT_ERROR(error_after([](RawCase& r) { r.datasets["v"].values[0] = INFINITY; }), "dataset 'v' holds inf at flat index 0");
  EXPECT_ERROR(error_after([](RawCase& r) { r.datasets["out"].values[3] = std::nan(""); }), "dataset 'out' holds nan");
  EXPECT_ERROR(error_after([](RawCase& r) { r.datasets["bias"] = {{1, 1, 1, 4}, {0, INFINITY, 0, 0}}; }), "dataset 'bias' holds inf at flat index 1");
  EXPECT_EQ(error_after([](RawCase& r) { r.datasets["bias"] = {{1, 1, 1, 4}, {0, -INFINITY, 0, 0}}; }), "");
  EXPECT_ERROR(error_after([](RawCase& r) {
                 r.attrs["dtype"] = std::string("float16");
                 r.datasets["q"].values[2] = 0.1;
               }),
               "q[2] = 0.10000000149011612 is not exactly representable in float16");
  EXPECT_ERROR(error_after([](RawCase& r) { r.datasets["kv_len"] = {{2}, {4, 5}, h5::File::Stored::int64}; }),
               "kv_len[1] = 5, expected 0 <= kv_len <= seq_k = 4");
  EXPECT_ERROR(error_after([](RawCase& r) { r.datasets["kv_len"] = {{2}, {-1, 2}, h5::File::Stored::int64}; }), "kv_len[0] = -1");
}

TEST_F(FixtureIo, ImpossibleSizesAreRefusedBeforeAllocating) {
  // Attributes claim more than the datasets hold.
  EXPECT_ERROR(error_after([](RawCase& r) { r.attrs["seq_q"] = std::int64_t{1'000'000'000'000}; }), "dataset 'q' has shape");
  // Sizes whose element count overflows.
  EXPECT_ERROR(error_after([](RawCase& r) {
                 r.attrs["seq_q"] = std::int64_t{1} << 40;
                 r.attrs["head_dim"] = std::int64_t{1} << 40;
               }),
               "overflows");
  // Datasets that really declare a huge shape (chunked, never written, so the
  // file is tiny): the reader must refuse rather than try to allocate.
  fs::path path = dir_ / "huge.h5";
  {
    h5::File file = h5::File::create(path);
    RawCase raw;
    const std::int64_t huge = std::int64_t{1} << 33;  // q alone would take 2^36 doubles
    raw.attrs["seq_q"] = huge;
    for (const auto& [name, value] : raw.attrs) std::visit([&](const auto& v) { file.write_attribute(name, v); }, value);
    file.write_unwritten_dataset("q", {2, 2, huge, 2}, h5::File::Stored::float32);
    file.write_unwritten_dataset("k", {2, 1, 4, 2}, h5::File::Stored::float32);
    file.write_unwritten_dataset("v", {2, 1, 4, 2}, h5::File::Stored::float32);
    file.write_unwritten_dataset("out", {2, 2, huge, 2}, h5::File::Stored::float64);
  }
  EXPECT_LT(fs::file_size(path), 1u << 20);
  EXPECT_ERROR(error_of(path), "stores 0 of its");
  // A case whose stored data is more than the memory a case may take.
  {
    RawCase raw;
    raw.write(dir_ / "stored.h5");
    ::setenv("ATTN_MAX_CASE_GIB", "1e-9", 1);
    EXPECT_ERROR(error_of(dir_ / "stored.h5"), "more than the limit of 0.00 GiB; set ATTN_MAX_CASE_GIB");
    ::setenv("ATTN_MAX_CASE_GIB", "-1", 1);
    EXPECT_ERROR(error_of(dir_ / "stored.h5"), "ATTN_MAX_CASE_GIB=-1: expected a positive number of GiB");
    ::unsetenv("ATTN_MAX_CASE_GIB");
    EXPECT_EQ(error_of(dir_ / "stored.h5"), "");
  }
}

// Work and memory are bounded from what the file declares, before the
// work: a packed batch by its entries' own work (many one-query entries
// cost little, whatever the dense bound), and the memory a case needs
// against the address space this process may still map (ulimit -v), in a
// child process under such a limit.
TEST_F(FixtureIo, WorkAndMemoryAreBoundedByWhatTheFileDeclares) {
  CaseSpec packed{.name = "packed", .tags = "full", .description = "512 entries of one query and one key",
                  .problem = "dtype=f32,b=512,hq=1,hkv=1,sq=512,sk=512,d=4,ragged"};
  packed.recipe.q_lens.assign(512, 1);
  packed.recipe.k_lens.assign(512, 1);
  write_fixture(generate_fixture(packed), dir_ / "packed.h5");
  ::setenv("ATTN_MAX_WORK", "1e5", 1);  // the dense bound, 512 x 512 x 8, is 2.1e6; the entries' work 4096
  EXPECT_EQ(error_of(dir_ / "packed.h5"), "");
  ::setenv("ATTN_MAX_WORK", "4000", 1);
  EXPECT_ERROR(error_of(dir_ / "packed.h5"), "asks for 4.1e+03 multiply-adds, more than the limit of 4e+03");
  ::unsetenv("ATTN_MAX_WORK");

  CaseSpec large{.name = "large", .tags = "full", .description = "k and v of 2^19 elements each",
                 .problem = "dtype=f32,b=1,hq=1,hkv=1,sq=1,sk=65536,d=8"};
  write_fixture(generate_fixture(large), dir_ / "large.h5");
  // 0: refused naming the address space; 1: loaded; 2: another error.
  auto under_limit = [&](double extra_bytes) {
    const pid_t child = fork();
    if (child == 0) {
      double pages = 0;
      std::ifstream("/proc/self/statm") >> pages;
      struct rlimit limit {};
      limit.rlim_cur = limit.rlim_max = static_cast<rlim_t>(pages * static_cast<double>(sysconf(_SC_PAGESIZE)) + extra_bytes);
      setrlimit(RLIMIT_AS, &limit);
      const std::string error = error_of(dir_ / "large.h5");
      _exit(error.empty() ? 1 : error.find("of address space this process may still map (ulimit -v)") != std::string::npos ? 0 : 2);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  EXPECT_EQ(under_limit(32.0 * (1 << 20)), 0);  // the estimate, 8 copies of 2^20 doubles, is 64 MiB
  EXPECT_EQ(under_limit(1024.0 * (1 << 20)), 1);
}

TEST_F(FixtureIo, FindsFixturesInFoldersSorted) {
  RawCase raw;
  fs::create_directories(dir_ / "b");
  raw.write(dir_ / "b" / "2.h5");
  raw.write(dir_ / "a.h5");
  std::ofstream(dir_ / "notes.txt") << "ignored";
  auto files = find_fixture_files({dir_});
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].filename(), "a.h5");
  EXPECT_ERROR([&] {
    try {
      find_fixture_files({dir_ / "missing"});
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  }(), "no such file or folder");
}

// Format version 2: a paged and a packed case load; every broken field is an
// input error that names it. (Hostile sizes go through the same checks as
// version 1: declared shapes first, memory before reading.)
TEST_F(FixtureIo, Version2FieldsLoadAndEveryBrokenOneIsNamed) {
  using Stored = h5::File::Stored;
  auto paged = [](RawCase& r) {
    r.attrs["format_version"] = std::int64_t{2};
    r.attrs["batch"] = std::int64_t{2};
    r.attrs["page_size"] = std::int64_t{2};
    r.attrs["causal"] = std::string("bottom_right");
    r.datasets["k"] = {{3, 1, 2, 2}, std::vector<double>(12, 0.25)};
    r.datasets["v"] = {{3, 1, 2, 2}, std::vector<double>(12, 1.0)};
    r.datasets["page_table"] = {{2, 2}, {2, 0, 1, -1}, Stored::int64};
    r.datasets["seq_lens"] = {{2}, {4, 1}, Stored::int64};
  };
  EXPECT_EQ(error_after(paged), "");
  {
    RawCase r;
    paged(r);
    r.write(dir_ / "paged.h5");
    const Fixture f = read_fixture(dir_ / "paged.h5");
    EXPECT_EQ(f.problem().page_size, 2);
    EXPECT_EQ(f.problem().num_pages, 3);
    EXPECT_EQ(f.data.page_table, (std::vector<std::int64_t>{2, 0, 1, -1}));
    EXPECT_EQ(f.problem().to_string(), "dtype=f32,b=2,hq=2,hkv=1,sq=3,sk=4,d=2,dv=2,scale=0.5,causal=bottom_right,paged=2x3");
  }
  auto with = [&](auto base, auto edit) {
    return error_after([&](RawCase& r) {
      base(r);
      edit(r);
    });
  };
  EXPECT_ERROR(with(paged, [](RawCase& r) { r.datasets["page_table"].values[0] = 7; }),
               "page_table[0][0] = 7: entry 0 holds 4 keys, so this page is read and must be in [0, num_pages = 3)");
  EXPECT_ERROR(with(paged, [](RawCase& r) { r.datasets["seq_lens"].values[1] = 5; }), "seq_lens[1] = 5");
  EXPECT_ERROR(with(paged, [](RawCase& r) { r.attrs["page_size"] = std::int64_t{3}; }),
               "seq_k = 4 is not a multiple of page_size = 3");
  EXPECT_ERROR(with(paged, [](RawCase& r) { r.attrs["page_size"] = std::int64_t{0}; }), "'page_size' must be an integer >= 1");
  EXPECT_ERROR(with(paged, [](RawCase& r) { r.datasets["k"].dims = {3, 1, 4, 1}; }), "dataset 'k' has shape [3, 1, 4, 1], expected [3, 1, 2, 2]");
  EXPECT_ERROR(with(paged, [](RawCase& r) { r.datasets["page_table"].stored = Stored::float32; }),
               "dataset 'page_table' is");
  EXPECT_ERROR(with(paged, [](RawCase& r) { r.datasets.erase("seq_lens"); }), "missing dataset 'seq_lens'");
  EXPECT_ERROR(with(paged, [](RawCase& r) { r.datasets["kv_len"] = {{2}, {1, 1}, Stored::int64}; }),
               "paged KV takes seq_lens, not kv_len");

  auto packed = [](RawCase& r) {
    r.attrs["format_version"] = std::int64_t{2};
    r.attrs["batch"] = std::int64_t{3};
    r.datasets["q"] = {{1, 2, 3, 2}, std::vector<double>(12, 0.5)};
    r.datasets["k"] = {{1, 1, 4, 2}, std::vector<double>(8, 0.25)};
    r.datasets["v"] = {{1, 1, 4, 2}, std::vector<double>(8, 1.0)};
    r.datasets["out"] = {{1, 2, 3, 2}, std::vector<double>(12, 1.0), Stored::float64};
    r.datasets["cu_seqlens_q"] = {{4}, {0, 2, 2, 3}, Stored::int64};
    r.datasets["cu_seqlens_k"] = {{4}, {0, 0, 3, 4}, Stored::int64};
  };
  EXPECT_EQ(error_after(packed), "");
  EXPECT_ERROR(with(packed, [](RawCase& r) { r.datasets["cu_seqlens_k"].values = {0, 3, 2, 4}; }),
               "cu_seqlens_k[2] = 2 is below cu_seqlens_k[1] = 3");
  EXPECT_ERROR(with(packed, [](RawCase& r) { r.datasets["cu_seqlens_q"].values = {0, 2, 2, 4}; }),
               "cu_seqlens_q[3] = 4, more than seq_q = 3");
  EXPECT_ERROR(with(packed, [](RawCase& r) { r.datasets["cu_seqlens_q"].values = {1, 2, 2, 3}; }), "cu_seqlens_q[0] = 1, expected 0");
  EXPECT_ERROR(with(packed, [](RawCase& r) { r.datasets.erase("cu_seqlens_k"); }), "missing dataset 'cu_seqlens_k'");
  EXPECT_ERROR(with(packed, [](RawCase& r) { r.datasets["cu_seqlens_q"].dims = {3}; }), "dataset 'cu_seqlens_q' has shape [3], expected [4]");
  EXPECT_ERROR(with(packed, [](RawCase& r) { r.datasets["mask"] = {{1, 1, 1, 4}, {1, 1, 1, 1}, Stored::uint8}; }),
               "packed (ragged) sequences take no mask, bias or kv_len");
  EXPECT_ERROR(with(packed, [](RawCase& r) { r.datasets["q"].dims = {3, 2, 1, 2}; }), "dataset 'q' has shape [3, 2, 1, 2], expected [1, 2, 3, 2]");

  auto v2 = [](RawCase& r) { r.attrs["format_version"] = std::int64_t{2}; };
  EXPECT_ERROR(with(v2, [](RawCase& r) { r.attrs["softcap"] = -1.0; }), "'softcap' must be a finite number >= 0");
  EXPECT_ERROR(with(v2, [](RawCase& r) { r.attrs["softcap"] = std::nan(""); }), "'softcap' must be a finite number >= 0");
  EXPECT_ERROR(with(v2, [](RawCase& r) { r.attrs["window_left"] = std::int64_t{-2}; }), "'window_left' must be an integer >= -1");
  EXPECT_ERROR(with(v2, [](RawCase& r) { r.attrs["window_right"] = 1.5; }), "'window_right'");
  EXPECT_ERROR(with(v2, [](RawCase& r) { r.attrs["align"] = std::string("middle"); }), "'align' is 'middle'");
  EXPECT_ERROR(with(v2, [](RawCase& r) {
                 r.attrs["causal"] = std::string("top_left");
                 r.attrs["align"] = std::string("bottom_right");
               }),
               "a causal case is measured from its own alignment");
  EXPECT_ERROR(with(v2, [](RawCase& r) { r.datasets["alibi_slopes"] = {{3}, {1, 1, 1}}; }),
               "dataset 'alibi_slopes' has shape [3], expected [2]");
  EXPECT_ERROR(with(v2, [](RawCase& r) { r.datasets["sinks"] = {{2}, {0.5, std::nan("")}}; }), "dataset 'sinks' holds nan");
  EXPECT_ERROR(with(v2, [](RawCase& r) { r.datasets["sinks"] = {{2}, {0.5, 0.1}, Stored::float64}; }),
               "sinks[1] = 0.1, expected a finite value exactly representable in float32");
  EXPECT_ERROR(error_after([](RawCase& r) { r.datasets["sinks"] = {{2}, {0.5, 0.5}}; }),
               "dataset 'sinks' belongs to format version 2, but 'format_version' is 1");
  EXPECT_EQ(with(v2, [](RawCase& r) {
              r.attrs["window_left"] = std::int64_t{1};
              r.attrs["softcap"] = 30.0;
              r.datasets["alibi_slopes"] = {{2}, {0.5, 0.25}};
              r.datasets["sinks"] = {{2}, {0.5, -1}};
            }),
            "");
}

TEST_F(FixtureIo, Version2RoundTripsAndVersion1StaysVersion1) {
  for (const auto& spec : standard_suite()) {
    if (spec.name != "paged/window_alibi_softcap_sinks_ps16_f32" && spec.name != "ragged/b5_zero_lengths_f32" &&
        spec.name != "basic/b1_h2_q4_k4_d8_f32") {
      continue;
    }
    const Fixture f = generate_fixture(spec);
    write_fixture(f, dir_ / "rt.h5");
    const Fixture back = read_fixture(dir_ / "rt.h5");
    EXPECT_EQ(back.problem(), f.problem()) << spec.name;
    EXPECT_EQ(back.problem(), Problem::parse(spec.problem)) << spec.name;
    EXPECT_EQ(back.data.alibi_slopes, f.data.alibi_slopes);
    EXPECT_EQ(back.data.sinks, f.data.sinks);
    EXPECT_EQ(back.data.cu_seqlens_q, f.data.cu_seqlens_q);
    EXPECT_EQ(back.data.page_table, f.data.page_table);
    EXPECT_EQ(back.data.seq_lens, f.data.seq_lens);
    EXPECT_EQ(back.out, f.out);
    h5::File file = h5::File::open_read(dir_ / "rt.h5");
    EXPECT_EQ(file.integer_attribute("format_version"), f.problem().features() ? 2 : 1) << spec.name;
  }
}

// Format version 3: dout and the golden gradients (docs/format/v3.md).
namespace {
void add_gradients(RawCase& r) {
  r.attrs["format_version"] = std::int64_t{3};
  r.datasets["dout"] = {{2, 2, 3, 2}, std::vector<double>(24, 0.5)};
  r.datasets["dq"] = {{2, 2, 3, 2}, std::vector<double>(24, 0.0), h5::File::Stored::float64};
  r.datasets["dk"] = {{2, 1, 4, 2}, std::vector<double>(16, 0.0), h5::File::Stored::float64};
  r.datasets["dv"] = {{2, 1, 4, 2}, std::vector<double>(16, 0.0), h5::File::Stored::float64};
}
}  // namespace

TEST_F(FixtureIo, Version3CarriesGradients) {
  EXPECT_EQ(error_after(add_gradients), "");
  RawCase raw;
  add_gradients(raw);
  raw.write(dir_ / "v3.h5");
  const Fixture f = read_fixture(dir_ / "v3.h5");
  ASSERT_TRUE(f.gradients.has_value());
  EXPECT_TRUE(f.header.gradients);
  EXPECT_EQ(f.header.format_version, 3);
  EXPECT_TRUE(f.header.has_tag("backward"));
  EXPECT_EQ(f.gradients->dout.size(), 24u);
  EXPECT_EQ(f.gradients->dk.size(), 16u);
  // Written back bit for bit, as version 3.
  write_fixture(f, dir_ / "again.h5");
  const Fixture g = read_fixture(dir_ / "again.h5");
  ASSERT_TRUE(g.gradients.has_value());
  EXPECT_EQ(g.gradients->dout, f.gradients->dout);
  EXPECT_EQ(g.header.format_version, 3);
  // A case without gradients has none.
  EXPECT_EQ(error_after([](RawCase&) {}), "");
  EXPECT_FALSE(read_fixture_header(dir_ / "case.h5").gradients);
  EXPECT_FALSE(read_fixture(dir_ / "case.h5").gradients.has_value());
}

TEST_F(FixtureIo, Version3IsRefusedWhereItBreaksARule) {
  EXPECT_ERROR(error_after([](RawCase& r) { r.datasets["dout"] = {{2, 2, 3, 2}, std::vector<double>(24, 0.5)}; }),
               "dataset 'dout' belongs to format version 3 (gradients), but 'format_version' is 1");
  EXPECT_ERROR(error_after([](RawCase& r) { r.attrs["format_version"] = std::int64_t{3}; }),
               "dataset 'dout' is missing (dout, dq, dk and dv are required)");
  EXPECT_ERROR(error_after([](RawCase& r) {
                 add_gradients(r);
                 r.datasets.erase("dk");
               }),
               "dataset 'dk' is missing");
  EXPECT_ERROR(error_after([](RawCase& r) {
                 add_gradients(r);
                 r.datasets["dq"].dims = {2, 2, 2, 3};
               }),
               "dataset 'dq' has shape [2, 2, 2, 3], expected [2, 2, 3, 2]");
  EXPECT_ERROR(error_after([](RawCase& r) {
                 add_gradients(r);  // dout is an input: exact in the case's dtype, here float16
                 r.attrs["dtype"] = std::string("float16");
                 r.datasets["dout"].values[3] = 0.1;
               }),
               "dataset 'dout' holds");
  EXPECT_ERROR(error_after([](RawCase& r) {
                 add_gradients(r);
                 r.attrs["bias_requires_grad"] = std::int64_t{1};
               }),
               "'bias_requires_grad' is 1 but the case has no bias");
  EXPECT_ERROR(error_after([](RawCase& r) {
                 add_gradients(r);
                 r.datasets["dsinks"] = {{2}, {0.0, 0.0}, h5::File::Stored::float64};
               }),
               "dataset 'dsinks' is present but the case has no sinks");
  EXPECT_ERROR(error_after([](RawCase& r) {
                 add_gradients(r);
                 r.datasets["dv"].values[0] = std::nan("");
               }),
               "dataset 'dv' holds nan");
  EXPECT_ERROR(error_after([](RawCase& r) {
                 add_gradients(r);
                 r.attrs["page_size"] = std::int64_t{2};
               }),
               "format version 3 holds gradients, but a paged case has no backward pass");
}
