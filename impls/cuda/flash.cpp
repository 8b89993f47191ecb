// cuda-flash: a fused FlashAttention-style kernel, in two versions.
//  - float16 and bfloat16 (flash_wmma_kernel.cu): tensor cores through WMMA;
//    one block of 4 warps per (64 queries, head, batch), Q resident in shared
//    memory, K/V tiles of 64 keys (32 for head dims over 128) staged there,
//    S = Q K^T and O += P V as 16x16x16 tile products with float32
//    accumulation, online softmax per row in between.
//  - float32 (flash_kernel.cu): CUDA-core FMAs, one thread per query row,
//    K/V tiles of 16 keys; held to float32 bounds, so no TF32.
// Both skip key tiles past the block's last visible key (causal, kv_len) and
// implement every masking rule, GQA, head_dim and head_dim_v up to 256, lse.
#include <fmt/format.h>

#include "attnbench/error.hpp"
#include "impls/cuda/device_case.hpp"
#include "impls/cuda/kernels.hpp"

namespace attn {

namespace {

using cuda::DeviceArgs;

class FlashPlan final : public Plan {
 public:
  FlashPlan(const Problem& p, const AttentionIO& io) : p_(p), io_(io) {
    tensor_cores_ = p.dtype == DType::f16 || p.dtype == DType::bf16;
    if (tensor_cores_) {
      int device = 0, limit = 0;
      ATTN_CUDA(cudaGetDevice(&device));
      ATTN_CUDA(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
      const std::size_t need = cuda::flash_tensor_core_smem_bytes(static_cast<int>(p.head_dim), static_cast<int>(p.head_dim_v));
      if (need > static_cast<std::size_t>(limit)) {
        throw Error(fmt::format("cuda-flash: head_dim {} / head_dim_v {} need {} bytes of shared memory per block; this "
                                "device allows {}", p.head_dim, p.head_dim_v, need, limit));
      }
    }
    device_.upload(p, io);
  }
  void run() override {
    if (tensor_cores_) cuda::launch_flash_tensor_cores(device_.args(), p_.dtype);
    else cuda::launch_flash(device_.args(), p_.dtype);
  }
  void read_output() override { device_.download(p_, io_); }
  bool has_lse() const override { return true; }
  double run_timed() override { return cuda::time_on_device([&] { run(); }); }

 private:
  Problem p_;
  AttentionIO io_;
  bool tensor_cores_ = false;
  cuda::DeviceCase device_;
};

class FlashBackend final : public Backend {
 public:
  std::string_view name() const override { return "cuda-flash"; }
  std::string_view description() const override {
    return "fused FlashAttention-2-style kernel: tensor cores (WMMA) for float16/bfloat16, CUDA cores for float32; "
           "K/V tiles in shared memory, online softmax";
  }
  // Not float64: the kernel accumulates in float32. No version 2 addition:
  // the kernels were not extended without a device to test them on.
  Capabilities capabilities() const override { return {.dtypes = dtype_bit(DType::f32) | dtype_bit(DType::f16) | dtype_bit(DType::bf16), .lse = true}; }
  Status available() const override { return cuda::device_status(); }
  Status supports(const Problem& p) const override {
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
