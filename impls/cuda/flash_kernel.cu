// The cuda-flash kernel (device code only; the backend is in flash.cpp).
// One thread block per (64-query block, query head, batch); K and V tiles of
// 16 keys staged in shared memory as float; each thread owns one query row and
// keeps its running max, sum and output (online softmax), so the scores never
// reach global memory. Key tiles past the block's last visible key are skipped.
#include <cfloat>

#include "impls/cuda/device_common.cuh"
#include "impls/cuda/kernels.hpp"

namespace attn::cuda {

namespace {


constexpr int kQueries = 64;   // threads (query rows) per block
constexpr int kKeys = 16;      // keys per shared-memory tile
constexpr int kMaxDim = kFlashMaxDim;

template <typename T>
__global__ void __launch_bounds__(kQueries) flash_forward(DeviceArgs a) {
  const int i = blockIdx.x * kQueries + threadIdx.x;
  const int h = blockIdx.y, b = blockIdx.z;
  const int g = h / (a.heads_q / a.heads_kv);
  __shared__ float k_tile[kKeys][kMaxDim];
  __shared__ float v_tile[kKeys][kMaxDim];
  const bool row = i < a.seq_q;
  float q[kMaxDim];
  float o[kMaxDim];
  const long long q_base = ((static_cast<long long>(b) * a.heads_q + h) * a.seq_q + (row ? i : 0)) * a.head_dim;
  for (int d = 0; d < a.head_dim; ++d) q[d] = row ? cuda::load<T>(a.q, q_base + d) * a.scale : 0.0f;
  for (int d = 0; d < a.head_dim_v; ++d) o[d] = 0.0f;
  float m = -FLT_MAX, l = 0.0f;
  const int my_end = row ? cuda::key_end(a, b, i) : 0;
  // The block's last row sees the most keys: tiles past it are skipped.
  const int last_row = min(a.seq_q - 1, static_cast<int>(blockIdx.x) * kQueries + kQueries - 1);
  const int block_end = cuda::key_end(a, b, last_row);
  const long long kv_base = (static_cast<long long>(b) * a.heads_kv + g) * a.seq_k;
  for (int j0 = 0; j0 < block_end; j0 += kKeys) {
    __syncthreads();
    for (int e = threadIdx.x; e < kKeys * a.head_dim; e += kQueries) {
      const int jj = e / a.head_dim, d = e % a.head_dim;
      k_tile[jj][d] = j0 + jj < a.seq_k ? cuda::load<T>(a.k, (kv_base + j0 + jj) * a.head_dim + d) : 0.0f;
    }
    for (int e = threadIdx.x; e < kKeys * a.head_dim_v; e += kQueries) {
      const int jj = e / a.head_dim_v, d = e % a.head_dim_v;
      v_tile[jj][d] = j0 + jj < a.seq_k ? cuda::load<T>(a.v, (kv_base + j0 + jj) * a.head_dim_v + d) : 0.0f;
    }
    __syncthreads();
    for (int jj = 0; jj < kKeys; ++jj) {
      const int j = j0 + jj;
      float bias;
      if (j >= my_end || !cuda::visible(a, b, h, i, j, &bias)) continue;
      float s = bias;
      for (int d = 0; d < a.head_dim; ++d) s = fmaf(q[d], k_tile[jj][d], s);
      if (s > m) {  // rescale only when the max grows
        const float alpha = __expf(m - s);
        for (int d = 0; d < a.head_dim_v; ++d) o[d] *= alpha;
        l *= alpha;
        m = s;
      }
      const float p = __expf(s - m);
      l += p;
      for (int d = 0; d < a.head_dim_v; ++d) o[d] = fmaf(p, v_tile[jj][d], o[d]);
    }
  }
  if (!row) return;
  const long long out_base = ((static_cast<long long>(b) * a.heads_q + h) * a.seq_q + i) * a.head_dim_v;
  const float inv = l > 0 ? 1.0f / l : 0.0f;
  for (int d = 0; d < a.head_dim_v; ++d) cuda::store<T>(a.out, out_base + d, o[d] * inv);
  a.lse[(static_cast<long long>(b) * a.heads_q + h) * a.seq_q + i] = l > 0 ? m + logf(l) : -INFINITY;
}

}  // namespace

void launch_flash(const DeviceArgs& a, DType dtype) {
  dim3 grid(static_cast<unsigned>((a.seq_q + kQueries - 1) / kQueries), static_cast<unsigned>(a.heads_q),
            static_cast<unsigned>(a.batch));
  dispatch_device_dtype(dtype, [&](auto tag) { flash_forward<decltype(tag)><<<grid, kQueries>>>(a); });
  ATTN_CUDA(cudaGetLastError());
}

}  // namespace attn::cuda
