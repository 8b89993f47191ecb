// Micro-kernels shared by the blocked and streaming CPU backends: a tile of
// Q K^T, a tile of P V, and exp2 with a row sum, in float32 and (for Q K^T and
// P V) bfloat16 dot products. Three implementations: AMX tiles for the
// bfloat16 products (with AVX-512 for the rest), AVX-512 (+BF16) intrinsics,
// and portable C++; `best_kernels()` picks the first the CPU and OS allow
// (ATTN_CPU_ISA=avx512 or =portable forces one of the others).
//
// Layouts (kKeyBlock = 64 keys per tile):
//   Q   float32 [rows][head_dim], or bfloat16 [rows][head_dim_pairs * 2]
//   Kp  float32 [head_dim][64]: the tile's keys transposed, zero past seq_k;
//       bfloat16 [head_dim_pairs][64][2]: pairs of dims interleaved per key
//   S/P float32 [rows][64]; bfloat16 P as [rows][64]
//   V   float32 rows with stride ldv and dv_pad (multiple of 16) columns;
//       bfloat16 Vp [keys / 2][dv_pad][2]: pairs of keys interleaved per column
//   O   float32 [rows][dv_pad]
#pragma once

#include <cstdint>

#include "attnbench/dtype.hpp"
#include "attnbench/quant.hpp"

namespace attn::cpu {

inline constexpr std::int64_t kKeyBlock = 64;

// The rows of up to 64 keys of K or V in place (a decode kernel's input:
// one key block, through the page table when paged): row j at rows[j].
using KeyRows = const void* const*;

// Rows a decode kernel asks the memory for while it computes (a hint: they
// are never read): `n` rows of `row_bytes`, those of the next key block. The
// kernel spreads the requests over its own keys, so they overlap the
// products; issued in one burst they fill the core's miss buffers and the
// products wait behind them.
struct Ahead {
  KeyRows rows = nullptr;
  std::int64_t n = 0, row_bytes = 0;
};

// Asks for bytes [begin, end) (clipped to row_bytes) of ahead rows [r0, r1)
// (clipped to n) into L2: a prefetch to L1 would take the line buffers the
// products' own loads need.
inline void prefetch_rows(const Ahead& a, std::int64_t r0, std::int64_t r1, std::int64_t begin = 0,
                          std::int64_t end = INT64_MAX) {
  if (end > a.row_bytes) end = a.row_bytes;
  if (r1 > a.n) r1 = a.n;
  for (std::int64_t r = r0; r < r1; ++r) {
    const auto row = reinterpret_cast<std::uintptr_t>(a.rows[r]);
    for (std::uintptr_t x = (row + static_cast<std::uintptr_t>(begin)) & ~std::uintptr_t{63}; x < row + static_cast<std::uintptr_t>(end); x += 64) {
      __builtin_prefetch(reinterpret_cast<const void*>(x), 0, 2);
    }
  }
}

// What the rows of K or V a decode kernel reads in place hold: elements of
// `dtype` (float32, bfloat16 or float16), or (format version 4) codes of an
// encoding the kernels decode on load, exactly, to float32: an fp8 value
// (e4m3fn's NaN codes give NaN), or a ggml block's d * q. No scale, zero point
// or descale: the caller folds the descales into Q and the output; a tensor
// with a scale array (every integer encoding) goes through the pack.
struct RowFormat {
  DType dtype = DType::f32;
  Encoding encoding = Encoding::none;
  RowFormat(DType d) : dtype(d) {}  // NOLINT: a dtype is a row format
  RowFormat(Encoding e) : encoding(e) {}  // NOLINT
  // Bytes of a row of `dim` elements.
  std::int64_t row_bytes(std::int64_t dim) const {
    return encoding == Encoding::none ? dim * static_cast<std::int64_t>(dtype_size(dtype)) : encoded_row_bytes(encoding, dim);
  }
};
// The encodings the decode kernels read in place.
inline constexpr bool decodes_in_place(Encoding e) { return is_fp8(e) || is_ggml(e); }

struct Kernels {
  const char* isa;
  // S[r][j] = sum_d Q[r][d] * Kp[d][j] for r < rows, j < cols, and row_max[r] =
  // max_j S[r][j] over those columns (the zero padding past seq_k included):
  // the maximum comes from the registers, so a fully visible block needs no
  // second pass over its scores. cols is 16, 32, 48 or 64; Kp and S rows
  // keep their stride of 64, so columns [c0, c0 + cols) of a block are
  // kp + c0 and s + c0 (a window's edge block computes what its rows see).
  void (*qk_f32)(const float* q, std::int64_t rows, std::int64_t head_dim, const float* kp, float* s, float* row_max,
                 std::int64_t cols);
  // Same over bfloat16 pairs; head_dim_pairs = ceil(head_dim / 2) rounded up to
  // bf16_pairs_align (the padding is zero in Q and Kp). The bfloat16 kernels
  // work on round_up(rows, bf16_rows_align) rows: q, s, p and o must have room
  // for them (what they compute there is never read). row_max, unless null,
  // as qk_f32's (the real rows only).
  void (*qk_bf16)(const bf16* q, std::int64_t rows, std::int64_t head_dim_pairs, const bf16* kp, float* s, float* row_max,
                  std::int64_t cols);
  // O[r][c] += sum_{j < keys} P[r][j] * V[j][c] for c < dv_pad.
  void (*pv_f32)(const float* p, std::int64_t rows, std::int64_t keys, const float* v, std::int64_t ldv,
                 std::int64_t dv_pad, float* o);
  // Same with bfloat16 P and Vp; keys even (the odd one's P is 0).
  void (*pv_bf16)(const bf16* p, std::int64_t rows, std::int64_t keys, const bf16* vp, std::int64_t dv_pad, float* o);
  // x[j] = exp2(scale * x[j] - m) * 2^-shift for j < n, exactly 0 where
  // x[j] = -inf; returns the sum. scale is 1 for finished scores, or the
  // score scale for raw Q K^T products of a fully visible block (then m is in
  // scaled units). shift (0 to 62) keeps sums of weights times V finite: with
  // 2^shift >= the keys of a row, sum_j p_j |v_j| <= max |v| however large V
  // is. The factor is exact in the normal range (the polynomial's
  // coefficients carry it), but weights times subnormal v lose bits, so the
  // backends use shift 0 and redo a tile with weight_shift(seq_k) only when
  // its output came out non-finite. Where scale * x[j] - m <= -126 + shift
  // (a weight under 2^(shift-126) of the largest) a kernel may give 0: the
  // AVX-512 one does, since underflowing costs a microcode assist.
  float (*exp2_sum)(float* x, std::int64_t n, float scale, float m, int shift);
  // exp2_sum over `rows` rows of n scores (row r at x + r * n), each against
  // its own m[r]; sums[r] is row r's sum. One call a key block: the
  // constants are set up once, not once a row.
  void (*exp2_rows)(float* x, std::int64_t rows, std::int64_t n, float scale, const float* m, int shift, float* sums);
  // The same weights written as bfloat16 (round to nearest even) to
  // out + r * n; x is left alone and the sums are of the float32 weights.
  void (*exp2_rows_bf16)(const float* x, std::int64_t rows, std::int64_t n, float scale, const float* m, int shift,
                         bf16* out, float* sums);
  // max_j x[j] for j < n (n >= 1).
  float (*max_of)(const float* x, std::int64_t n);
  // Decode shapes, K and V read in place (no packing): the rows of keys
  // j < keys (<= 64) at k[j] / v[j], of float32, bfloat16 or float16, or
  // codes (`format`, RowFormat), widened or decoded exactly on load,
  // multiplied in float32.
  // S[r][j] = sum_d Q[r][d] * K_j[d]; the columns from keys to 64 are left
  // alone. Each asks for `ahead` (Ahead) while it computes.
  void (*qk_direct)(const float* q, std::int64_t rows, std::int64_t head_dim, KeyRows k, RowFormat format, std::int64_t keys,
                    float* s, const Ahead& ahead);
  // O[r][c] += sum_{j < keys} P[r][j] * V_j[c] for c < dv (no column of V
  // past dv is read; O's columns dv to dv_pad are left alone).
  void (*pv_direct)(const float* p, std::int64_t rows, std::int64_t keys, KeyRows v, RowFormat format, std::int64_t dv,
                    std::int64_t dv_pad, float* o, const Ahead& ahead);
  // bfloat16 Q, K and V with bfloat16 dot products (pairs of exact products
  // summed in float32, as qk_bf16/pv_bf16): Q [rows][ldq] as given (not
  // scaled), K and V rows of bfloat16, P bfloat16 rows of 64; otherwise as
  // qk_direct and pv_direct (dv columns of V read, O's padding left alone).
  // Rows of codes (fp8, ggml) are decoded to bfloat16 on load: fp8 values
  // exactly, a ggml block's d * q rounded to nearest even.
  void (*qk_bf16_direct)(const bf16* q, std::int64_t rows, std::int64_t head_dim, std::int64_t ldq, KeyRows k,
                         RowFormat format, std::int64_t keys, float* s, const Ahead& ahead);
  void (*pv_bf16_direct)(const bf16* p, std::int64_t rows, std::int64_t keys, KeyRows v, RowFormat format,
                         std::int64_t dv, std::int64_t dv_pad, float* o, const Ahead& ahead);
  // x[j] *= scale for begin <= j < end, x[j] = -inf for the other j < 64;
  // returns the max (one pass over a window's or the diagonal's edge row).
  float (*scale_row)(float* x, float scale, std::int64_t begin, std::int64_t end);
  // o[j] *= a for j < n: a row of running sums rescaled when its max grew.
  void (*scale)(float* o, float a, std::int64_t n);
  // o[j] += w * x[j] for j < n, the product rounded, then the sum (no fused
  // multiply-add: the same bits in every kernel set): a split partial merged.
  void (*add_scaled)(float* o, const float* x, float w, std::int64_t n);
  // out[j] = bfloat16(x[j]), round to nearest even, j < n (the AVX-512
  // sets' vcvtneps2bf16 takes subnormal inputs as zero: for P and dS, not
  // for outputs, which scaled_to_bf16 writes).
  void (*to_bf16)(const float* x, std::int64_t n, bf16* out);
  // out[j] = float_to_bf16(x[j] * a) for j < n: an output row written, the
  // product rounded to float, then to bfloat16 as float_to_bf16 rounds (to
  // nearest even, subnormals kept, NaN quiet): the same bits in every set.
  void (*scaled_to_bf16)(const float* x, float a, std::int64_t n, bf16* out);
  // A row of dim int8 (is_signed) or uint8 codes with a scale array (format
  // version 4, packed for the tiles) as QuantView::dequantise_row gives it,
  // bit for bit: out[d] = float(float(q[d] - zero[g]) * scale[g]), g = d /
  // group (zero null: 0; scale null: 1). Every 16 elements from a multiple
  // of 16 share one group: group a multiple of 16, or at least dim.
  void (*dequantise_bytes)(const std::uint8_t* codes, bool is_signed, std::int64_t dim, const float* scale,
                           const std::int32_t* zero, std::int64_t group, float* out);
  // out[j] = float(x[j]) for j < n (exact: every float16 is a float).
  void (*widen_f16)(const f16* x, std::int64_t n, float* out);
  // Rows of 32-bit words transposed: out[w * ld + r] = rows[r][w] for r < n
  // and w < words, in 32-bit words (a float32 dim, or a pair of bfloat16
  // dims): K packed for qk_f32 and qk_bf16 (ld 64). Nothing else is written.
  void (*transpose32)(const void* const* rows, std::int64_t n, std::int64_t words, void* out, std::int64_t ld);
  std::int64_t bf16_rows_align = 1;
  std::int64_t bf16_pairs_align = 1;
};

const Kernels& best_kernels();
const Kernels& portable_kernels();
const Kernels* avx512_kernels();  // nullptr when the CPU lacks AVX-512F/BW/BF16
const Kernels* avx512_vbmi_kernels();  // the same with AVX512_VBMI's fp8 decode; nullptr without it
const Kernels* amx_kernels();     // nullptr without AMX-BF16, or when Linux refuses the tile state

// The smallest shift with 2^shift >= keys (0 for one key or none): what
// exp2_sum needs so that no sum of weights times V can overflow.
inline int weight_shift(std::int64_t keys) {
  int shift = 0;
  while (shift < 62 && (std::int64_t{1} << shift) < keys) ++shift;
  return shift;
}

}  // namespace attn::cpu
