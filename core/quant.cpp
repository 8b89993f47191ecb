#include "attnbench/quant.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "core/float_format.hpp"

namespace attn {

namespace {

struct EncodingNames {
  Encoding encoding;
  std::string_view name, short_name;
};
constexpr std::array<EncodingNames, kEncodings> kNames = {{
    {Encoding::none, "none", "none"},
    {Encoding::e4m3, "float8_e4m3fn", "e4m3"},
    {Encoding::e5m2, "float8_e5m2", "e5m2"},
    {Encoding::s8, "int8", "s8"},
    {Encoding::u8, "uint8", "u8"},
    {Encoding::s4, "int4", "s4"},
    {Encoding::u4, "uint4", "u4"},
    {Encoding::q8_0, "q8_0", "q8_0"},
    {Encoding::q4_0, "q4_0", "q4_0"},
}};

constexpr double kE4m3Max = 448.0, kE5m2Max = 57344.0;

// The 256 values of e4m3fn, once.
const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int code = 0; code < 256; ++code) {
      const int e = (code >> 3) & 0xF, m = code & 7;
      float a;
      if (e == 15 && m == 7) a = std::numeric_limits<float>::quiet_NaN();
      else if (e == 0) a = std::ldexp(static_cast<float>(m), -9);
      else a = std::ldexp(static_cast<float>(8 + m), e - 10);
      t[static_cast<std::size_t>(code)] = (code & 0x80) ? -a : a;
    }
    return t;
  }();
  return table;
}

}  // namespace

std::string_view encoding_name(Encoding encoding) { return kNames[static_cast<std::size_t>(encoding)].name; }
std::string_view encoding_short_name(Encoding encoding) {
  return kNames[static_cast<std::size_t>(encoding)].short_name;
}

std::optional<Encoding> parse_encoding(std::string_view text) {
  for (const EncodingNames& n : kNames) {
    if (text == n.name || text == n.short_name) return n.encoding;
  }
  return std::nullopt;
}

std::string encoding_names(unsigned encodings) {
  std::string text;
  for (const EncodingNames& n : kNames) {
    if (n.encoding == Encoding::none || !(encodings & encoding_bit(n.encoding))) continue;
    if (!text.empty()) text += ", ";
    text += n.name;
  }
  return text;
}

float e4m3_to_float(std::uint8_t code) { return e4m3_table()[code]; }

std::uint8_t float_to_e4m3(double x, bool saturate) {
  if (std::isnan(x)) return 0x7F;
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0;
  double a = detail::round_to_format(std::fabs(x), 3, -6, kE4m3Max);
  if (std::isinf(a)) {
    if (!saturate) return static_cast<std::uint8_t>(sign | 0x7F);  // no infinity: NaN
    a = kE4m3Max;
  }
  if (a == 0) return sign;
  const int exp = std::ilogb(a);
  if (exp < -6) return static_cast<std::uint8_t>(sign | static_cast<int>(std::ldexp(a, 9)));  // subnormal: m * 2^-9
  const int mantissa = static_cast<int>(std::ldexp(a, 3 - exp)) - 8;
  return static_cast<std::uint8_t>(sign | ((exp + 7) << 3) | mantissa);
}

std::uint8_t float_to_e5m2(double x, bool saturate) {
  if (std::isnan(x)) return 0x7E;
  double r = detail::round_to_format(x, 2, -14, kE5m2Max);
  if (std::isinf(r) && saturate) r = std::copysign(kE5m2Max, x);
  // r is a float16 whose low 8 bits are zero: its top byte is the code.
  return static_cast<std::uint8_t>(double_to_f16(r).bits >> 8);
}

void decode_row(Encoding encoding, const std::uint8_t* row, std::int64_t dim, float* out) {
  switch (encoding) {
    case Encoding::e4m3: {
      // A table of the 256 values: measured faster here than moving the
      // code's bits into a float's and scaling by 2^120 (paged decode
      // 27 ms against 47 ms, docs/results/2026-12-04-quantised-decode-amd-epyc.md).
      const auto& table = e4m3_table();
      for (std::int64_t d = 0; d < dim; ++d) out[d] = table[row[d]];
      return;
    }
    case Encoding::e5m2:
      for (std::int64_t d = 0; d < dim; ++d) out[d] = e5m2_to_float(row[d]);
      return;
    case Encoding::s8:
      for (std::int64_t d = 0; d < dim; ++d) out[d] = static_cast<float>(static_cast<std::int8_t>(row[d]));
      return;
    case Encoding::u8:
      for (std::int64_t d = 0; d < dim; ++d) out[d] = static_cast<float>(row[d]);
      return;
    case Encoding::s4:
    case Encoding::u4: {
      const int offset = encoding == Encoding::s4 ? 8 : 0;  // two's complement nibble: (n ^ 8) - 8
      for (std::int64_t d = 0; d < dim; ++d) {
        const int nibble = (row[d / 2] >> ((d & 1) * 4)) & 0xF;
        out[d] = static_cast<float>(offset ? (nibble ^ 8) - 8 : nibble);
      }
      return;
    }
    case Encoding::q8_0:
      for (std::int64_t blk = 0; blk < dim / 32; ++blk) {
        const std::uint8_t* block = row + blk * 34;
        const float d = ggml_block_d(block);
        for (int n = 0; n < 32; ++n) out[blk * 32 + n] = d * static_cast<float>(static_cast<std::int8_t>(block[2 + n]));
      }
      return;
    case Encoding::q4_0:
      for (std::int64_t blk = 0; blk < dim / 32; ++blk) {
        const std::uint8_t* block = row + blk * 18;
        const float d = ggml_block_d(block);
        for (int n = 0; n < 16; ++n) {
          out[blk * 32 + n] = d * static_cast<float>((block[2 + n] & 0xF) - 8);
          out[blk * 32 + n + 16] = d * static_cast<float>((block[2 + n] >> 4) - 8);
        }
      }
      return;
    case Encoding::none: break;
  }
}

void ggml_quantise_row(Encoding encoding, const double* x, std::int64_t dim, std::uint8_t* row) {
  for (std::int64_t blk = 0; blk < dim / 32; ++blk) {
    const double* in = x + blk * 32;
    // ggml computes in float: the same roundings here.
    float amax = 0, max = 0;
    for (int n = 0; n < 32; ++n) {
      const float v = static_cast<float>(in[n]);
      if (std::fabs(v) > amax) amax = std::fabs(v), max = v;
    }
    std::uint8_t* block = row + blk * (encoding == Encoding::q8_0 ? 34 : 18);
    const float d = encoding == Encoding::q8_0 ? amax / 127.0f : max / -8.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    const f16 stored = float_to_f16(d);
    block[0] = static_cast<std::uint8_t>(stored.bits & 0xFF);
    block[1] = static_cast<std::uint8_t>(stored.bits >> 8);
    if (encoding == Encoding::q8_0) {
      for (int n = 0; n < 32; ++n) {
        block[2 + n] = static_cast<std::uint8_t>(static_cast<std::int8_t>(std::round(static_cast<float>(in[n]) * id)));
      }
    } else {
      for (int n = 0; n < 16; ++n) {
        const int lo = std::min(15, static_cast<int>(static_cast<std::int8_t>(static_cast<float>(in[n]) * id + 8.5f)));
        const int hi = std::min(15, static_cast<int>(static_cast<std::int8_t>(static_cast<float>(in[n + 16]) * id + 8.5f)));
        block[2 + n] = static_cast<std::uint8_t>(lo | (hi << 4));
      }
    }
  }
}

void QuantView::dequantise_row(std::int64_t b, std::int64_t h, std::int64_t s, float* out) const {
  decode_row(encoding, row(b, h, s), dim, out);
  if (!scale && !zero_point) return;
  const std::int64_t at = b * scale_strides[0] + h * scale_strides[1] + s * scale_strides[2];
  for (std::int64_t first = 0, g = at; first < dim; first += group, ++g) {
    // exact: a code and a zero point are integers far below 2^24; then one rounding
    const float zero = zero_point ? static_cast<float>(zero_point[g]) : 0.0f, factor = scale ? scale[g] : 1.0f;
    const std::int64_t last = std::min(first + group, dim);
    for (std::int64_t d = first; d < last; ++d) out[d] = (out[d] - zero) * factor;
  }
}

void QuantView::dequantise_row(std::int64_t b, std::int64_t h, std::int64_t s, double* out) const {
  thread_local std::vector<float> decoded;
  decoded.resize(static_cast<std::size_t>(dim));
  decode_row(encoding, row(b, h, s), dim, decoded.data());  // exact in float
  const std::int64_t at = b * scale_strides[0] + h * scale_strides[1] + s * scale_strides[2];
  for (std::int64_t d = 0; d < dim; ++d) {
    double x = decoded[static_cast<std::size_t>(d)];
    if (zero_point) x -= zero_point[at + d / group];
    if (scale) x *= static_cast<double>(scale[at + d / group]);
    out[d] = x;
  }
}

}  // namespace attn
