// Results computed by another tool, judged like a backend's: `attn verify
// --outputs DIR` reads DIR/<fixture name>.h5 for each fixture, holding `out`
// ([batch, heads_q, seq_q, head_dim_v], any float type) and optionally `lse`
// ([batch, heads_q, seq_q]), or `y` ([batch, seq_q, model_dim]) for a layer
// case, in the fixture format's conventions (row-major, hidden rows 0, lse
// -inf). The files are untrusted input like fixtures: read first in the
// sandbox, with the same hardened reader.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "attnbench/backend.hpp"
#include "core/extensions.hpp"

namespace attn {

struct RecordedOutput {
  std::vector<double> values;              // out, or y for a layer case
  std::optional<std::vector<double>> lse;  // sdpa only
};

// A format version 3 case's gradients in an outputs file: `dq`, `dk`, `dv`
// (and `dbias`, `dsinks` where the case has them), each in the shape of the
// fixture's golden of it, any float type.
struct RecordedGradient {
  std::string name;
  std::vector<std::int64_t> dims;
  std::vector<double> values;  // filled by read_gradients
};

// Whatever the files hold is judged: every dtype and addition is "declared".
class RecordedOutputs final : public Backend, private BackendExtensions {
 public:
  RecordedOutputs(std::filesystem::path dir, std::string name);
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return description_; }
  // Files may hold gradients too (read_gradients): every direction is "declared".
  Capabilities capabilities() const override {
    return {.dtypes = kAllDTypes, .features = kAllFeatures, .lse = true, .backward = true};
  }
  Status supports(const Problem&) const override { return Status::yes(); }
  // Never called: the verifier reads the files instead (verify/verifier.cpp).
  std::unique_ptr<Plan> prepare(const Problem&, const AttentionIO&, const RunOptions&) const override;
  const BackendExtensions* extensions() const override { return this; }
  const RecordedOutputs* recorded() const override { return this; }

  // The attn verify options that select these outputs again.
  std::string arguments() const;
  // The file for this fixture name; InputError when the name cannot name a
  // file inside the folder (absolute, "..", control bytes).
  std::filesystem::path file_for(const std::string& fixture_name) const;
  // nullopt when there is no file; InputError (naming the file) when it is
  // unreadable, hostile, or holds the wrong datasets or shapes. `dims` is the
  // shape `dataset` must have; lse is read when present (sdpa).
  std::optional<RecordedOutput> read(const std::string& fixture_name, const std::string& dataset,
                                     const std::vector<std::int64_t>& dims) const;
  // The gradients `wanted` names (with their shapes): false when there is no
  // file or it holds none of them (SKIP); InputError when it holds some but
  // not all, or a wrong shape or type.
  bool read_gradients(const std::string& fixture_name, std::vector<RecordedGradient>& wanted) const;

 private:
  std::filesystem::path dir_;
  std::string name_, description_;
};

}  // namespace attn
