#include "verify/run_case.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <limits>

#include "core/float_state.hpp"

namespace attn {

namespace {
constexpr std::size_t kGuardBytes = 4096;
constexpr unsigned char kGuardByte = 0xA5;
}  // namespace

std::vector<std::uint8_t> unwritten_mask(const Problem& p) {
  return std::vector<std::uint8_t>(static_cast<std::size_t>(p.batch * p.heads_q * p.seq_q * p.seq_k), kNotWritten);
}

BackendRun run_backend(const Backend& backend, const CaseData& data, const RunOptions& options, const DropoutView& dropout) {
  const Problem& p = data.problem;
  DeviceReadyInputs inputs = make_backend_inputs(data);
  Dims4 out_shape{p.q_batch(), p.heads_q, p.seq_q, p.head_dim_v};
  Dims4 out_strides = layout_strides(out_shape, p.layout);
  const std::size_t elem = dtype_size(p.dtype);
  const std::size_t out_bytes = static_cast<std::size_t>(p.out_elements()) * elem;
  Buffer storage(out_bytes + 2 * kGuardBytes);
  auto* bytes = static_cast<unsigned char*>(storage.data());
  std::memset(bytes, kGuardByte, kGuardBytes);
  std::memset(bytes + kGuardBytes + out_bytes, kGuardByte, kGuardBytes);
  void* out = bytes + kGuardBytes;
  for (std::int64_t e = 0; e < p.out_elements(); ++e) {
    store_from_double(out, e, p.dtype, std::numeric_limits<double>::quiet_NaN());
  }
  std::vector<double> lse(static_cast<std::size_t>(p.rows()), std::numeric_limits<double>::quiet_NaN());
  inputs.io.out = MutableTensorView{out, p.dtype, out_shape, out_strides};
  inputs.io.lse = lse.data();
  BackendRun result;
  if (dropout.active()) {
    result.kept = unwritten_mask(p);
    inputs.io.dropout = dropout;
    inputs.io.dropout.kept = result.kept.data();
  }

  auto start = std::chrono::steady_clock::now();
  bool has_lse = false;
  {
    // Whatever floating-point state the backend sets on this thread is undone
    // before the verifier computes again (the pool restores its own threads).
    const FloatStateGuard floats;
    auto plan = backend.prepare(p, inputs.io, options);
    plan->run();
    plan->read_output();
    has_lse = plan->has_lse();
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  for (std::size_t i = 0; i < kGuardBytes; ++i) {
    if (bytes[i] != kGuardByte) {
      result.guard_damage = fmt::format("wrote {} bytes before the start of the output", kGuardBytes - i);
      break;
    }
  }
  for (std::size_t i = 0; i < kGuardBytes && result.guard_damage.empty(); ++i) {
    if (bytes[kGuardBytes + out_bytes + i] != kGuardByte) {
      result.guard_damage = fmt::format("wrote at byte {} past the end of the output", i);
    }
  }
  result.out.resize(static_cast<std::size_t>(p.out_elements()));
  std::size_t e = 0;
  for (std::int64_t b = 0; b < p.q_batch(); ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.seq_q; ++i)
        for (std::int64_t d = 0; d < p.head_dim_v; ++d)
          result.out[e++] = load_as_double(out, b * out_strides[0] + h * out_strides[1] + i * out_strides[2] + d * out_strides[3], p.dtype);
  if (has_lse) result.lse = std::move(lse);
  return result;
}

}  // namespace attn
