// Device helpers shared by the CUDA kernels: element loads and stores in the
// case's dtype, and the visibility rule of the fixture format.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "impls/cuda/device_case.hpp"

namespace attn::cuda {

template <typename T> __device__ inline float load(const void* base, long long index);
template <> __device__ inline float load<float>(const void* base, long long index) { return static_cast<const float*>(base)[index]; }
template <> __device__ inline float load<__half>(const void* base, long long index) {
  return __half2float(static_cast<const __half*>(base)[index]);
}
template <> __device__ inline float load<__nv_bfloat16>(const void* base, long long index) {
  return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
}

template <typename T> __device__ inline void store(void* base, long long index, float value);
template <> __device__ inline void store<float>(void* base, long long index, float value) { static_cast<float*>(base)[index] = value; }
template <> __device__ inline void store<__half>(void* base, long long index, float value) {
  static_cast<__half*>(base)[index] = __float2half_rn(value);
}
template <> __device__ inline void store<__nv_bfloat16>(void* base, long long index, float value) {
  static_cast<__nv_bfloat16*>(base)[index] = __float2bfloat16_rn(value);
}

// Keys [0, end) may be visible to query i of batch b (kv_len and causal).
__device__ inline int key_end(const DeviceArgs& a, int b, int i) {
  int end = a.seq_k;
  if (a.kv_len) end = min(end, static_cast<int>(a.kv_len[b]));
  if (a.causal == 1) end = min(end, i + 1);
  if (a.causal == 2) end = min(end, i + a.seq_k - a.seq_q + 1);
  return max(end, 0);
}

// Whether key j (< key_end) is visible to (b, h, i); *bias gets the additive bias.
__device__ inline bool visible(const DeviceArgs& a, int b, int h, int i, int j, float* bias) {
  *bias = 0.0f;
  if (a.mask && a.mask[b * a.mask_strides[0] + h * a.mask_strides[1] + i * a.mask_strides[2] + j * a.mask_strides[3]] == 0) {
    return false;
  }
  if (a.bias) {
    *bias = a.bias[b * a.bias_strides[0] + h * a.bias_strides[1] + i * a.bias_strides[2] + j * a.bias_strides[3]];
    if (isinf(*bias) && *bias < 0) return false;
  }
  return true;
}

// Calls fn(T{}) with T the device element type of dtype (not float64).
template <typename Fn> void dispatch_device_dtype(DType dtype, Fn&& fn) {
  if (dtype == DType::f16) fn(__half{});
  else if (dtype == DType::bf16) fn(__nv_bfloat16{});
  else fn(float{});
}

}  // namespace attn::cuda
