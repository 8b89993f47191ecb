// cuda-flash: a fused FlashAttention-style kernel. One thread block per
// (64-query block, query head, batch); K and V tiles of 16 keys are staged in
// shared memory as float; each thread owns one query row and keeps its running
// max, sum and output (online softmax), so the scores never reach global
// memory. Key tiles past the block's last visible key (causal, kv_len) are
// skipped. Every masking rule, GQA, head_dim and head_dim_v up to 256, lse.
//
// This first version accumulates with scalar float FMAs; the tensor-core path
// (mma.sync for float16/bfloat16) is future work, see the README. The kernel
// is in flash_kernel.cu.
#include <fmt/format.h>

#include "impls/cuda/device_case.hpp"
#include "impls/cuda/kernels.hpp"

namespace attn {

namespace {

using cuda::DeviceArgs;

class FlashPlan final : public Plan {
 public:
  FlashPlan(const Problem& p, const AttentionIO& io) : p_(p), io_(io) { device_.upload(p, io); }
  void run() override {
    cuda::launch_flash(device_.args(), p_.dtype);
  }
  void read_output() override { device_.download(p_, io_); }
  bool has_lse() const override { return true; }
  double run_timed() override { return cuda::time_on_device([&] { run(); }); }

 private:
  Problem p_;
  AttentionIO io_;
  cuda::DeviceCase device_;
};

class FlashBackend final : public Backend {
 public:
  std::string_view name() const override { return "cuda-flash"; }
  std::string_view description() const override {
    return "fused FlashAttention-style kernel: K/V tiles in shared memory, online softmax per query row";
  }
  std::string_view capabilities() const override {
    return "float32, float16, bfloat16; every mask rule, GQA/MQA, head_dim and head_dim_v <= 256; lse; needs a CUDA device";
  }
  Status available() const override { return cuda::device_status(); }
  Status supports(const Problem& p) const override {
    if (p.dtype == DType::f64) return Status::no("float64 is not implemented: the kernel accumulates in float32");
    if (p.head_dim > cuda::kFlashMaxDim || p.head_dim_v > cuda::kFlashMaxDim) {
      return Status::no(fmt::format("head_dim {} / head_dim_v {}: the kernel handles up to {}", p.head_dim, p.head_dim_v,
                                    cuda::kFlashMaxDim));
    }
    return Status::yes();
  }
  std::unique_ptr<Plan> prepare(const Problem& p, const AttentionIO& io, const RunOptions&) const override {
    return std::make_unique<FlashPlan>(p, io);
  }
};

}  // namespace

std::unique_ptr<Backend> make_cuda_flash_backend() { return std::make_unique<FlashBackend>(); }

}  // namespace attn
