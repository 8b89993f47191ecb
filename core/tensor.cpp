#include "attnbench/tensor.hpp"

#include <cstdlib>
#include <new>

namespace attn {

Dims4 contiguous_strides(const Dims4& shape) {
  Dims4 strides{};
  std::int64_t step = 1;
  for (int a = 3; a >= 0; --a) {
    strides[a] = step;
    step *= shape[a];
  }
  return strides;
}

Dims4 layout_strides(const Dims4& shape, Layout layout) {
  if (layout == Layout::bhsd) return contiguous_strides(shape);
  // Stored as [batch, seq, heads, dim].
  Dims4 stored = contiguous_strides({shape[0], shape[2], shape[1], shape[3]});
  return {stored[0], stored[2], stored[1], stored[3]};
}

Dims4 broadcast_strides(const BroadcastShape& shape, std::int64_t seq_k) {
  Dims4 strides = contiguous_strides({shape.batch, shape.heads, shape.rows, seq_k});
  if (shape.batch == 1) strides[0] = 0;
  if (shape.heads == 1) strides[1] = 0;
  if (shape.rows == 1) strides[2] = 0;
  return strides;
}

Buffer::Buffer(std::size_t bytes) : bytes_(bytes) {
  std::size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (p == nullptr) throw std::bad_alloc();
  data_.reset(p);
}

void Buffer::Free::operator()(void* p) const { std::free(p); }

}  // namespace attn
