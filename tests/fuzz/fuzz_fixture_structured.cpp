// libFuzzer target, structure-aware: the input bytes build a fixture, libhdf5
// writes it, and the reader must read it or refuse it with an InputError;
// what it reads whole then goes through the float64 reference and the naive
// backend, which must not crash either. Files written by libhdf5 are
// well-formed, so anything else is a bug of ours.
//
// Half the inputs start from a consistent case (the format string, a dtype,
// small sizes that agree with every dataset, any of the version 2 fields) and
// let the bytes break a few things (rarely: bytes past the input's end read
// as 0, and 0 picks the valid choice everywhere); the other half write attributes and
// datasets wholly from the bytes. At exit the target prints how many files it
// read whole and how many went through the reference, and scripts/fuzz-short
// fails a run in which none did: a target stuck at the header check tests
// almost nothing.
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "attnbench/error.hpp"
#include "tests/fuzz/scratch_file.hpp"
#include "core/case_data.hpp"
#include "fixtures/fixture.hpp"
#include "fixtures/h5.hpp"
#include "impls/naive/naive.hpp"
#include "reference/reference.hpp"

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
  // A small value, exact in every dtype.
  double value() { return static_cast<double>(static_cast<std::int8_t>(byte())) / 16; }

 private:
  const std::uint8_t* data_;
  std::size_t size_, at_ = 0;
};

const char* const kAttributes[] = {"format", "format_version", "kind", "name", "description", "generator", "tags",
                                   "dtype", "batch", "heads_q", "heads_kv", "seq_q", "seq_k", "head_dim", "head_dim_v",
                                   "scale", "causal", "atol", "rtol", "model_dim", "window_left", "window_right",
                                   "align", "softcap", "page_size"};
const char* const kDatasets[] = {"q", "k", "v", "out", "lse", "mask", "bias", "kv_len", "alibi_slopes", "sinks",
                                 "cu_seqlens_q", "cu_seqlens_k", "page_table", "seq_lens"};
// Values a valid file would hold, so that the reader gets past its first checks.
const char* const kStrings[] = {"attn-fixture", "sdpa", "mha", "float32", "float16", "bfloat16", "float64",
                                "none", "top_left", "bottom_right", "smoke"};

struct Counts {
  long files = 0, read_whole = 0, computed = 0;
  ~Counts() {
    std::fprintf(stderr, "fuzz_fixture_structured: %ld files, %ld read whole, %ld through the reference and naive\n",
                 files, read_whole, computed);
  }
};
Counts counts;

using Stored = attn::h5::File::Stored;

void floats(attn::h5::File& file, Bytes& in, const char* name, std::vector<std::int64_t> dims, Stored as) {
  std::int64_t count = 1;
  for (auto d : dims) count *= d;
  std::vector<double> values(static_cast<std::size_t>(count));
  for (double& v : values) v = in.value();
  // Now and then (1 in 8) one value anything the bytes give: inf, NaN, huge, subnormal.
  if (count > 0 && in.byte() % 8 == 7) values[static_cast<std::size_t>(in.integer() & 0x7fffffff) % values.size()] = in.real();
  if (as == Stored::float32) {
    for (double& v : values) v = static_cast<double>(static_cast<float>(v));
  }
  file.write_dataset(name, dims, values.data(), as);
}

void integers(attn::h5::File& file, const char* name, std::vector<std::int64_t> values) {
  file.write_dataset(name, {static_cast<std::int64_t>(values.size())}, values.data());
}

// A case that follows the format, from the bytes: every size small and
// consistent, and any of the version 2 fields; then the bytes may break one
// attribute or one value.
void consistent(attn::h5::File& file, Bytes& in) {
  const char* dtypes[] = {"float32", "float16", "bfloat16", "float64"};
  const char* dtype = dtypes[in.byte() % 4];
  const Stored as = std::string(dtype) == "float64" ? Stored::float64 : Stored::float32;
  const std::int64_t batch = 1 + in.byte() % 3, heads_kv = 1 + in.byte() % 2, heads_q = heads_kv * (1 + in.byte() % 3);
  std::int64_t seq_q = 1 + in.byte() % 5, seq_k = in.byte() % 6;
  const std::int64_t d = 1 + in.byte() % 8, dv = 1 + in.byte() % 8;
  const std::uint8_t v2 = in.byte();
  const bool ragged = v2 & 1, paged = !ragged && (v2 & 2);
  const std::int64_t page = 1 + in.byte() % 4;
  if (paged) seq_k = page * (1 + seq_k / page);
  file.write_attribute("format", std::string("attn-fixture"));
  file.write_attribute("format_version", std::int64_t{v2 ? 2 : 1});
  file.write_attribute("name", std::string("fuzz/structured"));
  file.write_attribute("description", std::string());
  file.write_attribute("generator", std::string("fuzz_fixture_structured"));
  file.write_attribute("dtype", std::string(dtype));
  for (auto [name, value] : {std::pair{"batch", batch}, std::pair{"heads_q", heads_q}, std::pair{"heads_kv", heads_kv},
                             std::pair{"seq_q", seq_q}, std::pair{"seq_k", seq_k}, std::pair{"head_dim", d},
                             std::pair{"head_dim_v", dv}}) {
    file.write_attribute(name, value);
  }
  file.write_attribute("scale", 1.0 / std::sqrt(static_cast<double>(d)));
  const char* causal[] = {"none", "top_left", "bottom_right"};
  file.write_attribute("causal", std::string(causal[in.byte() % 3]));
  if (v2 & 4) file.write_attribute("window_left", static_cast<std::int64_t>(in.byte() % 4) - 1);
  if (v2 & 8) file.write_attribute("window_right", in.byte() % 8 == 7 ? in.integer() : static_cast<std::int64_t>(in.byte() % 4));
  if (v2 & 16) file.write_attribute("softcap", in.byte() % 8 == 7 ? in.real() : 1.0 + in.byte() % 30);
  if (v2 & 32) floats(file, in, "alibi_slopes", {heads_q}, Stored::float32);
  if (v2 & 64) floats(file, in, "sinks", {heads_q}, Stored::float32);
  const std::int64_t q_batch = ragged ? 1 : batch;
  std::int64_t kv_batch = q_batch, kv_seq = seq_k;
  if (ragged) {
    std::vector<std::int64_t> cq{0}, ck{0};
    for (std::int64_t b = 0; b < batch; ++b) {
      cq.push_back(std::min(seq_q, cq.back() + in.byte() % 3));
      ck.push_back(std::min(seq_k, ck.back() + in.byte() % 3));
    }
    integers(file, "cu_seqlens_q", cq);
    integers(file, "cu_seqlens_k", ck);
  }
  if (paged) {
    const std::int64_t pages = 1 + in.byte() % 4, per_entry = seq_k / page;
    file.write_attribute("page_size", page);
    std::vector<std::int64_t> table(static_cast<std::size_t>(batch * per_entry)), lens;
    for (auto& t : table) t = in.byte() % 16 == 15 ? -1 : in.byte() % pages;
    for (std::int64_t b = 0; b < batch; ++b) lens.push_back(in.byte() % (seq_k + 1));
    file.write_dataset("page_table", {batch, per_entry}, table.data());
    integers(file, "seq_lens", lens);
    kv_batch = pages;
    kv_seq = page;
  }
  floats(file, in, "q", {q_batch, heads_q, seq_q, d}, as);
  floats(file, in, "k", {kv_batch, heads_kv, kv_seq, d}, as);
  floats(file, in, "v", {kv_batch, heads_kv, kv_seq, dv}, as);
  floats(file, in, "out", {q_batch, heads_q, seq_q, dv}, Stored::float64);
  if (!ragged && !paged && in.byte() % 3 == 0) {
    std::vector<std::uint8_t> mask(static_cast<std::size_t>(batch * seq_q * seq_k));
    for (auto& m : mask) m = in.byte() % 2;
    file.write_dataset("mask", {batch, 1, seq_q, seq_k}, mask.data());
  }
  if (!ragged && !paged && in.byte() % 4 == 0) {
    std::vector<std::int64_t> lens;
    for (std::int64_t b = 0; b < batch; ++b) lens.push_back(in.byte() % (seq_k + 1));
    integers(file, "kv_len", lens);
  }
  // One thing broken (a quarter of the cases), or none.
  switch (in.byte() % 12) {
    case 9: file.write_attribute(kAttributes[in.byte() % std::size(kAttributes)], in.integer()); break;
    case 10: file.write_attribute(kAttributes[in.byte() % std::size(kAttributes)], in.text()); break;
    case 11: file.write_attribute(kAttributes[in.byte() % std::size(kAttributes)], in.real()); break;
    default: break;
  }
}

// Attributes and datasets wholly from the bytes.
void arbitrary(attn::h5::File& file, Bytes& in) {
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
      floats(file, in, name, dims, in.byte() % 2 ? Stored::float32 : Stored::float64);
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const attn::fuzzing::ScratchFile scratch("attn_fuzz_structured_");
  const std::filesystem::path& path = scratch.path();
  static const auto naive = attn::make_naive_backend();
  Bytes in(data, size);
  {
    attn::h5::File file = attn::h5::File::create(path);
    if (in.byte() % 2) consistent(file, in);
    else arbitrary(file, in);
  }
  ++counts.files;
  attn::Fixture fixture;
  try {
    attn::read_fixture_header(path);
    fixture = attn::read_fixture(path);
  } catch (const attn::InputError&) {
    return 0;
  }
  ++counts.read_whole;
  // What the verifier does with a file it read: the truth, and a backend.
  const attn::ReferenceResult truth = attn::reference_attention(fixture.data, nullptr, 1);
  try {
    attn::DeviceReadyInputs inputs = attn::make_backend_inputs(fixture.data);
    const attn::Problem& p = fixture.problem();
    std::vector<double> out(static_cast<std::size_t>(p.out_elements() * 2));  // room for any dtype
    std::vector<double> lse(static_cast<std::size_t>(p.rows()));
    inputs.io.out = attn::MutableTensorView{out.data(), p.dtype, {p.q_batch(), p.heads_q, p.seq_q, p.head_dim_v},
                                            attn::layout_strides({p.q_batch(), p.heads_q, p.seq_q, p.head_dim_v}, p.layout)};
    inputs.io.lse = lse.data();
    naive->prepare(p, inputs.io, {1})->run();
  } catch (const attn::Unsupported&) {
  }
  (void)truth;
  ++counts.computed;
  return 0;
}
