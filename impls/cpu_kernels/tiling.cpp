#include "impls/cpu_kernels/tiling.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/cpu.hpp"

namespace attn::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

template <typename T> const T* typed(const TensorView& v) { return static_cast<const T*>(v.data); }

// Keys [lo, hi) the position rules leave to query i of entry b (causal,
// window, kv_len, a paged entry's length); the tiles are never packed
// sequences (those run one entry at a time, attnbench/per_entry.hpp).
Problem::KeyRange row_keys(const Problem& p, const AttentionIO& io, std::int64_t b, std::int64_t i) {
  return io.sequences(p).entry_row(b, i).keys;
}

// The scores of a tile are plain when nothing but the position rules touches
// them: no mask, bias, softcap or ALiBi.
bool plain_scores(const Problem& p, const AttentionIO& io) {
  return io.mask.empty() && io.bias.empty() && p.softcap == 0 && io.alibi_slopes == nullptr;
}

// Where key j of entry b is in a k or v view: through the page table when paged.
std::int64_t key_offset(const Problem& p, const AttentionIO& io, const TensorView& view, std::int64_t b,
                        std::int64_t kv_head, std::int64_t j) {
  const SequenceMap::Key key = io.sequences(p).key(b, j);
  return view.offset(key.b, kv_head, key.s, 0);
}

}  // namespace

void read_row(const TensorView& v, std::int64_t base, std::int64_t n, float* out) {
  const std::int64_t step = v.strides[3];
  switch (v.dtype) {
    case DType::f32: {
      const float* x = typed<float>(v) + base;
      if (step == 1) std::memcpy(out, x, static_cast<std::size_t>(n) * sizeof(float));
      else for (std::int64_t d = 0; d < n; ++d) out[d] = x[d * step];
      return;
    }
    case DType::f16: {
      const f16* x = typed<f16>(v) + base;
      if (step == 1) best_kernels().widen_f16(x, n, out);
      else for (std::int64_t d = 0; d < n; ++d) out[d] = f16_to_float(x[d * step]);
      return;
    }
    case DType::bf16: {
      const bf16* x = typed<bf16>(v) + base;
      for (std::int64_t d = 0; d < n; ++d) out[d] = bf16_to_float(x[d * step]);
      return;
    }
    default:
      for (std::int64_t d = 0; d < n; ++d) out[d] = load_float(v, base + d * step);
  }
}

void dequantised_row(const QuantView& codes, std::int64_t b, std::int64_t head, std::int64_t s, std::int64_t entry, float* out) {
  codes.dequantise_row(b, head, s, out);
  const float descale = codes.descale_of(entry, head);
  if (descale != 1.0f) {
    for (std::int64_t d = 0; d < codes.dim; ++d) out[d] *= descale;
  }
}

Geometry Geometry::of(const Problem& p, std::int64_t max_tile_rows, const Kernels& kernels) {
  Geometry g;
  g.group = p.group_size();
  g.tile_queries = std::clamp<std::int64_t>(max_tile_rows / g.group, 1, p.seq_q);
  g.tile_rows = g.tile_queries * g.group;
  g.query_tiles = (p.seq_q + g.tile_queries - 1) / g.tile_queries;
  g.key_blocks = (p.seq_k + kKeyBlock - 1) / kKeyBlock;
  // bfloat16 in pairs, or widened to float32 where pairs are the slower (core/cpu.hpp).
  g.bf16_kernels = p.dtype == DType::bf16 && bf16_products().dot;
  g.head_dim_pairs = (p.head_dim + 1) / 2;
  g.scratch_rows = g.tile_rows;
  if (g.bf16_kernels) {
    g.head_dim_pairs = round_up(g.head_dim_pairs, kernels.bf16_pairs_align);
    g.scratch_rows = round_up(g.tile_rows, kernels.bf16_rows_align);
  }
  g.dv_pad = round_up(p.head_dim_v, 16);
  g.score_scale = static_cast<float>(p.scale * 1.4426950408889634);
  g.weight_shift = cpu::weight_shift(p.seq_k);
  g.q_prescaled = !g.bf16_kernels;
  return g;
}

Geometry Geometry::with_float32_products() const {
  Geometry g = *this;
  g.bf16_kernels = false;
  g.q_prescaled = true;
  g.scratch_rows = g.tile_rows;
  return g;
}

void HeadPack::reserve(const Problem& p, const Geometry& g, const AttentionIO& io) {
  const std::int64_t keys = g.key_blocks * kKeyBlock;
  if (g.bf16_kernels) {
    k_stride_ = g.head_dim_pairs;
    k_bf16_.assign(static_cast<std::size_t>(keys * g.head_dim_pairs * 2), bf16{});
    v_bf16_.assign(static_cast<std::size_t>(keys * g.dv_pad), bf16{});
  } else {
    k_stride_ = p.head_dim;
    k_f32_.assign(static_cast<std::size_t>(keys * p.head_dim), 0.0f);
    row_.assign(static_cast<std::size_t>(kKeyBlock * p.head_dim), 0.0f);  // K rows widened before the transpose
    // float32 V rows read in place when they are contiguous, unpaged and as
    // wide as the kernels' rows; else packed.
    v_in_place_ = io.v.dtype == DType::f32 && p.head_dim_v == g.dv_pad && io.v.strides[3] == 1 && !p.paged() && io.v_codes.empty();
    if (!v_in_place_) v_f32_.assign(static_cast<std::size_t>(keys * g.dv_pad), 0.0f);
  }
  if (g.bf16_kernels && (!io.k_codes.empty() || !io.v_codes.empty())) {
    row_.assign(static_cast<std::size_t>(std::max(p.head_dim, p.head_dim_v)), 0.0f);
    row_bf16_.assign(static_cast<std::size_t>((kKeyBlock + 2) * std::max(p.head_dim, p.head_dim_v)), bf16{});
  }
  packed_.assign(static_cast<std::size_t>(g.key_blocks), 0);
  forget();
}

std::size_t HeadPack::bytes() const {
  return (k_f32_.size() + v_f32_.size() + row_.size()) * sizeof(float) + (k_bf16_.size() + v_bf16_.size()) * sizeof(bf16) +
         packed_.size();
}

void HeadPack::pack(const Problem& p, const Geometry& g, const AttentionIO& io, std::int64_t b, std::int64_t kv_head,
                    std::int64_t first_block, std::int64_t end_block) {
  if (b != packed_b_ || kv_head != packed_g_) {
    std::fill(packed_.begin(), packed_.end(), std::uint8_t{0});
    packed_b_ = b, packed_g_ = kv_head;
    v_direct_ = v_in_place_ ? typed<float>(io.v) + io.v.offset(b, kv_head, 0, 0) : nullptr;
    ldv_ = v_in_place_ ? io.v.strides[2] : g.dv_pad;
  }
  for (std::int64_t block = first_block; block < end_block; ++block) {
    std::uint8_t& done = packed_[static_cast<std::size_t>(block)];
    if (!done) pack_block(p, g, io, block);
    done = 1;
  }
}

namespace {

// to[2c] = a[c], to[2c + 1] = b[c] for c < n, written so that the compiler
// vectorises it: a loop storing each element alone stayed scalar, 16 bits a
// store, and was 5% of a windowed bfloat16 prefill.
void interleave_pairs(const bf16* a, const bf16* b, std::int64_t n, bf16* to) {
  static_assert(std::endian::native == std::endian::little, "a pair's first element is its low half");
  for (std::int64_t c = 0; c < n; ++c) {
    const std::uint32_t pair = a[c].bits | static_cast<std::uint32_t>(b[c].bits) << 16;
    std::memcpy(static_cast<void*>(to + 2 * c), &pair, sizeof pair);
  }
}

}  // namespace

// Keys [block * 64, block * 64 + 64) of (packed_b_, packed_g_), K transposed
// 16 x 16 words at a time (Kernels::transpose32). Padding columns (dims past
// head_dim, V columns past head_dim_v) are zero from reserve() and never
// written; keys past seq_k (a paged entry's length) are written as zeros,
// since another (batch, kv head) may have put a real key in the same slot.
void HeadPack::pack_block(const Problem& p, const Geometry& g, const AttentionIO& io, std::int64_t block) {
  const std::int64_t b = packed_b_, kv_head = packed_g_;
  const std::int64_t j0 = block * kKeyBlock;
  const std::int64_t real = std::clamp<std::int64_t>((p.paged() ? io.seq_lens[b] : p.seq_k) - j0, 0, kKeyBlock);
  const Kernels& kernels = best_kernels();
  std::array<const void*, kKeyBlock> rows{};
  const SequenceMap sequences = io.sequences(p);
  // Format version 4: key j's row of a quantised K or V, from where the key
  // is stored, dequantised into `to` (float) without the descale: int8 and
  // uint8 rows whose groups hold whole vectors by the kernels (the same
  // bits), others as QuantView decodes them.
  auto decoded = [&](const QuantView& codes, std::int64_t j, float* to) {
    const SequenceMap::Key key = sequences.key(b, j);
    const bool bytes = codes.encoding == Encoding::s8 || codes.encoding == Encoding::u8;
    // (no scale array and no zero point: one group, whatever group says)
    const std::int64_t group = codes.scale || codes.zero_point ? codes.group : codes.dim;
    if (!bytes || group <= 0 || (group % 16 != 0 && group < codes.dim)) {
      codes.dequantise_row(key.b, kv_head, key.s, to);
      return;
    }
    const std::int64_t at = key.b * codes.scale_strides[0] + kv_head * codes.scale_strides[1] + key.s * codes.scale_strides[2];
    kernels.dequantise_bytes(codes.row(key.b, kv_head, key.s), codes.encoding == Encoding::s8, codes.dim,
                             codes.scale ? codes.scale + at : nullptr, codes.zero_point ? codes.zero_point + at : nullptr,
                             group, to);
  };
  // The same with the entry's descale.
  auto dequantised = [&](const QuantView& codes, std::int64_t j, float* to) {
    decoded(codes, j, to);
    const float descale = codes.descale_of(b, kv_head);
    if (descale != 1.0f) std::for_each(to, to + codes.dim, [&](float& x) { x *= descale; });
  };
  // The same into bfloat16 (row_bf16_ at `slot`): the descale's product
  // rounded to float, then to bfloat16, in one pass of the kernels.
  auto dequantised_bf16 = [&](const QuantView& codes, std::int64_t j, std::int64_t slot) {
    decoded(codes, j, row_.data());
    bf16* to = row_bf16_.data() + slot * std::max(p.head_dim, p.head_dim_v);
    kernels.scaled_to_bf16(row_.data(), codes.descale_of(b, kv_head), codes.dim, to);
    return static_cast<const bf16*>(to);
  };
  if (g.bf16_kernels) {
    bf16* kblock = k_bf16_.data() + block * kKeyBlock * k_stride_ * 2;
    auto at = [&](std::int64_t d, std::int64_t j) -> bf16& { return kblock[(d / 2) * kKeyBlock * 2 + j * 2 + d % 2]; };
    const std::int64_t ks = io.k_codes.empty() ? io.k.strides[3] : 1, vs = io.v_codes.empty() ? io.v.strides[3] : 1;
    for (std::int64_t j = 0; j < real; ++j) {
      rows[static_cast<std::size_t>(j)] = io.k_codes.empty() ? typed<bf16>(io.k) + key_offset(p, io, io.k, b, kv_head, j0 + j)
                                                             : dequantised_bf16(io.k_codes, j0 + j, j);
    }
    if (ks == 1) {  // whole pairs transposed; an odd head_dim's last dim alone
      kernels.transpose32(rows.data(), real, p.head_dim / 2, kblock, kKeyBlock);
      for (std::int64_t j = 0; j < real && p.head_dim % 2; ++j) at(p.head_dim - 1, j) = static_cast<const bf16*>(rows[static_cast<std::size_t>(j)])[p.head_dim - 1];
    } else {
      for (std::int64_t j = 0; j < real; ++j)
        for (std::int64_t d = 0; d < p.head_dim; ++d) at(d, j) = static_cast<const bf16*>(rows[static_cast<std::size_t>(j)])[d * ks];
    }
    for (std::int64_t j = real; j < kKeyBlock; ++j)
      for (std::int64_t d = 0; d < p.head_dim; ++d) at(d, j) = bf16{};
    // V in pairs of keys: row j0 / 2 + i holds keys 2i and 2i + 1 interleaved.
    auto v_row = [&](std::int64_t j, std::int64_t slot) -> const bf16* {
      if (j >= real) return nullptr;
      if (!io.v_codes.empty()) return dequantised_bf16(io.v_codes, j0 + j, kKeyBlock + slot);
      return typed<bf16>(io.v) + key_offset(p, io, io.v, b, kv_head, j0 + j);
    };
    for (std::int64_t j = 0; j < kKeyBlock; j += 2) {
      const bf16* v0 = v_row(j, 0);
      const bf16* v1 = v_row(j + 1, 1);
      bf16* vp = v_bf16_.data() + (j0 + j) * g.dv_pad;
      if (v0 && v1 && vs == 1) {
        interleave_pairs(v0, v1, p.head_dim_v, vp);
      } else {
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) vp[2 * c] = v0 ? v0[c * vs] : bf16{}, vp[2 * c + 1] = v1 ? v1[c * vs] : bf16{};
      }
    }
    return;
  }
  float* kblock = k_f32_.data() + block * kKeyBlock * k_stride_;
  for (std::int64_t j = 0; j < real; ++j) {
    if (!io.k_codes.empty()) {
      float* row = row_.data() + j * p.head_dim;
      dequantised(io.k_codes, j0 + j, row);
      rows[static_cast<std::size_t>(j)] = row;
      continue;
    }
    const std::int64_t at = key_offset(p, io, io.k, b, kv_head, j0 + j);
    if (io.k.dtype == DType::f32 && io.k.strides[3] == 1) {
      rows[static_cast<std::size_t>(j)] = typed<float>(io.k) + at;
    } else {  // widened (or gathered) first
      float* row = row_.data() + j * p.head_dim;
      read_row(io.k, at, p.head_dim, row);
      rows[static_cast<std::size_t>(j)] = row;
    }
  }
  kernels.transpose32(rows.data(), real, p.head_dim, kblock, kKeyBlock);
  for (std::int64_t j = real; j < kKeyBlock; ++j)
    for (std::int64_t d = 0; d < p.head_dim; ++d) kblock[d * kKeyBlock + j] = 0.0f;
  if (v_direct_) return;
  for (std::int64_t j = 0; j < kKeyBlock; ++j) {
    float* vrow = v_f32_.data() + (j0 + j) * g.dv_pad;
    if (j >= real) std::fill_n(vrow, p.head_dim_v, 0.0f);
    else if (!io.v_codes.empty()) dequantised(io.v_codes, j0 + j, vrow);
    else read_row(io.v, key_offset(p, io, io.v, b, kv_head, j0 + j), p.head_dim_v, vrow);
  }
}

void TileScratch::reserve(const Problem& p, const AttentionIO& io, const Geometry& g, bool pack_kv, std::int64_t score_blocks) {
  if (pack_kv) pack.reserve(p, g, io);
  const auto rows = static_cast<std::size_t>(g.scratch_rows);
  if (g.bf16_kernels) {
    q_bf16.assign(rows * static_cast<std::size_t>(g.head_dim_pairs * 2), bf16{});
    p_bf16.assign(rows * kKeyBlock, bf16{});
  } else {
    q.assign(rows * static_cast<std::size_t>(p.head_dim), 0.0f);
  }
  scores.assign(rows * kKeyBlock * static_cast<std::size_t>(std::max<std::int64_t>(score_blocks, 1)), 0.0f);
  o.assign(rows * static_cast<std::size_t>(g.dv_pad), 0.0f);
  m.assign(rows, 0.0f);
  l.assign(rows, 0.0f);
  block_max.assign(rows, 0.0f);
}

void TileScratch::keep_first_pass(std::int64_t rows) {
  m0.assign(m.begin(), m.begin() + rows);
  l0.assign(l.begin(), l.begin() + rows);
}

double TileScratch::bytes_for(const Problem& p, const Geometry& g, bool pack_kv, std::int64_t score_blocks) {
  auto d = [](std::int64_t x) { return static_cast<double>(x); };
  const double keys = d(g.key_blocks) * d(kKeyBlock), rows = d(g.scratch_rows);
  // The packed K and V (float32 is the larger), Q, the scores and the rest of a tile.
  const double pack =
      pack_kv ? 4.0 * (keys * d(std::max(p.head_dim, g.head_dim_pairs * 2) + g.dv_pad) + d(kKeyBlock * p.head_dim)) + d(g.key_blocks) : 0.0;
  return pack + 4.0 * rows * (d(p.head_dim) + d(kKeyBlock) * d(std::max<std::int64_t>(score_blocks, 1)) + d(g.dv_pad) + 3.0 +
                              d(kKeyBlock));
}

std::size_t TileScratch::bytes() const {
  return pack.bytes() + (q.size() + scores.size() + o.size() + m.size() + l.size() + block_max.size()) * sizeof(float) +
         (q_bf16.size() + p_bf16.size()) * sizeof(bf16);
}

std::int64_t QueryTile::rows() const { return queries * group; }

QueryTile query_tile(const Problem& p, const Geometry& g, std::int64_t index) {
  QueryTile t;
  const std::int64_t tile = index % g.query_tiles;
  const std::int64_t head_index = index / g.query_tiles;
  t.kv_head = head_index % p.heads_kv;
  t.b = head_index / p.heads_kv;
  t.first_query = tile * g.tile_queries;
  t.queries = std::min(g.tile_queries, p.seq_q - t.first_query);
  t.group = g.group;
  return t;
}

void pack_queries(const Problem& p, const Geometry& g, const AttentionIO& io, const QueryTile& t, float* q_f32,
                  bf16* q_bf16) {
  for (std::int64_t r = 0; r < t.rows(); ++r) {
    const std::int64_t h = t.head(g, r), i = t.query(g, r);
    if (!io.q_codes.empty()) {  // version 4: dequantised with the entry's descale (by kv head)
      thread_local std::vector<float> widened;  // bfloat16 kernels: the float row before rounding (no q_f32 then)
      if (g.bf16_kernels) widened.resize(static_cast<std::size_t>(p.head_dim));
      float* row = g.bf16_kernels ? widened.data() : q_f32 + r * p.head_dim;
      dequantised_row(io.q_codes, t.b, h, i, t.b, row);
      for (std::int64_t d = 0; d < p.head_dim; ++d) {
        if (g.bf16_kernels) q_bf16[r * g.head_dim_pairs * 2 + d] = float_to_bf16(row[d]);
        else row[d] *= g.score_scale;
      }
      continue;
    }
    if (g.bf16_kernels) {  // the padding past head_dim stays zero from TileScratch::reserve
      const bf16* x = typed<bf16>(io.q) + io.q.offset(t.b, h, i, 0);
      bf16* row = q_bf16 + r * g.head_dim_pairs * 2;
      if (io.q.strides[3] == 1) std::memcpy(static_cast<void*>(row), x, static_cast<std::size_t>(p.head_dim) * sizeof(bf16));
      else for (std::int64_t d = 0; d < p.head_dim; ++d) row[d] = x[d * io.q.strides[3]];
    } else {
      float* row = q_f32 + r * p.head_dim;
      read_row(io.q, io.q.offset(t.b, h, i, 0), p.head_dim, row);
      for (std::int64_t d = 0; d < p.head_dim; ++d) row[d] *= g.score_scale;
    }
  }
}

// Both ends of a row's key range grow with the query: the tile's last query
// has the largest end. The smallest begin is that of the first row that sees
// a key: rows before it may see none (bottom_right with seq_q > seq_k, a
// window past kv_len), and an empty range says nothing about where the next
// row's keys begin.
std::int64_t visible_key_end(const Problem& p, const AttentionIO& io, const QueryTile& t) {
  return row_keys(p, io, t.b, t.first_query + t.queries - 1).hi;
}

std::int64_t visible_key_begin(const Problem& p, const AttentionIO& io, const QueryTile& t) {
  for (std::int64_t i = t.first_query; i < t.first_query + t.queries; ++i) {
    const Problem::KeyRange keys = row_keys(p, io, t.b, i);
    if (!keys.empty()) return keys.lo;
  }
  return visible_key_end(p, io, t);  // no row sees a key: nothing to visit
}

QueryTile rows_seeing_block(const Problem& p, const AttentionIO& io, const QueryTile& t, std::int64_t j0) {
  auto sees = [&](std::int64_t i) {
    const Problem::KeyRange keys = row_keys(p, io, t.b, i);
    return !keys.empty() && keys.lo < j0 + kKeyBlock && keys.hi > j0;
  };
  QueryTile seen = t;
  std::int64_t first = t.first_query, end = t.first_query + t.queries;
  while (first < end && !sees(first)) ++first;
  while (end > first && !sees(end - 1)) --end;
  seen.first_query = first;
  seen.queries = end - first;
  return seen;
}

std::int64_t column_runs(const Problem& p, const AttentionIO& io, const Geometry& g, const QueryTile& t, std::int64_t j0,
                         ColumnRun* out) {
  const SequenceMap map = io.sequences(p);
  std::int64_t runs = 0;
  for (std::int64_t q = 0; q < t.queries; ++q) {
    const Problem::KeyRange keys = map.entry_row(t.b, t.first_query + q).keys;
    const std::int64_t lo = std::clamp<std::int64_t>(keys.lo - j0, 0, kKeyBlock);
    const std::int64_t hi = std::clamp<std::int64_t>(keys.hi - j0, 0, kKeyBlock);
    ColumnRun run{q * g.group, (q + 1) * g.group, 0, 0};
    if (!keys.empty() && hi > lo) run.c0 = lo / 16 * 16, run.c1 = (hi + 15) / 16 * 16;
    if (runs > 0 && out[runs - 1].c0 == run.c0 && out[runs - 1].c1 == run.c1) out[runs - 1].end = run.end;
    else out[runs++] = run;
  }
  return runs;
}

bool block_fully_visible(const Problem& p, const AttentionIO& io, const QueryTile& t, std::int64_t j0) {
  if (!plain_scores(p, io)) return false;
  const Problem::KeyRange first = row_keys(p, io, t.b, t.first_query);
  const Problem::KeyRange last = row_keys(p, io, t.b, t.first_query + t.queries - 1);
  return first.hi >= j0 + kKeyBlock && last.lo <= j0;
}

void finish_scores(const Problem& p, const Geometry& g, const AttentionIO& io, const Kernels& kernels,
                   const QueryTile& t, std::int64_t j0, float* s, float* row_max, bool kernel_max) {
  if (kernel_max && block_fully_visible(p, io, t, j0)) return;
  const bool plain = plain_scores(p, io);
  const float scale = g.q_prescaled ? 1.0f : g.score_scale;
  const SequenceMap map = io.sequences(p);
  // Softcap in the log2 domain: cap log2e tanh(x / (cap log2e)) = log2e cap tanh(s / cap).
  const float cap2 = static_cast<float>(p.softcap) * g.score_unit;
  for (std::int64_t r = 0; r < t.rows(); ++r) {
    const std::int64_t h = t.head(g, r), i = t.query(g, r);
    const SequenceMap::Row place = map.entry_row(t.b, i);
    const std::int64_t begin = std::clamp<std::int64_t>(place.keys.lo - j0, 0, kKeyBlock);
    const std::int64_t end = std::max(begin, std::clamp<std::int64_t>(place.keys.hi - j0, 0, kKeyBlock));
    if (kernel_max && plain && end == kKeyBlock && begin == 0) continue;
    float* row = s + r * kKeyBlock;
    row_max[r] = kernels.scale_row(row, scale, begin, end);
    if (plain) continue;
    if (p.softcap != 0) {
      for (std::int64_t j = begin; j < end; ++j) row[j] = cap2 * std::tanh(row[j] / cap2);
    }
    // ALiBi and the bias join the score in one rounding (fma): at |s| in the
    // thousands a product rounded first would add an error as large again.
    if (io.alibi_slopes) {
      const float slope2 = io.alibi_slopes[h] * g.score_unit;
      for (std::int64_t j = begin; j < end; ++j) {
        row[j] = std::fma(-slope2, static_cast<float>(std::abs(place.diag - (j0 + j))), row[j]);
      }
    }
    if (!io.mask.empty()) {
      for (std::int64_t j = begin; j < end; ++j) {
        if (io.mask.at(t.b, h, i, j0 + j) == 0) row[j] = kNegInf;
      }
    }
    if (!io.bias.empty()) {
      for (std::int64_t j = begin; j < end; ++j) {
        const float bias = load_float(io.bias, io.bias.offset(t.b, h, i, j0 + j));
        row[j] = std::isinf(bias) && bias < 0 ? kNegInf : std::fma(bias, g.score_unit, row[j]);
      }
    }
    row_max[r] = kernels.max_of(row, kKeyBlock);
  }
}

void drop_weights(const Problem& p, const Geometry& g, const AttentionIO& io, const DropoutMask& mask, const QueryTile& t,
                  std::int64_t r0, std::int64_t live, std::int64_t j0, std::int64_t keys, float* weights,
                  bf16* weights_bf16) {
  std::uint8_t keep[kKeyBlock];
  for (std::int64_t r = r0; r < r0 + live; ++r) {
    const std::int64_t h = t.head(g, r), i = t.query(g, r);
    mask.row(t.b, h, i, j0, keys, keep);
    if (io.dropout.kept) std::copy_n(keep, keys, io.dropout.kept + ((t.b * p.heads_q + h) * p.seq_q + i) * p.seq_k + j0);
    for (std::int64_t c = 0; c < keys; ++c) {
      if (keep[c]) continue;
      if (weights_bf16) weights_bf16[r * kKeyBlock + c] = bf16{};
      else weights[r * kKeyBlock + c] = 0.0f;
    }
  }
}

void write_rows(const Problem& p, const Geometry& g, const AttentionIO& io, const QueryTile& t, const float* o,
                const float* m, const float* l, int shift, const float* lse_m, const float* lse_l) {
  const MutableTensorView& out = io.out;
  const std::int64_t step = out.strides[3];
  const Kernels& kernels = best_kernels();
  // log2 of a row's sum of exp2 of its scores: the weights were 2^(x - m - shift).
  auto log2_total = [](float top, float sum, int by) {
    return sum > 0 ? static_cast<double>(top) + by + std::log2(static_cast<double>(sum)) : -std::numeric_limits<double>::infinity();
  };
  for (std::int64_t r = 0; r < t.rows(); ++r) {
    const std::int64_t h = t.head(g, r), i = t.query(g, r);
    float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
    double total2 = log2_total(m[r], l[r], shift);
    double lse2 = lse_m != nullptr ? log2_total(lse_m[r], lse_l[r], 0) : total2;
    if (io.sinks) {  // the sink joins the denominator
      const double sink2 = static_cast<double>(io.sinks[h]) * 1.4426950408889634;
      const SinkShare share = with_sink(total2, sink2);
      inv = static_cast<float>(static_cast<double>(inv) * share.keep);
      lse2 = lse_m != nullptr ? with_sink(lse2, sink2).lse2 : share.lse2;
    }
    const float* acc = o + r * g.dv_pad;
    const std::int64_t base = out.offset(t.b, h, i, 0);
    switch (out.dtype) {
      case DType::f32:
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) static_cast<float*>(out.data)[base + c * step] = acc[c] * inv;
        break;
      case DType::bf16:
        if (step == 1) kernels.scaled_to_bf16(acc, inv, p.head_dim_v, static_cast<bf16*>(out.data) + base);
        else for (std::int64_t c = 0; c < p.head_dim_v; ++c) static_cast<bf16*>(out.data)[base + c * step] = float_to_bf16(acc[c] * inv);
        break;
      default:
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) store_float(out, base + c * step, acc[c] * inv);
    }
    if (io.lse) {
      const std::int64_t row = (t.b * p.heads_q + h) * p.seq_q + i;
      io.lse[row] = std::isinf(lse2) ? lse2 : lse2 * 0.6931471805599453;
    }
  }
}

bool outputs_finite(const Geometry& g, const float* o, std::int64_t rows) {
  // On the bits, with no early exit, so that the compiler vectorises it: a
  // float is inf or NaN when its exponent field is all ones. (A test per
  // element with a return was 4% of a windowed float32 prefill.)
  constexpr std::uint32_t kExponent = 0x7f800000u;
  std::uint32_t non_finite = 0;
  for (std::int64_t e = 0; e < rows * g.dv_pad; ++e) {
    non_finite |= static_cast<std::uint32_t>((std::bit_cast<std::uint32_t>(o[e]) & kExponent) == kExponent);
  }
  return non_finite == 0;
}

bool readable_in_place(const TensorView& view, const QuantView& codes) {
  if (codes.empty()) return view.strides[3] == 1;
  return decodes_in_place(codes.encoding) && codes.scale == nullptr && codes.zero_point == nullptr;
}

RowFormat format_of(const TensorView& view, const QuantView& codes) {
  return codes.empty() ? RowFormat(view.dtype) : RowFormat(codes.encoding);
}

Geometry with_k_descale(const Geometry& g, const Problem& p, const AttentionIO& io, const QueryTile& t, float* q_f32) {
  Geometry descaled = g;
  if (io.k_codes.empty()) return descaled;
  const float descale = io.k_codes.descale_of(t.b, t.kv_head);
  if (g.bf16_kernels) descaled.score_scale *= descale;
  else if (descale != 1.0f) std::for_each(q_f32, q_f32 + t.rows() * p.head_dim, [&](float& x) { x *= descale; });
  return descaled;
}

bool reads_in_place(const Problem& p, const AttentionIO& io, const Geometry& g) {
  const bool codes = !io.k_codes.empty() || !io.v_codes.empty();
  return g.tile_rows <= kInPlaceRows && p.dtype != DType::f64 && readable_in_place(io.k, io.k_codes) &&
         readable_in_place(io.v, io.v_codes) && (codes || io.k.dtype == io.v.dtype);
}

}  // namespace attn::cpu
