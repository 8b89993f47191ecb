// libFuzzer target, structure-aware: the input bytes choose a fixture's root
// attributes (absent, a string, an integer or a float, with values from the
// bytes) and its datasets (absent, or a rank, dims and element type from the
// bytes, values from the bytes), libhdf5 writes the file, and the fixture
// reader must read it or refuse it with an InputError. Files written by
// libhdf5 are well-formed, so anything else is a bug of ours.
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "attnbench/error.hpp"
#include "fixtures/fixture.hpp"
#include "fixtures/h5.hpp"

namespace {

class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }
  std::int64_t integer() {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | byte();
    return static_cast<std::int64_t>(v);
  }
  double real() {
    const std::int64_t bits = integer();
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
  }
  std::string text() {
    std::string s;
    for (std::size_t n = byte() % 24; n > 0; --n) s += static_cast<char>(byte());
    return s;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_, at_ = 0;
};

const char* const kAttributes[] = {"format", "format_version", "kind", "name", "description", "generator", "tags",
                                   "dtype", "batch", "heads_q", "heads_kv", "seq_q", "seq_k", "head_dim", "head_dim_v",
                                   "scale", "causal", "atol", "rtol", "model_dim"};
const char* const kDatasets[] = {"q", "k", "v", "out", "lse", "mask", "bias", "kv_len"};
// Values a valid file would hold, so that the reader gets past its first checks.
const char* const kStrings[] = {"attnbench-fixture", "sdpa", "mha", "float32", "float16", "bfloat16", "float64",
                                "none", "top_left", "bottom_right", "smoke"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("attn_fuzz_structured_" + std::to_string(::getpid()) + ".h5");
  Bytes in(data, size);
  {
    attn::h5::File file = attn::h5::File::create(path);
    for (const char* name : kAttributes) {
      switch (in.byte() % 6) {
        case 0: break;
        case 1: file.write_attribute(name, in.text()); break;
        case 2: file.write_attribute(name, std::string(kStrings[in.byte() % std::size(kStrings)])); break;
        case 3: file.write_attribute(name, static_cast<std::int64_t>(in.byte() % 9)); break;
        case 4: file.write_attribute(name, in.integer()); break;
        case 5: file.write_attribute(name, in.real()); break;
      }
    }
    for (const char* name : kDatasets) {
      const std::uint8_t choice = in.byte();
      if (choice % 3 == 0) continue;
      std::vector<std::int64_t> dims(static_cast<std::size_t>(1 + in.byte() % 4));
      std::int64_t count = 1;
      for (auto& d : dims) count *= (d = in.byte() % 9);
      if (choice % 3 == 1) {
        std::vector<double> values(static_cast<std::size_t>(count));
        for (double& v : values) v = in.byte() % 4 == 0 ? in.real() : static_cast<double>(static_cast<std::int8_t>(in.byte())) / 8;
        const attn::h5::File::Stored as = in.byte() % 2 ? attn::h5::File::Stored::float32 : attn::h5::File::Stored::float64;
        file.write_dataset(name, dims, values.data(), as);
      } else if (in.byte() % 2) {
        std::vector<std::int64_t> values(static_cast<std::size_t>(count));
        for (auto& v : values) v = in.byte() % 4 == 0 ? in.integer() : in.byte() % 9;
        file.write_dataset(name, dims, values.data());
      } else {
        std::vector<std::uint8_t> values(static_cast<std::size_t>(count));
        for (auto& v : values) v = in.byte();
        file.write_dataset(name, dims, values.data());
      }
    }
  }
  try {
    attn::read_fixture_header(path);
    attn::read_fixture(path);
  } catch (const attn::InputError&) {
  }
  return 0;
}
