// Host-callable launchers of the CUDA kernels. The .cu files hold device code
// only; everything else (formatting, the backend classes) is plain C++.
#pragma once

#include <cstddef>

#include "attnbench/dtype.hpp"
#include "impls/cuda/device_case.hpp"

namespace attn::cuda {

inline constexpr int kFlashMaxDim = 256;

// cuda-flash: the fused kernel over the whole case; float32 on CUDA cores.
void launch_flash(const DeviceArgs& args, DType dtype);
// cuda-flash for float16 and bfloat16: the fused kernel on tensor cores (WMMA).
void launch_flash_tensor_cores(const DeviceArgs& args, DType dtype);
// Dynamic shared memory one block of the tensor-core kernel needs.
std::size_t flash_tensor_core_smem_bytes(int head_dim, int head_dim_v);
// cuda-cublas: softmax of `rows` score rows of batch b, query heads from
// first_head, into probabilities (dtype) and args.lse.
void launch_softmax_rows(const DeviceArgs& args, DType dtype, const float* scores, void* probabilities, int b,
                         int first_head, int rows);

}  // namespace attn::cuda
