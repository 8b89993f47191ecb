// Conversions of the 16-bit types, checked exhaustively over all 65,536 bit
// patterns of each, against values computed independently with ldexp.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "attnbench/dtype.hpp"

using namespace attn;

namespace {

// Independent decoding of an IEEE binary16 bit pattern.
double decode_f16(std::uint16_t bits) {
  int sign = bits >> 15, exp = (bits >> 10) & 0x1F, mant = bits & 0x3FF;
  double s = sign ? -1.0 : 1.0;
  if (exp == 0x1F) return mant ? std::numeric_limits<double>::quiet_NaN() : s * INFINITY;
  if (exp == 0) return s * std::ldexp(mant, -24);
  return s * std::ldexp(1024 + mant, exp - 25);
}

double decode_bf16(std::uint16_t bits) {
  int sign = bits >> 15, exp = (bits >> 7) & 0xFF, mant = bits & 0x7F;
  double s = sign ? -1.0 : 1.0;
  if (exp == 0xFF) return mant ? std::numeric_limits<double>::quiet_NaN() : s * INFINITY;
  if (exp == 0) return s * std::ldexp(mant, -133);
  return s * std::ldexp(128 + mant, exp - 134);
}

bool same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b)); }

}  // namespace

TEST(Float16, DecodesEveryBitPatternExactly) {
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    auto b = static_cast<std::uint16_t>(bits);
    ASSERT_TRUE(same(f16_to_float(f16{b}), decode_f16(b))) << "bits " << bits;
  }
}

TEST(Float16, EveryValueRoundTripsFromFloatAndDouble) {
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    auto b = static_cast<std::uint16_t>(bits);
    double x = decode_f16(b);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(static_cast<float>(x)))));
      EXPECT_TRUE(std::isnan(f16_to_float(double_to_f16(x))));
      continue;
    }
    ASSERT_EQ(float_to_f16(static_cast<float>(x)).bits, b) << "bits " << bits;
    ASSERT_EQ(double_to_f16(x).bits, b) << "bits " << bits;
  }
}

// Between every pair of neighbouring finite float16 values: the midpoint goes
// to the even one, and the nearest floats on either side of it go to the
// nearer value; from double, a hair either side of the midpoint does too.
TEST(Float16, RoundsToNearestEvenBetweenEveryPairOfNeighbours) {
  for (std::uint32_t bits = 0; bits < 0x7C00; ++bits) {
    for (std::uint16_t sign : {std::uint16_t{0}, std::uint16_t{0x8000}}) {
      auto lo = static_cast<std::uint16_t>(bits | sign), hi = static_cast<std::uint16_t>((bits + 1) | sign);
      double a = decode_f16(lo), b = decode_f16(hi);
      // Above 65504 the next step would be 65536: the midpoint 65520 and
      // everything past it rounds to infinity.
      if (std::isinf(b)) b = std::copysign(65536.0, a);
      double mid = (a + b) / 2;  // exact in double
      std::uint16_t even = (lo & 1) == 0 ? lo : hi;
      if (bits + 1 == 0x7C00) even = hi;
      ASSERT_EQ(double_to_f16(mid).bits, even) << "bits " << bits;
      ASSERT_EQ(float_to_f16(static_cast<float>(mid)).bits, even) << "bits " << bits;
      double below = std::nextafter(mid, a), above = std::nextafter(mid, b);
      ASSERT_EQ(double_to_f16(below).bits, lo);
      ASSERT_EQ(double_to_f16(above).bits, hi);
      ASSERT_EQ(float_to_f16(std::nextafter(static_cast<float>(mid), static_cast<float>(a))).bits, lo);
      ASSERT_EQ(float_to_f16(std::nextafter(static_cast<float>(mid), static_cast<float>(b))).bits, hi);
    }
  }
}

TEST(Float16, OverflowAndUnderflow) {
  EXPECT_EQ(float_to_f16(65504.0f).bits, 0x7BFF);
  EXPECT_EQ(float_to_f16(65519.99f).bits, 0x7BFF);
  EXPECT_EQ(float_to_f16(65520.0f).bits, 0x7C00);
  EXPECT_EQ(float_to_f16(1e10f).bits, 0x7C00);
  EXPECT_EQ(float_to_f16(-INFINITY).bits, 0xFC00);
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -25)).bits, 0x0000);               // tie to even zero
  EXPECT_EQ(float_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)).bits, 0x0001);
  EXPECT_EQ(float_to_f16(-0.0f).bits, 0x8000);
  EXPECT_EQ(double_to_f16(1e-30).bits, 0x0000);
}

TEST(BFloat16, DecodesEveryBitPatternExactly) {
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    auto b = static_cast<std::uint16_t>(bits);
    ASSERT_TRUE(same(bf16_to_float(bf16{b}), decode_bf16(b))) << "bits " << bits;
  }
}

TEST(BFloat16, EveryValueRoundTripsAndRoundsToNearestEven) {
  for (std::uint32_t bits = 0; bits < 0x7F80; ++bits) {
    for (std::uint16_t sign : {std::uint16_t{0}, std::uint16_t{0x8000}}) {
      auto lo = static_cast<std::uint16_t>(bits | sign), hi = static_cast<std::uint16_t>((bits + 1) | sign);
      double a = decode_bf16(lo), b = decode_bf16(hi);
      ASSERT_EQ(float_to_bf16(static_cast<float>(a)).bits, lo);
      ASSERT_EQ(double_to_bf16(a).bits, lo);
      if (std::isinf(b)) b = std::copysign(std::ldexp(1.0, 128), a);  // the step past the largest finite value
      double mid = (a + b) / 2;
      std::uint16_t even = (lo & 1) == 0 ? lo : hi;
      ASSERT_EQ(double_to_bf16(mid).bits, even) << "bits " << bits;
      ASSERT_EQ(float_to_bf16(static_cast<float>(mid)).bits, even) << "bits " << bits;
      ASSERT_EQ(double_to_bf16(std::nextafter(mid, a)).bits, lo);
      ASSERT_EQ(double_to_bf16(std::nextafter(mid, b)).bits, hi);
      ASSERT_EQ(float_to_bf16(std::nextafter(static_cast<float>(mid), static_cast<float>(a))).bits, lo);
      ASSERT_EQ(float_to_bf16(std::nextafter(static_cast<float>(mid), static_cast<float>(b))).bits, hi);
    }
  }
}

TEST(BFloat16, NaNStaysNaNAndInfinityStays) {
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the low bits must not become infinity.
  float low_payload_nan = std::bit_cast<float>(0x7F800001u);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(low_payload_nan))));
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(low_payload_nan))));
  EXPECT_EQ(float_to_bf16(INFINITY).bits, 0x7F80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()).bits, 0x7F80);  // rounds up to infinity
  EXPECT_EQ(double_to_bf16(1e39).bits, 0x7F80);
}

TEST(DType, NamesRoundoffAndRepresentability) {
  for (DType d : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    EXPECT_EQ(parse_dtype(dtype_name(d)), d);
    EXPECT_EQ(parse_dtype(dtype_short_name(d)), d);
  }
  EXPECT_FALSE(parse_dtype("float8").has_value());
  EXPECT_EQ(unit_roundoff(DType::f16), std::ldexp(1.0, -11));
  EXPECT_EQ(unit_roundoff(DType::bf16), std::ldexp(1.0, -8));
  EXPECT_TRUE(is_representable(0.5, DType::f16));
  EXPECT_FALSE(is_representable(0.1, DType::f16));
  EXPECT_FALSE(is_representable(0.1, DType::f32));
  EXPECT_TRUE(is_representable(0.1, DType::f64));
  EXPECT_FALSE(is_representable(1.0 + std::ldexp(1.0, -9), DType::bf16));
  EXPECT_EQ(round_to_dtype(1.0 + std::ldexp(1.0, -9), DType::bf16), 1.0);  // tie to even
}
