// The softmax kernel of cuda-cublas (device code only; the backend is in cublas.cpp).
#include <cfloat>

#include "impls/cuda/device_common.cuh"
#include "impls/cuda/kernels.hpp"

namespace attn::cuda {

namespace {

// One block per score row (b, h, i): scale, bias, hidden keys, max, exp, sum;
// writes P (normalised, in the GEMM's input type) and lse.
template <typename T>
__global__ void softmax_rows(DeviceArgs a, const float* scores, T* probabilities, int b, int first_head) {
  const int local = blockIdx.x;  // row within the group's [group, seq_q] rows
  const int h = first_head + local / a.seq_q, i = local % a.seq_q;
  const float* s = scores + static_cast<long long>(local) * a.seq_k;
  T* p = probabilities + static_cast<long long>(local) * a.seq_k;
  const int end = key_end(a, b, i);
  __shared__ float reduce[32];
  float m = -FLT_MAX;
  bool any = false;
  for (int j = threadIdx.x; j < end; j += blockDim.x) {
    float bias;
    if (!visible(a, b, h, i, j, &bias)) continue;
    m = fmaxf(m, s[j] * a.scale + bias);
    any = true;
  }
  // Block max (and whether anything is visible).
  for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, offset));
  if (threadIdx.x % 32 == 0) reduce[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < (blockDim.x + 31) / 32 ? reduce[threadIdx.x] : -FLT_MAX;
    for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, offset));
    if (threadIdx.x == 0) reduce[0] = v;
  }
  __syncthreads();
  m = reduce[0];
  __syncthreads();
  (void)any;
  float sum = 0;
  for (int j = threadIdx.x; j < a.seq_k; j += blockDim.x) {
    float bias;
    if (j < end && m > -FLT_MAX && visible(a, b, h, i, j, &bias)) sum += __expf(s[j] * a.scale + bias - m);
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
  if (threadIdx.x % 32 == 0) reduce[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < (blockDim.x + 31) / 32 ? reduce[threadIdx.x] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffff, v, offset);
    if (threadIdx.x == 0) reduce[0] = v;
  }
  __syncthreads();
  sum = reduce[0];
  const float inv = sum > 0 ? 1.0f / sum : 0.0f;
  for (int j = threadIdx.x; j < a.seq_k; j += blockDim.x) {
    float bias, value = 0.0f;
    if (j < end && sum > 0 && visible(a, b, h, i, j, &bias)) value = __expf(s[j] * a.scale + bias - m) * inv;
    store<T>(p, j, value);
  }
  if (threadIdx.x == 0) {
    a.lse[(static_cast<long long>(b) * a.heads_q + h) * a.seq_q + i] = sum > 0 ? m + logf(sum) : -INFINITY;
  }
}

}  // namespace

void launch_softmax_rows(const DeviceArgs& a, DType dtype, const float* scores, void* probabilities, int b, int first_head,
                         int rows) {
  dispatch_device_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    softmax_rows<T><<<rows, 256>>>(a, scores, static_cast<T*>(probabilities), b, first_head);
  });
  ATTN_CUDA(cudaGetLastError());
}

}  // namespace attn::cuda
