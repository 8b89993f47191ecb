// Strided tensor views and an aligned owning buffer. A view never owns memory;
// its strides are in elements, so one kernel can read BHSD and BSHD alike, and
// a stride of 0 expresses broadcasting (masks and biases).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "attnbench/dtype.hpp"
#include "attnbench/problem.hpp"

namespace attn {

using Dims4 = std::array<std::int64_t, 4>;

template <typename Ptr> struct BasicTensorView {
  Ptr data = nullptr;
  DType dtype = DType::f32;
  Dims4 shape{};    // logical [batch, heads, seq, dim]
  Dims4 strides{};  // elements to step along each logical axis

  bool empty() const { return data == nullptr; }
  std::int64_t offset(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) const {
    return b * strides[0] + h * strides[1] + s * strides[2] + d * strides[3];
  }
  template <typename T> auto* as() const {
    using Elem = std::conditional_t<std::is_const_v<std::remove_pointer_t<Ptr>>, const T, T>;
    return static_cast<Elem*>(data);
  }
  // Index of the element one past the furthest one the view reaches.
  std::int64_t extent() const;
};

using TensorView = BasicTensorView<const void*>;
using MutableTensorView = BasicTensorView<void*>;

template <typename Ptr> std::int64_t BasicTensorView<Ptr>::extent() const {
  std::int64_t last = 0;
  for (int a = 0; a < 4; ++a) {
    if (shape[a] == 0) return 0;
    last += (shape[a] - 1) * strides[a];
  }
  return last + 1;
}

// Element `at` (an offset from the view's strides) widened to float, and a
// float rounded into the view's dtype: for backends that widen inputs or
// narrow results element by element.
inline float load_float(const TensorView& v, std::int64_t at) {
  switch (v.dtype) {
    case DType::f32: return static_cast<const float*>(v.data)[at];
    case DType::f16: return f16_to_float(static_cast<const f16*>(v.data)[at]);
    case DType::bf16: return bf16_to_float(static_cast<const bf16*>(v.data)[at]);
    case DType::f64: break;
  }
  return static_cast<float>(static_cast<const double*>(v.data)[at]);
}
inline void store_float(const MutableTensorView& v, std::int64_t at, float value) {
  switch (v.dtype) {
    case DType::f32: static_cast<float*>(v.data)[at] = value; return;
    case DType::f16: static_cast<f16*>(v.data)[at] = float_to_f16(value); return;
    case DType::bf16: static_cast<bf16*>(v.data)[at] = float_to_bf16(value); return;
    case DType::f64: break;
  }
  static_cast<double*>(v.data)[at] = value;
}

// A uint8 mask (non-zero = attend) seen as [batch, heads_q, seq_q, seq_k].
struct MaskView {
  const std::uint8_t* data = nullptr;
  Dims4 strides{};
  bool empty() const { return data == nullptr; }
  std::uint8_t at(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return data[b * strides[0] + h * strides[1] + i * strides[2] + j * strides[3]];
  }
};

// Row-major strides of `shape`.
Dims4 contiguous_strides(const Dims4& shape);
// Strides of a logical [batch, heads, seq, dim] tensor stored in `layout`.
Dims4 layout_strides(const Dims4& shape, Layout layout);
// Strides of a [mb, mh, mq, seq_k] broadcast array seen as [batch, heads_q, seq_q, seq_k]:
// broadcast axes get stride 0.
Dims4 broadcast_strides(const BroadcastShape& shape, std::int64_t seq_k);

// 64-byte aligned, uninitialised storage.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(std::size_t bytes);
  void* data() { return data_.get(); }
  const void* data() const { return data_.get(); }
  std::size_t size() const { return bytes_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> data_;
  std::size_t bytes_ = 0;
};

}  // namespace attn
