#include <cstring>
#include <vector>

#include "impls/cuda/device_case.hpp"

namespace attn::cuda {

namespace {

// Gathers a strided host view into a contiguous [b, h, s, d] byte array.
std::vector<unsigned char> gather(const TensorView& v) {
  const std::size_t elem = dtype_size(v.dtype);
  std::vector<unsigned char> out(static_cast<std::size_t>(v.shape[0] * v.shape[1] * v.shape[2] * v.shape[3]) * elem);
  const auto* src = static_cast<const unsigned char*>(v.data);
  std::size_t at = 0;
  for (std::int64_t b = 0; b < v.shape[0]; ++b)
    for (std::int64_t h = 0; h < v.shape[1]; ++h)
      for (std::int64_t s = 0; s < v.shape[2]; ++s)
        for (std::int64_t d = 0; d < v.shape[3]; ++d, at += elem) {
          std::memcpy(out.data() + at, src + static_cast<std::size_t>(v.offset(b, h, s, d)) * elem, elem);
        }
  return out;
}

std::int64_t extent(const Dims4& strides, const Problem& p) {
  const std::int64_t dims[4] = {p.batch, p.heads_q, p.seq_q, p.seq_k};
  std::int64_t last = 0;
  for (int a = 0; a < 4; ++a) last += (dims[a] - 1) * strides[a];
  return last + 1;
}

}  // namespace

void DeviceCase::upload(const Problem& p, const AttentionIO& io) {
  args_.batch = static_cast<int>(p.batch);
  args_.heads_q = static_cast<int>(p.heads_q);
  args_.heads_kv = static_cast<int>(p.heads_kv);
  args_.seq_q = static_cast<int>(p.seq_q);
  args_.seq_k = static_cast<int>(p.seq_k);
  args_.head_dim = static_cast<int>(p.head_dim);
  args_.head_dim_v = static_cast<int>(p.head_dim_v);
  args_.causal = p.causal == Causal::top_left ? 1 : p.causal == Causal::bottom_right ? 2 : 0;
  args_.scale = static_cast<float>(p.scale);
  auto send = [](DeviceBuffer& buffer, const std::vector<unsigned char>& host) {
    buffer = DeviceBuffer(host.size());
    buffer.upload(host.data(), host.size());
    return buffer.get();
  };
  args_.q = send(q_, gather(io.q));
  args_.k = send(k_, gather(io.k));
  args_.v = send(v_, gather(io.v));
  out_ = DeviceBuffer(static_cast<std::size_t>(p.out_elements()) * dtype_size(p.dtype));
  args_.out = out_.get();
  lse_ = DeviceBuffer(static_cast<std::size_t>(p.rows()) * sizeof(float));
  args_.lse = static_cast<float*>(lse_.get());
  if (!io.mask.empty()) {
    const std::int64_t n = extent(io.mask.strides, p);
    std::vector<unsigned char> host(io.mask.data, io.mask.data + n);
    args_.mask = static_cast<const std::uint8_t*>(send(mask_, host));
    for (int a = 0; a < 4; ++a) args_.mask_strides[a] = io.mask.strides[a];
  }
  if (!io.bias.empty()) {
    const std::int64_t n = extent(io.bias.strides, p);
    std::vector<float> host(static_cast<std::size_t>(n));
    for (std::int64_t e = 0; e < n; ++e) host[static_cast<std::size_t>(e)] = static_cast<float>(load_as_double(io.bias.data, e, io.bias.dtype));
    bias_ = DeviceBuffer(host.size() * sizeof(float));
    bias_.upload(host.data(), host.size() * sizeof(float));
    args_.bias = static_cast<const float*>(bias_.get());
    for (int a = 0; a < 4; ++a) args_.bias_strides[a] = io.bias.strides[a];
  }
  if (io.kv_len) {
    std::vector<long long> host(io.kv_len, io.kv_len + p.batch);
    kv_len_ = DeviceBuffer(host.size() * sizeof(long long));
    kv_len_.upload(host.data(), host.size() * sizeof(long long));
    args_.kv_len = static_cast<const long long*>(kv_len_.get());
  }
}

void DeviceCase::download(const Problem& p, const AttentionIO& io) const {
  ATTN_CUDA(cudaDeviceSynchronize());
  const std::size_t elem = dtype_size(p.dtype);
  std::vector<unsigned char> host(out_.size());
  out_.download(host.data(), host.size());
  auto* dst = static_cast<unsigned char*>(io.out.data);
  std::size_t at = 0;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.seq_q; ++i)
        for (std::int64_t d = 0; d < p.head_dim_v; ++d, at += elem) {
          std::memcpy(dst + static_cast<std::size_t>(io.out.offset(b, h, i, d)) * elem, host.data() + at, elem);
        }
  if (io.lse) {
    std::vector<float> lse(static_cast<std::size_t>(p.rows()));
    lse_.download(lse.data(), lse.size() * sizeof(float));
    for (std::size_t r = 0; r < lse.size(); ++r) io.lse[r] = lse[r];
  }
}

std::size_t DeviceCase::bytes() const {
  return q_.size() + k_.size() + v_.size() + out_.size() + lse_.size() + mask_.size() + bias_.size() + kv_len_.size();
}

}  // namespace attn::cuda
