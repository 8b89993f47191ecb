// What only in-tree adapters add to a backend, behind Backend::extensions():
// the Python framework backends (conventions their framework documents, a
// layer of their own) and results another tool recorded (`attn verify
// --outputs`). Not part of the SDK: a backend built against include/attnbench/
// has none, and every tool treats a null extensions() as "none of these".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "attnbench/backend.hpp"

namespace attn {

struct LayerData;        // core/layer_data.hpp
struct LayerGradients;
class RecordedOutputs;   // verify/recorded.hpp

// A documented convention of a backend's framework that differs from the
// fixture format on rows with no visible key (where frameworks disagree most).
// The verifier models it: such rows must follow it exactly, everything else is
// judged as usual, and the verdict is DIFFERS (with `why`) instead of FAIL.
enum class ConventionKind : std::uint8_t {
  empty_rows_mean_v,    // the mean of V over all seq_k keys (a -1e9 fill: every score equal)
  empty_rows_nan,       // NaN (softmax of a row of -inf)
  empty_rows_unmasked,  // the attention of the row with nothing hidden (s - 1e9 exact in float64)
};
std::string_view convention_name(ConventionKind kind);
struct Convention {
  ConventionKind kind;
  std::string why;  // what the framework does, e.g. "masked_fill(mask == 0, -1e9)"
};

class BackendExtensions {
 public:
  virtual ~BackendExtensions() = default;
  // Conventions of this backend's framework that differ from the format on
  // this problem (see Convention).
  virtual std::vector<Convention> conventions(const Problem& /*problem*/) const { return {}; }
  // Whole layers (fixtures of kind mha): a backend whose framework has its own
  // layer (torch.nn.MultiheadAttention, Keras MultiHeadAttention) answers true
  // and implements the two below; otherwise the verifier computes the
  // projections itself around the backend's attention (verify/layer.hpp).
  virtual bool runs_layers() const { return false; }
  // `problem` is the layer's attention as it will run (its layout); `layer`
  // gives the widths (model_dim, k_in(), v_in()) and weights.
  virtual Status supports_layer(const Problem& problem, const LayerData& layer) const;
  // y [batch, seq_q, model_dim], widened to float64. Not timed.
  virtual std::vector<double> run_layer(const LayerData& layer, const RunOptions& options) const;
  // The layer's backward on a layer case with gradients (docs/format/v3.md,
  // "Layers"): every gradient of L = sum(dout * y) the layer has (the shapes
  // of LayerGradients; dbias only with `bias_gradient`), widened to float64.
  // Throws attn::Unsupported (SKIP, with its reason) where the framework's
  // layer has none. Not timed.
  virtual LayerGradients run_layer_backward(const LayerData& layer, const std::vector<double>& dout, bool bias_gradient,
                                            const RunOptions& options) const;
  // Results another tool wrote, read instead of run (verify/recorded.hpp).
  virtual const RecordedOutputs* recorded() const { return nullptr; }
  // Non-empty when the framework's gradients depend on the thread count (its
  // GEMMs split their sums by it), in its own words: a backward that differs
  // between thread counts, and only there, is then DIFFERS, not FAIL. Two
  // runs at the same count must still agree bit for bit.
  virtual std::string thread_dependent_gradients() const { return {}; }
};

// The same questions asked of any backend (none of these without extensions).
std::vector<Convention> conventions_of(const Backend& backend, const Problem& problem);
bool runs_own_layers(const Backend& backend);
const RecordedOutputs* recorded_outputs_of(const Backend& backend);
std::string thread_dependent_gradients_of(const Backend& backend);

}  // namespace attn
