// A case on the GPU: q, k, v and out as contiguous [batch, heads, seq, dim] in
// the case's dtype, the mask and bias in their stored broadcast shapes with
// stride-0 axes, kv_len, lse. Uploaded in prepare, downloaded in read_output.
#pragma once

#include <cstdint>

#include "attnbench/backend.hpp"
#include "impls/cuda/cuda_check.hpp"

namespace attn::cuda {

// Plain parameters every kernel receives (device-visible POD).
struct DeviceArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;  // [batch, heads_q, seq_q]
  const std::uint8_t* mask = nullptr;
  long long mask_strides[4] = {0, 0, 0, 0};
  const float* bias = nullptr;
  long long bias_strides[4] = {0, 0, 0, 0};
  const long long* kv_len = nullptr;
  int batch = 0, heads_q = 0, heads_kv = 0, seq_q = 0, seq_k = 0, head_dim = 0, head_dim_v = 0;
  int causal = 0;  // 0 none, 1 top_left, 2 bottom_right
  float scale = 1;
};

class DeviceCase {
 public:
  void upload(const Problem& p, const AttentionIO& io);
  // Copies out (into io.out's strides) and lse (when io.lse) back.
  void download(const Problem& p, const AttentionIO& io) const;
  const DeviceArgs& args() const { return args_; }
  std::size_t bytes() const;

 private:
  DeviceBuffer q_, k_, v_, out_, lse_, mask_, bias_, kv_len_;
  DeviceArgs args_;
};

}  // namespace attn::cuda
