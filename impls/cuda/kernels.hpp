// Host-callable launchers of the CUDA kernels. The .cu files hold device code
// only; everything else (formatting, the backend classes) is plain C++.
#pragma once

#include "core/dtype.hpp"
#include "impls/cuda/device_case.hpp"

namespace attn::cuda {

inline constexpr int kFlashMaxDim = 256;

// cuda-flash: the fused kernel over the whole case.
void launch_flash(const DeviceArgs& args, DType dtype);
// cuda-cublas: softmax of `rows` score rows of batch b, query heads from
// first_head, into probabilities (dtype) and args.lse.
void launch_softmax_rows(const DeviceArgs& args, DType dtype, const float* scores, void* probabilities, int b,
                         int first_head, int rows);

}  // namespace attn::cuda
