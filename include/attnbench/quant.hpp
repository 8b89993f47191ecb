// Quantised inputs (format version 4, docs/format/v4.md): the encodings a
// tensor's codes may be stored in, what dequantises them, and the decoders a
// kernel calls on the codes it reads. Every decoder is exact: a code, its
// scale, zero point and descale give one float64 value, which is the truth.
//
//   value = (decode(code) - zero_point) * scale * descale
//
// decode: the fp8 value of the code, the integer, or a ggml block's d * q;
// zero point (integer encodings), scale (fp8 and integer encodings, broadcast
// over the stored tensor's [batch, heads, seq, group]) and descale (fp8 and
// ggml, one per tensor or per (batch entry, kv head)) each default to absent.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "attnbench/dtype.hpp"

namespace attn {

enum class Encoding : std::uint8_t {
  none,  // the case's dtype, as in versions 1-3
  e4m3,  // float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinity, S.1111.111 is NaN; max 448
  e5m2,  // float8_e5m2: the top byte of an IEEE half: bias 15, infinities and NaN; max 57344
  s8,    // int8, two's complement
  u8,    // uint8
  s4,    // int4 in [-8, 7], two per byte: element 2n in the low nibble of byte n, 2n + 1 in the high one
  u4,    // uint4 in [0, 15], packed as s4
  q8_0,  // ggml blocks of 32: float16 d (little-endian), 32 int8 q; x = d * q (34 bytes)
  q4_0,  // ggml blocks of 32: float16 d, 16 bytes; byte n: element n low nibble, n + 16 high; x = d * (q - 8) (18 bytes)
};
inline constexpr int kEncodings = 9;
inline constexpr unsigned encoding_bit(Encoding e) { return 1u << static_cast<unsigned>(e); }
// Every quantised encoding (Capabilities::encodings).
inline constexpr unsigned kAllEncodings = 0x1feu;
// Canonical names as in the fixture format: float8_e4m3fn, float8_e5m2, int8,
// uint8, int4, uint4, q8_0, q4_0 ("none" for none).
std::string_view encoding_name(Encoding encoding);
// Short names in problem strings: e4m3, e5m2, s8, u8, s4, u4, q8_0, q4_0.
std::string_view encoding_short_name(Encoding encoding);
// Accepts both; nullopt for anything else.
std::optional<Encoding> parse_encoding(std::string_view text);
// "float8_e4m3fn, q8_0" for a set of bits.
std::string encoding_names(unsigned encodings);

inline constexpr bool is_fp8(Encoding e) { return e == Encoding::e4m3 || e == Encoding::e5m2; }
inline constexpr bool is_integer(Encoding e) {
  return e == Encoding::s8 || e == Encoding::u8 || e == Encoding::s4 || e == Encoding::u4;
}
inline constexpr bool is_ggml(Encoding e) { return e == Encoding::q8_0 || e == Encoding::q4_0; }
// Bytes of one stored row of `dim` elements (4-bit rows are padded to whole
// bytes; ggml rows need dim a multiple of 32).
inline constexpr std::int64_t encoded_row_bytes(Encoding e, std::int64_t dim) {
  switch (e) {
    case Encoding::s4:
    case Encoding::u4: return (dim + 1) / 2;
    case Encoding::q8_0: return dim / 32 * 34;
    case Encoding::q4_0: return dim / 32 * 18;
    default: return dim;
  }
}
// Integer codes' range: [-128, 127], [0, 255], [-8, 7], [0, 15].
inline constexpr std::int64_t code_min(Encoding e) { return e == Encoding::s8 ? -128 : e == Encoding::s4 ? -8 : 0; }
inline constexpr std::int64_t code_max(Encoding e) {
  return e == Encoding::s8 ? 127 : e == Encoding::u8 ? 255 : e == Encoding::s4 ? 7 : 15;
}

// How a tensor's descale is indexed.
enum class Descale : std::uint8_t {
  none,
  tensor,      // one value: [1]
  entry_head,  // [batch, heads_kv]: batch entry b, kv head g (a query head h reads g = h / (heads_q / heads_kv))
};

// What one of q, k, v is stored as (Problem::quant). Shape of the scale:
// [batch, heads, seq, groups] of the stored tensor, each of the first three 1
// (broadcast) or the full size, groups dividing the row's width (groups of
// width / groups consecutive elements; 1: one per row, width: one per element).
struct QuantSpec {
  Encoding encoding = Encoding::none;
  Descale descale = Descale::none;
  std::array<std::int64_t, 4> scale{};  // all 0: no scale
  bool zero_point = false;              // int32, the scale's shape
  bool quantised() const { return encoding != Encoding::none; }
  bool has_scale() const { return scale[0] > 0; }
  bool operator==(const QuantSpec&) const = default;
};

// The fp8 value of a code (NaN codes give NaN, e5m2's infinities infinity).
float e4m3_to_float(std::uint8_t code);
inline float e5m2_to_float(std::uint8_t code) { return f16_to_float(f16{static_cast<std::uint16_t>(code << 8)}); }
// The code of x rounded to nearest even; beyond the largest finite value:
// that value when `saturate`, else NaN (e4m3, which has no infinity) or
// infinity (e5m2); NaN gives the NaN code.
std::uint8_t float_to_e4m3(double x, bool saturate = true);
std::uint8_t float_to_e5m2(double x, bool saturate = true);

// A ggml block's d: float16, little-endian, at the block's first two bytes.
inline float ggml_block_d(const std::uint8_t* block) {
  return f16_to_float(f16{static_cast<std::uint16_t>(block[0] | (block[1] << 8))});
}

// Decodes a stored row of `dim` elements into out, without zero point, scale
// or descale: the fp8 values, the integers, a ggml block's d * q. Exact in
// float (every such value is).
void decode_row(Encoding encoding, const std::uint8_t* row, std::int64_t dim, float* out);

// Quantises a row as ggml's reference quantisers do (quantize_row_q8_0_ref,
// quantize_row_q4_0_ref): dim a multiple of 32.
void ggml_quantise_row(Encoding encoding, const double* x, std::int64_t dim, std::uint8_t* row);

// One quantised tensor as a backend reads it (AttentionIO::quant): the codes
// in rows of encoded_row_bytes(encoding, dim) bytes, indexed like the dtype
// tensors ([batch, heads, seq] of the stored tensor, strides in bytes), and
// what dequantises them.
struct QuantView {
  Encoding encoding = Encoding::none;
  const std::uint8_t* codes = nullptr;
  std::array<std::int64_t, 3> strides{};  // bytes per step of batch, heads, seq
  std::int64_t dim = 0;                   // elements per row
  // scale[b, h, s, d / group] with 0 strides on broadcast axes; nullptr: 1.
  const float* scale = nullptr;
  std::array<std::int64_t, 3> scale_strides{};  // batch, heads, seq; the group index steps by 1
  std::int64_t group = 0;                       // elements sharing one scale along the row
  const std::int32_t* zero_point = nullptr;     // as scale; nullptr: 0
  // descale[entry * descale_batch_stride + kv_head * descale_head_stride];
  // nullptr: 1. A query head's kv head is h / descale_group (heads_q /
  // heads_kv for q, 1 for k and v).
  const float* descale = nullptr;
  std::int64_t descale_batch_stride = 0, descale_head_stride = 0, descale_group = 1;

  bool empty() const { return codes == nullptr; }
  const std::uint8_t* row(std::int64_t b, std::int64_t h, std::int64_t s) const {
    return codes + b * strides[0] + h * strides[1] + s * strides[2];
  }
  // The descale of batch entry `entry` (not the page: paged K and V are
  // descaled per sequence) and head h of this tensor.
  float descale_of(std::int64_t entry, std::int64_t h) const {
    return descale ? descale[entry * descale_batch_stride + (h / descale_group) * descale_head_stride] : 1.0f;
  }
  // Row (b, h, s) dequantised into out (dim floats): (decode - zero point) *
  // scale, rounded once to float; the descale is left to the caller.
  void dequantise_row(std::int64_t b, std::int64_t h, std::int64_t s, float* out) const;
  // The same exactly, in double (for float64 computations).
  void dequantise_row(std::int64_t b, std::int64_t h, std::int64_t s, double* out) const;
};

}  // namespace attn
