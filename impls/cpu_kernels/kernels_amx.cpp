// AMX micro-kernels for the bfloat16 products (TDPBF16PS on 16x16 float32
// tiles); every other kernel is the AVX-512 one. The layouts of kernels.hpp
// are already AMX's: Kp [pairs][64][2] and Vp [keys / 2][dv_pad][2] are the
// "VNNI" B operands, Q and P rows the A operands. AMX tiles are 16 rows of
// 64 bytes, so rows are processed 16 at a time and head_dim pairs 16 at a
// time (Geometry pads both; see Kernels::bf16_rows_align).
//
// Linux hands out the 8 KiB of tile state only on request
// (arch_prctl(ARCH_REQ_XCOMP_PERM)); core/cpu.cpp asks once, and
// amx_kernels() returns nullptr when the CPU or the kernel says no.
#include <algorithm>
#include <immintrin.h>

#include <cstdint>

#include "core/cpu.hpp"
#include "impls/cpu_kernels/kernels.hpp"

#define ATTN_AMX __attribute__((target("amx-tile,amx-bf16,avx512f")))

namespace attn::cpu {

namespace {

constexpr int kTile = 16;           // rows per tile, and float32 columns per C tile
constexpr int kPairsPerTile = 16;   // 64 bytes of bfloat16 pairs per A row

// Palette 1: all eight tiles 16 rows x 64 bytes.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

const TileConfig& full_tiles() {
  static const TileConfig config = [] {
    TileConfig c;
    for (int t = 0; t < 8; ++t) {
      c.colsb[t] = 64;
      c.rows[t] = kTile;
    }
    return c;
  }();
  return config;
}

// Loaded at the start of each kernel and released at its end, so no tile
// state outlives a call (a thread switch then saves none, and nothing else
// on this thread sees our configuration).
class TileScope {
 public:
  ATTN_AMX TileScope() { _tile_loadconfig(&full_tiles()); }
  ATTN_AMX ~TileScope() { _tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// Tiles: 0..3 accumulators C[row strip][column], 4..5 A strips, 6..7 B columns.
// TWO_ROWS: two 16-row strips (else one); TWO_COLS: two 16-column tiles.
template <bool TWO_ROWS, bool TWO_COLS>
ATTN_AMX inline void dot_tiles(const void* a, std::int64_t a_stride, std::int64_t a_step, const void* b,
                               std::int64_t b_stride, std::int64_t b_step, std::int64_t b_col_step, std::int64_t steps) {
  const char* ap = static_cast<const char*>(a);
  const char* bp = static_cast<const char*>(b);
  for (std::int64_t k = 0; k < steps; ++k) {
    _tile_loadd(4, ap + k * a_step, a_stride);
    if constexpr (TWO_ROWS) _tile_loadd(5, ap + 16 * a_stride + k * a_step, a_stride);
    _tile_loadd(6, bp + k * b_step, b_stride);
    if constexpr (TWO_COLS) _tile_loadd(7, bp + k * b_step + b_col_step, b_stride);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (TWO_COLS) _tile_dpbf16ps(1, 4, 7);
    if constexpr (TWO_ROWS) _tile_dpbf16ps(2, 5, 6);
    if constexpr (TWO_ROWS && TWO_COLS) _tile_dpbf16ps(3, 5, 7);
  }
}

template <bool TWO_ROWS, bool TWO_COLS>
ATTN_AMX inline void load_c(float* c, std::int64_t stride_bytes) {
  _tile_loadd(0, c, stride_bytes);
  if constexpr (TWO_COLS) _tile_loadd(1, c + kTile, stride_bytes);
  if constexpr (TWO_ROWS) _tile_loadd(2, reinterpret_cast<char*>(c) + 16 * stride_bytes, stride_bytes);
  if constexpr (TWO_ROWS && TWO_COLS) _tile_loadd(3, reinterpret_cast<char*>(c + kTile) + 16 * stride_bytes, stride_bytes);
}

template <bool TWO_ROWS, bool TWO_COLS>
ATTN_AMX inline void store_c(float* c, std::int64_t stride_bytes) {
  _tile_stored(0, c, stride_bytes);
  if constexpr (TWO_COLS) _tile_stored(1, c + kTile, stride_bytes);
  if constexpr (TWO_ROWS) _tile_stored(2, reinterpret_cast<char*>(c) + 16 * stride_bytes, stride_bytes);
  if constexpr (TWO_ROWS && TWO_COLS) _tile_stored(3, reinterpret_cast<char*>(c + kTile) + 16 * stride_bytes, stride_bytes);
}

ATTN_AMX inline void zero_c() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

// S = Q Kp for round_up(rows, 16) rows and the block's 64 keys.
ATTN_AMX void qk_bf16(const bf16* q, std::int64_t rows, std::int64_t pairs, const bf16* kp, float* s, float* row_max,
                      std::int64_t cols) {
  // Fewer columns (never asked for by the backends on AMX, whose tiles are
  // whole): the AVX-512 kernel's.
  if (cols < kKeyBlock) return avx512_kernels()->qk_bf16(q, rows, pairs, kp, s, row_max, cols);
  TileScope scope;
  const std::int64_t q_stride = pairs * 4;                // bytes per Q row
  const std::int64_t k_stride = kKeyBlock * 2 * 2;        // bytes per Kp pair row
  const std::int64_t s_stride = kKeyBlock * 4;            // bytes per S row
  const std::int64_t steps = pairs / kPairsPerTile;
  for (std::int64_t r0 = 0; r0 < rows; r0 += 2 * kTile) {
    const bf16* qr = q + r0 * pairs * 2;
    for (std::int64_t c0 = 0; c0 < kKeyBlock; c0 += 2 * kTile) {
      const bf16* kc = kp + c0 * 2;
      zero_c();
      if (rows - r0 > kTile) {
        dot_tiles<true, true>(qr, q_stride, 64, kc, k_stride, kPairsPerTile * k_stride, 64, steps);
        store_c<true, true>(s + r0 * kKeyBlock + c0, s_stride);
      } else {
        dot_tiles<false, true>(qr, q_stride, 64, kc, k_stride, kPairsPerTile * k_stride, 64, steps);
        store_c<false, true>(s + r0 * kKeyBlock + c0, s_stride);
      }
    }
  }
  for (std::int64_t r = 0; r < rows && row_max; ++r) row_max[r] = *std::max_element(s + r * kKeyBlock, s + (r + 1) * kKeyBlock);
}

template <bool TWO_ROWS, bool TWO_COLS>
ATTN_AMX void pv_tiles(const bf16* p, std::int64_t chunks, const bf16* vp, std::int64_t dv_pad, float* o) {
  const std::int64_t o_stride = dv_pad * 4, v_stride = dv_pad * 4;
  load_c<TWO_ROWS, TWO_COLS>(o, o_stride);
  // A: 16 rows x 32 keys of P (row stride 64 keys); B: 16 key pairs x 16 columns of Vp.
  dot_tiles<TWO_ROWS, TWO_COLS>(p, kKeyBlock * 2, 64, vp, v_stride, 16 * v_stride, 64, chunks);
  store_c<TWO_ROWS, TWO_COLS>(o, o_stride);
}

// O += P Vp for round_up(rows, 16) rows, over keys rounded up to 32: P is 0
// past the block's keys and Vp is 0 past seq_k, so the extra terms are 0.
ATTN_AMX void pv_bf16(const bf16* p, std::int64_t rows, std::int64_t keys, const bf16* vp, std::int64_t dv_pad, float* o) {
  TileScope scope;
  const std::int64_t chunks = (keys + 31) / 32;
  for (std::int64_t r0 = 0; r0 < rows; r0 += 2 * kTile) {
    const bool two_rows = rows - r0 > kTile;
    for (std::int64_t c0 = 0; c0 < dv_pad; c0 += 2 * kTile) {
      const bool two_cols = dv_pad - c0 > kTile;
      const bf16* pr = p + r0 * kKeyBlock;
      const bf16* vc = vp + c0 * 2;
      float* oc = o + r0 * dv_pad + c0;
      if (two_rows && two_cols) pv_tiles<true, true>(pr, chunks, vc, dv_pad, oc);
      else if (two_rows) pv_tiles<true, false>(pr, chunks, vc, dv_pad, oc);
      else if (two_cols) pv_tiles<false, true>(pr, chunks, vc, dv_pad, oc);
      else pv_tiles<false, false>(pr, chunks, vc, dv_pad, oc);
    }
  }
}

}  // namespace

const Kernels* amx_kernels() {
  static const Kernels* chosen = []() -> const Kernels* {
    // AMX's own products, the rest (the decode kernels among them) AVX-512's,
    // with VBMI where the CPU has it (every AMX CPU so far).
    const Kernels* avx = avx512_vbmi_kernels() ? avx512_vbmi_kernels() : avx512_kernels();
    if (!avx || !cpu_features().amx_bf16) return nullptr;
    static Kernels amx = *avx;
    amx.isa = "amx_bf16";
    amx.qk_bf16 = qk_bf16;
    amx.pv_bf16 = pv_bf16;
    amx.bf16_rows_align = kTile;
    amx.bf16_pairs_align = kPairsPerTile;
    return &amx;
  }();
  return chosen;
}

}  // namespace attn::cpu
