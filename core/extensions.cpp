#include "core/extensions.hpp"

#include <stdexcept>

#include "attnbench/error.hpp"
#include "core/layer_data.hpp"

namespace attn {

std::string_view convention_name(ConventionKind kind) {
  switch (kind) {
    case ConventionKind::empty_rows_mean_v: return "empty_rows_mean_v";
    case ConventionKind::empty_rows_nan: return "empty_rows_nan";
    case ConventionKind::empty_rows_unmasked: return "empty_rows_unmasked";
  }
  return "unknown";
}

Status BackendExtensions::supports_layer(const Problem& /*problem*/, const LayerData& /*layer*/) const {
  return Status::no("this backend does not run layers itself");
}

std::vector<double> BackendExtensions::run_layer(const LayerData& /*layer*/, const RunOptions& /*options*/) const {
  throw std::logic_error("this backend does not run layers itself (runs_layers() is false)");
}

LayerGradients BackendExtensions::run_layer_backward(const LayerData& /*layer*/, const std::vector<double>& /*dout*/,
                                                     bool /*bias_gradient*/, const RunOptions& /*options*/) const {
  throw Unsupported("its own layer has no backward in attnbench");
}

std::vector<Convention> conventions_of(const Backend& backend, const Problem& problem) {
  const BackendExtensions* e = backend.extensions();
  return e ? e->conventions(problem) : std::vector<Convention>{};
}

bool runs_own_layers(const Backend& backend) {
  const BackendExtensions* e = backend.extensions();
  return e && e->runs_layers();
}

const RecordedOutputs* recorded_outputs_of(const Backend& backend) {
  const BackendExtensions* e = backend.extensions();
  return e ? e->recorded() : nullptr;
}

std::string thread_dependent_gradients_of(const Backend& backend) {
  const BackendExtensions* e = backend.extensions();
  return e ? e->thread_dependent_gradients() : std::string{};
}

}  // namespace attn
