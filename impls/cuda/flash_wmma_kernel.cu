// The tensor-core path of cuda-flash, for float16 and bfloat16 (device code
// only; the backend is in flash.cpp). FlashAttention-2's loop with WMMA
// 16x16x16 tiles:
//
//   one block of 4 warps per (64 queries, query head, batch); warp w owns
//   query rows [16w, 16w + 16). Q stays in shared memory for the whole block;
//   per tile of kKeys keys, K and V are staged in shared memory, each warp
//   computes S = Q K^T on tensor cores (float32 accumulators), applies scale,
//   bias and every mask rule, folds the tile into its rows' running max and
//   sum (online softmax, the rescale only where the max grew), rounds P to
//   the input type and accumulates O += P V on tensor cores.
//
// WMMA does not say which accumulator element belongs to which row, so the
// per-row rescale of O cannot happen in registers: O lives in shared memory
// as float32, loaded into accumulator fragments for P V and stored back. That
// costs shared-memory traffic that an mma.sync kernel with a known register
// layout avoids; it keeps this kernel short and its correctness easy to see.
// Tiles past the block's last visible key (causal, kv_len) are skipped.
#include <cfloat>

#include <mma.h>

#include "attnbench/error.hpp"
#include "impls/cuda/device_common.cuh"
#include "impls/cuda/kernels.hpp"

namespace attn::cuda {

namespace {

using namespace nvcuda;

constexpr int kRows = 64;              // queries per block
constexpr int kWarps = kRows / 16;     // one warp per 16 rows
constexpr int kThreads = kWarps * 32;

// Shared memory of one block, carved from the dynamic allocation; every part
// starts on a 128-byte boundary (WMMA needs 32).
struct Layout {
  int d_pad, dv_pad, keys;
  size_t q, k, v, s, p, o, m, l, total;
  __host__ __device__ Layout(int head_dim, int head_dim_v, int keys_per_tile, int elem) {
    d_pad = (head_dim + 15) / 16 * 16;
    dv_pad = (head_dim_v + 15) / 16 * 16;
    keys = keys_per_tile;
    size_t at = 0;
    q = take(at, static_cast<size_t>(kRows) * d_pad * elem);
    k = take(at, static_cast<size_t>(keys) * d_pad * elem);
    v = take(at, static_cast<size_t>(keys) * dv_pad * elem);
    s = take(at, static_cast<size_t>(kRows) * keys * sizeof(float));
    p = take(at, static_cast<size_t>(kRows) * keys * elem);
    o = take(at, static_cast<size_t>(kRows) * dv_pad * sizeof(float));
    m = take(at, kRows * sizeof(float));
    l = take(at, kRows * sizeof(float));
    total = at;
  }
  // Reserves `bytes` at `at`, rounded up to 128; returns where they start.
  __host__ __device__ static size_t take(size_t& at, size_t bytes) {
    const size_t here = at;
    at += (bytes + 127) / 128 * 128;
    return here;
  }
};

// 64 keys per tile while Q, K, V, S, P and O fit comfortably; 32 for the
// widest heads (head_dim 256 needs 140 KiB even so, within an A100's 163).
__host__ __device__ inline int keys_per_tile(int head_dim, int head_dim_v) {
  return head_dim + head_dim_v <= 256 ? 64 : 32;
}

// Copies rows [first, first + count) of a [rows_total][dim] tensor into a
// [count][dim_pad] shared tile, zero past rows_total and past dim.
template <typename T>
__device__ inline void stage(T* tile, const T* src, long long base_row, int first, int count, int rows_total, int dim,
                             int dim_pad) {
  for (int e = threadIdx.x; e < count * dim_pad; e += kThreads) {
    const int r = e / dim_pad, d = e % dim_pad;
    const int row = first + r;
    tile[e] = row < rows_total && d < dim ? src[(base_row + row) * dim + d] : T(0.0f);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) flash_wmma(DeviceArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Layout lay(a.head_dim, a.head_dim_v, keys_per_tile(a.head_dim, a.head_dim_v), sizeof(T));
  T* qs = reinterpret_cast<T*>(smem + lay.q);
  T* ks = reinterpret_cast<T*>(smem + lay.k);
  T* vs = reinterpret_cast<T*>(smem + lay.v);
  float* ss = reinterpret_cast<float*>(smem + lay.s);
  T* ps = reinterpret_cast<T*>(smem + lay.p);
  float* os = reinterpret_cast<float*>(smem + lay.o);
  float* ms = reinterpret_cast<float*>(smem + lay.m);
  float* ls = reinterpret_cast<float*>(smem + lay.l);
  const int kKeys = lay.keys, d_pad = lay.d_pad, dv_pad = lay.dv_pad;

  const int q0 = blockIdx.x * kRows, h = blockIdx.y, b = blockIdx.z;
  const int g = h / (a.heads_q / a.heads_kv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const long long q_rows = (static_cast<long long>(b) * a.heads_q + h) * a.seq_q;
  const long long kv_rows = (static_cast<long long>(b) * a.heads_kv + g) * a.seq_k;

  stage(qs, static_cast<const T*>(a.q), q_rows, q0, kRows, a.seq_q, a.head_dim, d_pad);
  for (int e = threadIdx.x; e < kRows * dv_pad; e += kThreads) os[e] = 0.0f;
  if (threadIdx.x < kRows) {
    ms[threadIdx.x] = -INFINITY;
    ls[threadIdx.x] = 0.0f;
  }

  // Each lane pair owns one of the warp's 16 rows and half of its columns.
  const int r = warp * 16 + lane / 2, half = lane % 2;
  const int i = q0 + r;
  const bool real = i < a.seq_q;
  const int row_end = real ? key_end(a, b, i) : 0;
  const int block_end = key_end(a, b, min(a.seq_q - 1, q0 + kRows - 1));

  for (int j0 = 0; j0 < block_end; j0 += kKeys) {
    __syncthreads();  // the previous tile's K and V are no longer read
    stage(ks, static_cast<const T*>(a.k), kv_rows, j0, kKeys, a.seq_k, a.head_dim, d_pad);
    stage(vs, static_cast<const T*>(a.v), kv_rows, j0, kKeys, a.seq_k, a.head_dim_v, dv_pad);
    __syncthreads();

    // S = Q K^T for the warp's 16 rows: K row-major [key][d] is K^T column-major.
    for (int n = 0; n < kKeys; n += 16) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int kk = 0; kk < d_pad; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kb;
        wmma::load_matrix_sync(qa, qs + warp * 16 * d_pad + kk, d_pad);
        wmma::load_matrix_sync(kb, ks + n * d_pad + kk, d_pad);
        wmma::mma_sync(acc, qa, kb, acc);
      }
      wmma::store_matrix_sync(ss + warp * 16 * kKeys + n, acc, kKeys, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax of the tile, per row, on the lane pair.
    float* srow = ss + r * kKeys;
    T* prow = ps + r * kKeys;
    float tile_max = -INFINITY;
    for (int c = half; c < kKeys; c += 2) {
      const int j = j0 + c;
      float bias, s = -INFINITY;
      if (j < row_end && visible(a, b, h, i, j, &bias)) s = srow[c] * a.scale + bias;
      srow[c] = s;
      tile_max = fmaxf(tile_max, s);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_old = ms[r];
    const float m_new = fmaxf(m_old, tile_max);
    // Nothing visible yet: m stays -inf, P is 0 and O (still 0) needs no rescale.
    const float alpha = m_new == -INFINITY ? 1.0f : __expf(m_old - m_new);
    float sum = 0.0f;
    for (int c = half; c < kKeys; c += 2) {
      const float p = srow[c] == -INFINITY ? 0.0f : __expf(srow[c] - m_new);
      prow[c] = T(p);
      sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    if (alpha != 1.0f) {
      for (int c = half; c < dv_pad; c += 2) os[r * dv_pad + c] *= alpha;
    }
    __syncwarp();  // both lanes have read ms[r]
    if (half == 0) {
      ms[r] = m_new;
      ls[r] = ls[r] * alpha + sum;
    }
    __syncwarp();

    // O += P V for the warp's 16 rows, O round-tripping through shared memory.
    for (int n = 0; n < dv_pad; n += 16) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      float* o_tile = os + warp * 16 * dv_pad + n;
      wmma::load_matrix_sync(acc, o_tile, dv_pad, wmma::mem_row_major);
      for (int kk = 0; kk < kKeys; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> pa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> vb;
        wmma::load_matrix_sync(pa, ps + warp * 16 * kKeys + kk, kKeys);
        wmma::load_matrix_sync(vb, vs + kk * dv_pad + n, dv_pad);
        wmma::mma_sync(acc, pa, vb, acc);
      }
      wmma::store_matrix_sync(o_tile, acc, dv_pad, wmma::mem_row_major);
    }
  }
  __syncthreads();

  if (!real) return;
  const float l = ls[r];
  const float inv = l > 0 ? 1.0f / l : 0.0f;
  const long long out_base = (q_rows + i) * a.head_dim_v;
  for (int c = half; c < a.head_dim_v; c += 2) store<T>(a.out, out_base + c, os[r * dv_pad + c] * inv);
  if (half == 0) a.lse[q_rows + i] = l > 0 ? ms[r] + logf(l) : -INFINITY;
}

template <typename T> void launch(const DeviceArgs& a) {
  const Layout lay(a.head_dim, a.head_dim_v, keys_per_tile(a.head_dim, a.head_dim_v), sizeof(T));
  ATTN_CUDA(cudaFuncSetAttribute(flash_wmma<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(lay.total)));
  dim3 grid(static_cast<unsigned>((a.seq_q + kRows - 1) / kRows), static_cast<unsigned>(a.heads_q),
            static_cast<unsigned>(a.batch));
  flash_wmma<T><<<grid, kThreads, lay.total>>>(a);
  ATTN_CUDA(cudaGetLastError());
}

}  // namespace

std::size_t flash_tensor_core_smem_bytes(int head_dim, int head_dim_v) {
  return Layout(head_dim, head_dim_v, keys_per_tile(head_dim, head_dim_v), 2).total;
}

void launch_flash_tensor_cores(const DeviceArgs& a, DType dtype) {
  if (dtype == DType::f16) launch<__half>(a);
  else if (dtype == DType::bf16) launch<__nv_bfloat16>(a);
  else throw Error("launch_flash_tensor_cores: float16 or bfloat16 only");
}

}  // namespace attn::cuda
