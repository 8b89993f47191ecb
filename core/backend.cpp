#include "core/backend.hpp"

#include <fmt/format.h>

#include <chrono>
#include <stdexcept>

namespace attn {

double Plan::run_timed() {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace attn

namespace attn {

std::string_view convention_name(ConventionKind kind) {
  switch (kind) {
    case ConventionKind::empty_rows_mean_v: return "empty_rows_mean_v";
    case ConventionKind::empty_rows_nan: return "empty_rows_nan";
    case ConventionKind::empty_rows_unmasked: return "empty_rows_unmasked";
  }
  return "unknown";
}

}  // namespace attn

namespace attn {

Status Backend::supports_layer(const Problem& problem, std::int64_t /*model_dim*/) const { return supports(problem); }

std::vector<double> Backend::run_layer(const LayerData& /*layer*/, const RunOptions& /*options*/) const {
  throw std::logic_error("this backend does not run layers itself (runs_layers() is false)");
}

}  // namespace attn

namespace attn {

Status backend_accepts(const Backend& backend, const Problem& problem) {
  const unsigned missing = problem.features() & ~backend.features();
  if (missing) return Status::no(fmt::format("does not implement {} (format version 2)", feature_names(missing)));
  return backend.supports(problem);
}

}  // namespace attn
