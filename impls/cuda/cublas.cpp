// cuda-cublas: Q K^T and P V with cublasGemmStridedBatchedEx (float32
// accumulation; TF32 off, so float32 cases meet float32 bounds), and a softmax
// kernel of our own with every masking rule (cublas_kernels.cu). One pair of GEMMs per (batch, kv
// head), batched over the query heads that share it (stride 0 on K and V).
#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "impls/cuda/device_case.hpp"
#include "impls/cuda/kernels.hpp"

namespace attn {

namespace {

using cuda::DeviceArgs;

cudaDataType_t cuda_type(DType dtype) {
  return dtype == DType::f16 ? CUDA_R_16F : dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
}

class CublasPlan final : public Plan {
 public:
  CublasPlan(const Problem& p, const AttentionIO& io) : p_(p), io_(io) {
    device_.upload(p, io);
    ATTN_CUBLAS(cublasCreate(&handle_));
    ATTN_CUBLAS(cublasSetMathMode(handle_, CUBLAS_PEDANTIC_MATH));  // no TF32, no reduced-precision reductions
    const std::size_t rows = static_cast<std::size_t>(p.group_size() * p.seq_q);
    scores_ = cuda::DeviceBuffer(rows * static_cast<std::size_t>(std::max<std::int64_t>(p.seq_k, 1)) * sizeof(float));
    probabilities_ = cuda::DeviceBuffer(rows * static_cast<std::size_t>(std::max<std::int64_t>(p.seq_k, 1)) * dtype_size(p.dtype));
  }
  ~CublasPlan() override {
    if (handle_) cublasDestroy(handle_);
  }

  void run() override { launch(); }
  void read_output() override { device_.download(p_, io_); }
  bool has_lse() const override { return true; }
  double run_timed() override { return cuda::time_on_device([&] { run(); }); }
  std::size_t workspace_bytes() const override { return scores_.size() + probabilities_.size(); }

 private:
  void launch() {
    const DeviceArgs& a = device_.args();
    const int group = static_cast<int>(p_.group_size());
    const cudaDataType_t type = cuda_type(p_.dtype);
    const cublasComputeType_t compute = p_.dtype == DType::f32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
    const float one = 1.0f, zero = 0.0f;
    const std::size_t elem = dtype_size(p_.dtype);
    if (p_.seq_k == 0) {
      ATTN_CUDA(cudaMemset(a.out, 0, static_cast<std::size_t>(p_.out_elements()) * elem));
      std::vector<float> lse(static_cast<std::size_t>(p_.rows()), -INFINITY);
      ATTN_CUDA(cudaMemcpy(a.lse, lse.data(), lse.size() * sizeof(float), cudaMemcpyHostToDevice));
      return;
    }
    for (int b = 0; b < a.batch; ++b)
      for (int g = 0; g < a.heads_kv; ++g) {
        const int h0 = g * group;
        const auto* q = static_cast<const char*>(a.q) + ((static_cast<long long>(b) * a.heads_q + h0) * a.seq_q * a.head_dim) * elem;
        const auto* k = static_cast<const char*>(a.k) + ((static_cast<long long>(b) * a.heads_kv + g) * a.seq_k * a.head_dim) * elem;
        const auto* v = static_cast<const char*>(a.v) + ((static_cast<long long>(b) * a.heads_kv + g) * a.seq_k * a.head_dim_v) * elem;
        auto* o = static_cast<char*>(a.out) + ((static_cast<long long>(b) * a.heads_q + h0) * a.seq_q * a.head_dim_v) * elem;
        // S^T (column-major [seq_k, seq_q]) = K Q^T, i.e. row-major S = Q K^T.
        ATTN_CUBLAS(cublasGemmStridedBatchedEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, a.seq_k, a.seq_q, a.head_dim, &one, k,
                                               type, a.head_dim, 0, q, type, a.head_dim,
                                               static_cast<long long>(a.seq_q) * a.head_dim, &zero, scores_.get(),
                                               CUDA_R_32F, a.seq_k, static_cast<long long>(a.seq_q) * a.seq_k, group,
                                               compute, CUBLAS_GEMM_DEFAULT));
        cuda::launch_softmax_rows(a, p_.dtype, static_cast<const float*>(scores_.get()), probabilities_.get(), b, h0,
                                  group * a.seq_q);
        // O^T (column-major [head_dim_v, seq_q]) = V^T P^T, i.e. row-major O = P V.
        ATTN_CUBLAS(cublasGemmStridedBatchedEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, a.head_dim_v, a.seq_q, a.seq_k, &one, v,
                                               type, a.head_dim_v, 0, probabilities_.get(), type, a.seq_k,
                                               static_cast<long long>(a.seq_q) * a.seq_k, &zero, o, type, a.head_dim_v,
                                               static_cast<long long>(a.seq_q) * a.head_dim_v, group, compute,
                                               CUBLAS_GEMM_DEFAULT));
      }
  }

  Problem p_;
  AttentionIO io_;
  cuda::DeviceCase device_;
  cublasHandle_t handle_ = nullptr;
  cuda::DeviceBuffer scores_, probabilities_;
};

class CublasBackend final : public Backend {
 public:
  std::string_view name() const override { return "cuda-cublas"; }
  std::string_view description() const override {
    return "cublasGemmStridedBatchedEx for Q K^T and P V (fp32 accumulation, TF32 off) + a masking softmax kernel";
  }
  // Not float64: the GEMMs run in float32 or 16-bit types. No version 2
  // addition: not extended without a device to test it on.
  Capabilities capabilities() const override { return {.dtypes = dtype_bit(DType::f32) | dtype_bit(DType::f16) | dtype_bit(DType::bf16), .lse = true}; }
  Status available() const override { return cuda::device_status(); }
  Status supports(const Problem&) const override { return Status::yes(); }
  std::unique_ptr<Plan> prepare(const Problem& p, const AttentionIO& io, const RunOptions&) const override {
    return std::make_unique<CublasPlan>(p, io);
  }
};

}  // namespace

std::unique_ptr<Backend> make_cuda_cublas_backend() { return std::make_unique<CublasBackend>(); }

}  // namespace attn
