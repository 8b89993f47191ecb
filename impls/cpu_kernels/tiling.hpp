// The tile bookkeeping shared by the blocked and streaming backends: which
// query rows form a tile (all query heads of one kv head together), K and V
// of one (batch, kv head) packed for the micro-kernels, the masking of a score
// tile by every rule of the fixture format, and writing the results back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "attnbench/backend.hpp"
#include "attnbench/dropout.hpp"
#include "impls/cpu_kernels/kernels.hpp"

namespace attn::cpu {

// Storage for what the kernels stream through, starting on a cache line: a
// 64-byte load that straddles two lines costs two (paired runs of the Q K^T
// kernel: 3 to 9% slower from std::vector's 16-byte alignment).
template <typename T> struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheLineAllocator() = default;
  template <typename U> CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, kAlign); }
  template <typename U> bool operator==(const CacheLineAllocator<U>&) const noexcept { return true; }
};
template <typename T> using LineVector = std::vector<T, CacheLineAllocator<T>>;

// The n elements of a view from offset `base` on (stride strides[3]) widened
// to float. One offset per row and a switch per row, not per element: packing
// runs once per head and would otherwise cost as much as the products it feeds.
void read_row(const TensorView& v, std::int64_t base, std::int64_t n, float* out);

// Sizes derived from a problem, fixed for a plan.
struct Geometry {
  std::int64_t group = 1;          // query heads per kv head
  std::int64_t tile_queries = 1;   // query positions per tile; rows = tile_queries * group
  std::int64_t tile_rows = 1;      // max rows of a tile
  std::int64_t scratch_rows = 1;   // tile_rows rounded up to what the kernels touch
  std::int64_t query_tiles = 1;    // per (batch, kv head)
  std::int64_t key_blocks = 0;     // ceil(seq_k / 64)
  std::int64_t head_dim_pairs = 1; // bfloat16 pairs along head_dim
  std::int64_t dv_pad = 16;        // head_dim_v rounded up to 16
  bool bf16_kernels = false;       // bfloat16 dot products (else float32)
  float score_scale = 1;           // scale * log2(e): scores live in the log2 domain
  int weight_shift = 0;            // 2^weight_shift >= seq_k: the shift of a tile redone because it overflowed (Kernels::exp2_sum)
  // float32 kernels: pack_queries multiplies Q by score_scale, so Q K^T comes
  // out of the kernel already in the log2 domain (bfloat16 Q stays as given,
  // since rounding a scaled Q to bfloat16 would add an error of its own).
  bool q_prescaled = false;
  // What finish_scores multiplies natural-log terms (softcap, ALiBi, bias) by:
  // log2(e) for the forward's log2-domain scores; 1 for scores in natural
  // units (the backward, with score_scale = scale).
  float score_unit = 1.4426950408889634f;
  static Geometry of(const Problem& p, std::int64_t max_tile_rows, const Kernels& kernels);
  // The same tiles with float32 products whatever the dtype (decode reads
  // 16-bit K and V in place and widens them on load): Q in float32, prescaled.
  Geometry with_float32_products() const;
};

// K and V of one (batch, kv head) in the kernels' layouts, key block by key
// block, each where its keys are (block * 64). Owned per thread and reused:
// a block stays packed until another (batch, kv head) comes or forget() is
// called, so the tiles of a causal or windowed prefill, whose ranges grow or
// slide, pack each block of a head once, not once per tile.
class HeadPack {
 public:
  void reserve(const Problem& p, const Geometry& g, const AttentionIO& io);
  // Packs the blocks of [first_block, end_block) that are not here yet.
  void pack(const Problem& p, const Geometry& g, const AttentionIO& io, std::int64_t b, std::int64_t kv_head,
            std::int64_t first_block, std::int64_t end_block);
  // The inputs may have changed (a new run): nothing packed is kept.
  void forget() { packed_b_ = packed_g_ = -1; }
  const float* k_f32(std::int64_t block) const { return k_f32_.data() + block * kKeyBlock * k_stride_; }
  const bf16* k_bf16(std::int64_t block) const { return k_bf16_.data() + block * kKeyBlock * k_stride_ * 2; }
  // float32 V rows for keys starting at `key`, and their stride.
  const float* v_f32(std::int64_t key) const { return (v_direct_ ? v_direct_ : v_f32_.data()) + key * ldv_; }
  std::int64_t ldv() const { return ldv_; }
  const bf16* v_bf16(std::int64_t key) const { return v_bf16_.data() + key * ldv_; }
  std::size_t bytes() const;

 private:
  void pack_block(const Problem& p, const Geometry& g, const AttentionIO& io, std::int64_t block);
  LineVector<float> k_f32_, v_f32_, row_;
  LineVector<bf16> k_bf16_, v_bf16_, row_bf16_;  // row_bf16_: quantised rows dequantised for the bfloat16 kernels
  std::vector<std::uint8_t> packed_;  // per key block: packed for (packed_b_, packed_g_)
  bool v_in_place_ = false;  // float32 V read where it is (v_direct_, per head)
  const float* v_direct_ = nullptr;
  std::int64_t ldv_ = 0, k_stride_ = 0;
  std::int64_t packed_b_ = -1, packed_g_ = -1;
};

// Format version 4: row s of head `head` of stored batch `b` of a quantised
// tensor, dequantised into `out` with the descale of batch entry `entry`:
// (code - zero point) * scale * descale, in float.
void dequantised_row(const QuantView& codes, std::int64_t b, std::int64_t head, std::int64_t s, std::int64_t entry, float* out);

// One thread's scratch for tiles: packed K/V, the tile's Q, scores (one
// 64-key block, or `score_blocks` of them side by side), P in bfloat16, the
// output accumulators and per-row max, sum and block max. Allocated and
// touched once in prepare.
struct TileScratch {
  HeadPack pack;
  LineVector<float> q, scores, o, m, l, block_max;
  // m and l of a tile's first pass, kept when its sums overflowed and it is
  // redone with the weights scaled down (keep_first_pass): its lse.
  LineVector<float> m0, l0;
  void keep_first_pass(std::int64_t rows);
  LineVector<bf16> q_bf16, p_bf16;
  void reserve(const Problem& p, const AttentionIO& io, const Geometry& g, bool pack_kv, std::int64_t score_blocks);
  std::size_t bytes() const;
  // What reserve() would allocate, at most, worked out before it does.
  static double bytes_for(const Problem& p, const Geometry& g, bool pack_kv, std::int64_t score_blocks);
};

// The query rows of one tile: rows r = position * group + head-in-group.
struct QueryTile {
  std::int64_t b = 0, kv_head = 0, first_query = 0, queries = 0;
  std::int64_t rows() const;  // queries * group
  std::int64_t head(const Geometry& g, std::int64_t r) const { return kv_head * g.group + r % g.group; }
  std::int64_t query(const Geometry& g, std::int64_t r) const { return first_query + r / g.group; }
  std::int64_t group = 1;
};

QueryTile query_tile(const Problem& p, const Geometry& g, std::int64_t index);  // index over b, kv head, tile

// Q rows of a tile in the kernels' layout: float32 [rows][head_dim] (times
// score_scale) or bfloat16 [rows][pairs * 2].
void pack_queries(const Problem& p, const Geometry& g, const AttentionIO& io, const QueryTile& t, float* q_f32,
                  bf16* q_bf16);

// Keys [begin, end) hold every visible key of the tile (kv_len, causal, the
// window, a paged entry's length), so blocks wholly outside may be skipped.
std::int64_t visible_key_end(const Problem& p, const AttentionIO& io, const QueryTile& t);
std::int64_t visible_key_begin(const Problem& p, const AttentionIO& io, const QueryTile& t);

// The query positions of a tile from the first to the last that sees a key
// of [j0, j0 + 64) (queries 0 when none does): a window's edge block reaches
// part of the tile only, and the rows outside need not compute it (a block a
// row sees nothing of changes nothing of its softmax; one between the two
// that sees none computes it to no effect).
QueryTile rows_seeing_block(const Problem& p, const AttentionIO& io, const QueryTile& t, std::int64_t j0);

// Rows [begin, end) of a tile that see keys of block j0 in the same 16-key
// column groups [c0, c1) (multiples of 16; c0 == c1 where they see none).
struct ColumnRun {
  std::int64_t begin = 0, end = 0, c0 = 0, c1 = 0;
};

// The tile's rows in runs by the column groups of [j0, j0 + 64) each sees
// under the position rules (causal, window, kv_len, the entry's keys): an
// edge block computed run by run, each over its own columns, costs about
// what its rows see, not 64 keys a row. Writes at most t.queries runs (one a
// query) to out; returns how many.
std::int64_t column_runs(const Problem& p, const AttentionIO& io, const Geometry& g, const QueryTile& t, std::int64_t j0,
                         ColumnRun* out);

// Whether every row of the tile sees all 64 keys [j0, j0 + 64) with plain
// scores: no mask, bias, softcap or ALiBi, and no position rule hides any.
bool block_fully_visible(const Problem& p, const AttentionIO& io, const QueryTile& t, std::int64_t j0);

// Turns the dot products of the tile's rows against keys [j0, j0 + 64) into
// log2-domain scores: s * scale * log2(e), capped (softcap), plus ALiBi and
// bias times log2(e) (the scale only where Q was not prescaled; score_unit
// and score_scale say the units), and -inf
// where a key is hidden (mask, bias -inf, kv_len, causal, window, or past the
// entry's keys), and leaves each row's maximum in row_max.
// kernel_max: row_max already holds the kernel's maxima (qk_f32); a row whose
// 64 keys are all visible, with no mask and no bias, is then left untouched.
void finish_scores(const Problem& p, const Geometry& g, const AttentionIO& io, const Kernels& kernels,
                   const QueryTile& t, std::int64_t j0, float* s, float* row_max, bool kernel_max);

// Dropout (AttentionIO::dropout): rows [r0, r0 + live) of tile t against
// keys [j0, j0 + keys), weights at row stride 64 in `weights` (float32) or,
// when not null, `weights_bf16`: the dropped ones set to 0, once the rows'
// sums have taken them (dropout leaves the denominator alone), and the mask
// written to io.dropout.kept when asked for. The kept weights' 1 / (1 - p)
// is the caller's to apply, once, to each row's sum.
void drop_weights(const Problem& p, const Geometry& g, const AttentionIO& io, const DropoutMask& mask, const QueryTile& t,
                  std::int64_t r0, std::int64_t live, std::int64_t j0, std::int64_t keys, float* weights,
                  bf16* weights_bf16);

// out = O / l in the dtype; lse = (m + log2 l + shift) ln 2 (shift: the one
// the weights were computed with), or 0 and -inf for rows with l = 0; a sink
// joins l (out scaled down, lse up; a row with l = 0 gets lse = the sink).
// A redone tile (shift > 0) passes its first pass's m and l (TileScratch::m0,
// l0) for lse: l summed with exp2's coefficients scaled by 2^-shift differs
// in its last bit, and whether a tile overflows depends on its neighbours
// (batch invariance: the same row in another batch or page layout would
// get another lse).
void write_rows(const Problem& p, const Geometry& g, const AttentionIO& io, const QueryTile& t, const float* o,
                const float* m, const float* l, int shift, const float* lse_m = nullptr, const float* lse_l = nullptr);

// Whether the tile's accumulated outputs (rows x dv_pad) are all finite: when
// not, sum_j p_j v_j overflowed float32 (|v| near its largest, many keys) and
// the tile is redone with weights scaled down by 2^weight_shift.
bool outputs_finite(const Geometry& g, const float* o, std::int64_t rows);

// Decode tiles (at most kInPlaceRows rows: a query's GQA group) may read K
// and V rows where they are, with the in-place kernels, when the kernels can
// read them: unit-stride rows of one dtype, or codes the kernels decode on
// load without a scale array (RowFormat). Paged or dense alike, so an
// entry's path does not depend on its batch.
inline constexpr std::int64_t kInPlaceRows = 8;
bool readable_in_place(const TensorView& view, const QuantView& codes);
RowFormat format_of(const TensorView& view, const QuantView& codes);  // what the rows in place hold
bool reads_in_place(const Problem& p, const AttentionIO& io, const Geometry& g);
// K's descale for tile t's codes read in place: folded into the score scale
// of the bfloat16 products (Q's rows are exact bfloat16; the geometry
// returned), or into Q's float32 rows (q_f32, the tile's rows of head_dim).
Geometry with_k_descale(const Geometry& g, const Problem& p, const AttentionIO& io, const QueryTile& t, float* q_f32);

}  // namespace attn::cpu
