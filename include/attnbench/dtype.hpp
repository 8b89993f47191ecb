// Element types of attention inputs and outputs: float64, float32, float16 and
// bfloat16, with conversions that round to nearest even and keep subnormals,
// infinities and NaN. The 16-bit types are plain bit containers; arithmetic is
// done after widening to float (or double).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace attn {

enum class DType : std::uint8_t { f64, f32, f16, bf16 };

// Sets of dtypes as bits (Capabilities::dtypes).
inline constexpr unsigned dtype_bit(DType dtype) { return 1u << static_cast<unsigned>(dtype); }
inline constexpr unsigned kAllDTypes = 0xfu;
// "float32, float16" for a set of bits, in the order float64, float32, float16, bfloat16.
std::string dtype_names(unsigned dtypes);

// Canonical names as in the fixture format: float64, float32, float16, bfloat16.
std::string_view dtype_name(DType dtype);
// Short names used in problem strings: f64, f32, f16, bf16.
std::string_view dtype_short_name(DType dtype);
// Accepts both the canonical and the short name.
std::optional<DType> parse_dtype(std::string_view text);
inline std::string_view format_as(DType dtype) { return dtype_name(dtype); }

std::size_t dtype_size(DType dtype);
// Unit roundoff u = 2^-(p) where p is the number of significand bits
// (including the implicit one) minus one: 2^-53, 2^-24, 2^-11, 2^-8.
double unit_roundoff(DType dtype);
// Largest finite value of the type.
double dtype_max(DType dtype);

struct f16 {
  std::uint16_t bits = 0;
};
struct bf16 {
  std::uint16_t bits = 0;
};

// Exact widening.
float f16_to_float(f16 value);
inline float bf16_to_float(bf16 value) {
  const std::uint32_t bits = static_cast<std::uint32_t>(value.bits) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// Round to nearest, ties to even, from float or double directly (no double
// rounding through float). Overflow goes to infinity, NaN stays NaN (quiet).
// float_to_bf16 is inline: backends convert every output element with it.
f16 float_to_f16(float value);
f16 double_to_f16(double value);
inline bf16 float_to_bf16(float value) {
  std::uint32_t x;
  std::memcpy(&x, &value, sizeof x);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return bf16{static_cast<std::uint16_t>((x >> 16) | 0x0040)};  // quiet NaN
  x += 0x7FFFu + ((x >> 16) & 1u);
  return bf16{static_cast<std::uint16_t>(x >> 16)};
}
bf16 double_to_bf16(double value);

// Rounds a double to the nearest value representable in `dtype` and returns
// it as a double (the identity for f64).
double round_to_dtype(double value, DType dtype);
// The dtype's largest finite value.
double largest_finite(DType dtype);
bool is_representable(double value, DType dtype);

// Element access helpers used by generic code (reference, verifier, naive).
double load_as_double(const void* base, std::int64_t index, DType dtype);
void store_from_double(void* base, std::int64_t index, DType dtype, double value);

// Kernel-side helpers, inline so loops over them vectorise.
inline float to_float(float x) { return x; }
inline float to_float(f16 x) { return f16_to_float(x); }
inline float to_float(bf16 x) { return bf16_to_float(x); }
inline double to_float(double x) { return x; }

template <typename T> T from_float(float x);
template <> inline float from_float<float>(float x) { return x; }
template <> inline f16 from_float<f16>(float x) { return float_to_f16(x); }
template <> inline bf16 from_float<bf16>(float x) { return float_to_bf16(x); }

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<f16>() { return DType::f16; }
template <> constexpr DType dtype_of<bf16>() { return DType::bf16; }

// Calls fn(T{}) with T the C++ element type of `dtype`.
template <typename Fn> decltype(auto) dispatch_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f64: return fn(double{});
    case DType::f32: return fn(float{});
    case DType::f16: return fn(f16{});
    case DType::bf16: break;
  }
  return fn(bf16{});
}

}  // namespace attn
