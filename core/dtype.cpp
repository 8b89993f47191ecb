#include "attnbench/dtype.hpp"

#include "core/float_format.hpp"

#include <bit>
#include <cmath>
#include <limits>

#include "attnbench/error.hpp"

namespace attn {

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f64: return "float64";
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
  }
  return "?";
}

std::string_view dtype_short_name(DType dtype) {
  switch (dtype) {
    case DType::f64: return "f64";
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

std::string dtype_names(unsigned dtypes) {
  std::string text;
  for (DType d : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    if (!(dtypes & dtype_bit(d))) continue;
    if (!text.empty()) text += ", ";
    text += dtype_name(d);
  }
  return text;
}

std::optional<DType> parse_dtype(std::string_view text) {
  for (DType d : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    if (text == dtype_name(d) || text == dtype_short_name(d)) return d;
  }
  return std::nullopt;
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f64: return 8;
    case DType::f32: return 4;
    case DType::f16:
    case DType::bf16: return 2;
  }
  return 0;
}

double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::f64: return std::ldexp(1.0, -53);
    case DType::f32: return std::ldexp(1.0, -24);
    case DType::f16: return std::ldexp(1.0, -11);
    case DType::bf16: return std::ldexp(1.0, -8);
  }
  return 0;
}

double dtype_max(DType dtype) {
  switch (dtype) {
    case DType::f64: return std::numeric_limits<double>::max();
    case DType::f32: return std::numeric_limits<float>::max();
    case DType::f16: return 65504.0;
    case DType::bf16: return std::ldexp(255.0, 120);  // (2 - 2^-7) * 2^127
  }
  return 0;
}

namespace detail {

// Rounds a finite double to a binary format with `mantissa_bits` explicit
// significand bits, minimum normal exponent `min_exp` and largest finite value
// `max_finite`, ties to even. Works for any double input, so narrowing never
// rounds twice. Division and multiplication by powers of two are exact here.
double round_to_format(double x, int mantissa_bits, int min_exp, double max_finite) {
  if (!std::isfinite(x) || x == 0.0) return x;
  int exp = std::ilogb(x);
  if (exp < min_exp) exp = min_exp;  // subnormal range: fixed quantum
  double quantum = std::ldexp(1.0, exp - mantissa_bits);
  double scaled = x / quantum;
  // Ties to even by hand (independent of the current rounding mode).
  double floor_v = std::floor(scaled);
  double diff = scaled - floor_v;
  double rounded = floor_v;
  if (diff > 0.5 || (diff == 0.5 && std::fmod(floor_v, 2.0) != 0.0)) rounded = floor_v + 1.0;
  double r = std::copysign(rounded * quantum, x);  // keeps the sign of results that round to zero
  // Overflow: values at or beyond max + half an ulp round to infinity.
  if (std::fabs(r) > max_finite) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return r;
}

}  // namespace detail

namespace {

using detail::round_to_format;

constexpr int kF16Mantissa = 10, kF16MinExp = -14;
constexpr int kBF16Mantissa = 7, kBF16MinExp = -126;

std::uint16_t f16_bits_from_rounded(double r) {
  // r is exactly representable in float16 (or +-inf).
  std::uint16_t sign = std::signbit(r) ? 0x8000 : 0;
  double a = std::fabs(r);
  if (std::isinf(a)) return sign | 0x7C00;
  if (a == 0.0) return sign;
  int exp = std::ilogb(a);
  if (exp < kF16MinExp) {  // subnormal: a = m * 2^-24
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::ldexp(a, 24)));
  }
  auto mant = static_cast<std::uint16_t>(std::ldexp(a, kF16Mantissa - exp) - 1024.0);
  return static_cast<std::uint16_t>(sign | ((exp + 15) << 10) | mant);
}

}  // namespace

float f16_to_float(f16 value) {
  std::uint32_t sign = static_cast<std::uint32_t>(value.bits & 0x8000) << 16;
  std::uint32_t exp = (value.bits >> 10) & 0x1F;
  std::uint32_t mant = value.bits & 0x3FF;
  std::uint32_t out;
  if (exp == 0x1F) {
    out = sign | 0x7F800000u | (mant << 13) | (mant ? 0x00400000u : 0u);
  } else if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {  // subnormal: renormalise
      int shift = std::countl_zero(mant) - 21;  // bring the leading one to bit 10
      mant = (mant << shift) & 0x3FF;
      out = sign | (static_cast<std::uint32_t>(127 - 15 - shift + 1) << 23) | (mant << 13);
    }
  } else {
    out = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(out);
}

f16 double_to_f16(double value) {
  if (std::isnan(value)) return f16{static_cast<std::uint16_t>((std::signbit(value) ? 0x8000 : 0) | 0x7E00)};
  // A double that is a float (every input of a float16 case is) rounds as
  // that float does: the bit-level path, without rounding twice.
  if (const float f = static_cast<float>(value); static_cast<double>(f) == value) return float_to_f16(f);
  return f16{f16_bits_from_rounded(round_to_format(value, kF16Mantissa, kF16MinExp, 65504.0))};
}

f16 float_to_f16(float value) {
  // Bit-level fast path: exact for every float (verified exhaustively against
  // double_to_f16 over the neighbourhood of every float16 in the tests).
  std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000);
  std::uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // inf or NaN
    return f16{static_cast<std::uint16_t>(sign | 0x7C00 | (abs > 0x7F800000u ? 0x0200 | ((abs >> 13) & 0x3FF) : 0))};
  }
  if (abs >= 0x477FF000u) return f16{static_cast<std::uint16_t>(sign | 0x7C00)};  // >= 65520: inf
  if (abs < 0x38800000u) {  // below 2^-14: subnormal or zero in float16
    if (abs < 0x33000000u) return f16{sign};  // <= 2^-25: rounds to zero (tie at 2^-25 goes to even 0)
    std::uint32_t exp = abs >> 23;
    std::uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
    std::uint32_t shift = 126 - exp;  // bits dropped: the quantum is 2^-24
    std::uint32_t kept = mant >> shift;
    std::uint32_t rest = mant & ((1u << shift) - 1);
    std::uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (kept & 1))) ++kept;
    return f16{static_cast<std::uint16_t>(sign | kept)};
  }
  std::uint32_t rounded = abs + 0xFFFu + ((abs >> 13) & 1u);  // ties to even on bit 13
  rounded -= (112u << 23);                                   // rebias exponent 127 -> 15
  return f16{static_cast<std::uint16_t>(sign | (rounded >> 13))};
}

bf16 double_to_bf16(double value) {
  if (std::isnan(value)) return bf16{static_cast<std::uint16_t>((std::signbit(value) ? 0x8000 : 0) | 0x7FC0)};
  if (const float f = static_cast<float>(value); static_cast<double>(f) == value) return float_to_bf16(f);  // as above
  double r = round_to_format(value, kBF16Mantissa, kBF16MinExp, dtype_max(DType::bf16));
  // r is exactly representable in bfloat16, hence in float: truncation is exact.
  return bf16{static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(static_cast<float>(r)) >> 16)};
}

double round_to_dtype(double value, DType dtype) {
  switch (dtype) {
    case DType::f64: return value;
    case DType::f32: return static_cast<double>(static_cast<float>(value));
    case DType::f16: return f16_to_float(double_to_f16(value));
    case DType::bf16: return bf16_to_float(double_to_bf16(value));
  }
  return value;
}

bool is_representable(double value, DType dtype) {
  if (std::isnan(value)) return true;
  return round_to_dtype(value, dtype) == value;
}

double load_as_double(const void* base, std::int64_t index, DType dtype) {
  switch (dtype) {
    case DType::f64: return static_cast<const double*>(base)[index];
    case DType::f32: return static_cast<const float*>(base)[index];
    case DType::f16: return f16_to_float(static_cast<const f16*>(base)[index]);
    case DType::bf16: return bf16_to_float(static_cast<const bf16*>(base)[index]);
  }
  throw Error("load_as_double: unknown dtype");
}

void store_from_double(void* base, std::int64_t index, DType dtype, double value) {
  switch (dtype) {
    case DType::f64: static_cast<double*>(base)[index] = value; return;
    case DType::f32: static_cast<float*>(base)[index] = static_cast<float>(value); return;
    case DType::f16: static_cast<f16*>(base)[index] = double_to_f16(value); return;
    case DType::bf16: static_cast<bf16*>(base)[index] = double_to_bf16(value); return;
  }
  throw Error("store_from_double: unknown dtype");
}

double largest_finite(DType dtype) {
  switch (dtype) {
    case DType::f16: return 65504.0;
    case DType::bf16: return 3.3895313892515355e38;
    case DType::f32: return std::numeric_limits<float>::max();
    case DType::f64: return std::numeric_limits<double>::max();
  }
  return 0;
}

}  // namespace attn
