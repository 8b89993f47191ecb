#include "impls/streaming/streaming.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cmath>
#include <limits>
#include <vector>

#include "attnbench/dropout.hpp"
#include "attnbench/error.hpp"
#include "attnbench/per_entry.hpp"
#include "attnbench/value_range.hpp"
#include "core/thread_pool.hpp"
#include "impls/cpu_kernels/flash_backward.hpp"
#include "impls/cpu_kernels/tiling.hpp"

namespace attn {

namespace {

using cpu::Geometry;
using cpu::kKeyBlock;
using cpu::QueryTile;

constexpr std::int64_t kMaxTileRows = 96;
constexpr std::int64_t kSplitChunks = 8;  // an entry with fewer tiles than this splits its long rows, in up to 8
constexpr std::int64_t kChunkBlocks = 16;  // a split row takes one chunk per this many key blocks (split_parts)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using Scratch = cpu::TileScratch;

// The rows of K and V of one key block's keys, read in place.
struct BlockRows {
  std::array<const void*, kKeyBlock> k{}, v{};
  std::int64_t n = 0;
};

using cpu::format_of;
using cpu::reads_in_place;

class StreamingPlan final : public Plan {
 public:
  StreamingPlan(const Problem& p, const AttentionIO& io, const RunOptions& options)
      : p_(p), io_(io), kernels_(cpu::best_kernels()), g_(Geometry::of(p, kMaxTileRows, kernels_)), mask_(p, io.dropout) {
    threads_ = resolve_threads(options.threads);
    // Few rows a tile (decode): packing K and V would cost as much as the
    // whole computation, so the kernels read them in place, through the page
    // table when paged: bfloat16 in bfloat16 pairs where the packed path
    // multiplies so (Geometry's bf16_kernels), else (float16, bfloat16 on a
    // host whose pairs are the slower) widened on load to float32 products.
    // Quantised K and V (version 4) are read in place too when the kernels
    // decode their codes on load (fp8, ggml blocks: RowFormat), to bfloat16
    // for bfloat16 pairs, else to float32; K's descale is folded into the
    // score scale (or Q's float32 rows), V's into the output. With a scale
    // array (integer encodings) they are dequantised block by block into the
    // pack.
    direct_ = reads_in_place(p, io, g_);
    if (direct_ && !g_.bf16_kernels) g_ = g_.with_float32_products();
    k_format_ = format_of(io.k, io.k_codes);
    v_format_ = format_of(io.v, io.v_codes);
    narrow_rows_ = !g_.bf16_kernels || kernels_.bf16_rows_align == 1;
    tiles_ = p.batch * p.heads_kv * g_.query_tiles;
    // Few tiles an entry and long rows (decode): split a tile's keys so every
    // thread works. Whether and how a tile splits is fixed by its entry alone
    // (its heads and query tiles, its own visible keys), never by the batch
    // around it nor the thread count: an entry's out and lse are the same bits
    // alone, in any batch and at any number of threads (batch invariance; the
    // backward starts from them). chunks_ is the most a tile splits into.
    // A tile splits when its entry has fewer tiles than kSplitChunks and the
    // tile itself sees at least 2 * kSplitChunks key blocks (parts_of).
    if (p.heads_kv * g_.query_tiles < kSplitChunks && g_.key_blocks >= 2 * kSplitChunks) chunks_ = split_parts(g_.key_blocks);
    require_workspace(threads_ * Scratch::bytes_for(p, g_, !direct_, 1) +
                          (chunks_ > 1 ? 4.0 * static_cast<double>(tiles_ * chunks_ * g_.tile_rows) * static_cast<double>(g_.dv_pad + 2) : 0.0),
                      "streaming's tile scratch and split-K partials");
    scratch_.resize(static_cast<std::size_t>(threads_));
    packed_tile_.assign(static_cast<std::size_t>(threads_), -1);
    for (Scratch& s : scratch_) s.reserve(p, io, g_, !direct_, 1);
    if (chunks_ > 1) {
      // NaN until a chunk writes them: a chunk that left its partials unwritten
      // (one with no visible key, say) would poison its rows, not pass by the
      // luck of zeros. prepare() is not timed.
      const auto n = static_cast<std::size_t>(tiles_ * chunks_ * g_.tile_rows);
      const float unwritten = std::numeric_limits<float>::quiet_NaN();
      partial_o_.assign(n * static_cast<std::size_t>(g_.dv_pad), unwritten);
      partial_m_.assign(n, unwritten);
      partial_l_.assign(n, unwritten);
    }
  }

  void run() override {
    for (Scratch& s : scratch_) s.pack.forget();  // K and V as they are now
    std::fill(packed_tile_.begin(), packed_tile_.end(), -1);  // and Q
    ThreadPool& pool = ThreadPool::get(threads_);
    if (chunks_ > 1 && tiles_ >= threads_) {
      // Tiles enough to keep the threads busy: each task computes a tile's
      // chunks one after the other and merges them, the same bits as chunks
      // spread over threads, without a second pass.
      pool.parallel_for(tiles_, [&](std::int64_t tile, int worker) {
        Scratch& s = scratch_[static_cast<std::size_t>(worker)];
        for (std::int64_t c = 0; c < chunks_; ++c) compute(tile, c, s);
        merge(tile, s);
      });
      return;
    }
    pool.parallel_for(tiles_ * chunks_, [&](std::int64_t task, int worker) {
      compute(task / chunks_, task % chunks_, scratch_[static_cast<std::size_t>(worker)]);
    });
    if (chunks_ > 1) {
      pool.parallel_for(tiles_, [&](std::int64_t tile, int worker) { merge(tile, scratch_[static_cast<std::size_t>(worker)]); });
    }
  }

  bool has_lse() const override { return true; }

  std::size_t workspace_bytes() const override {
    std::size_t bytes = (partial_o_.size() + partial_m_.size() + partial_l_.size()) * sizeof(float);
    for (const Scratch& s : scratch_) bytes += s.bytes();
    return bytes;
  }

 private:
  // Where a chunk keeps its running max, sum and output rows.
  struct Sums {
    float *m, *l, *o;
  };

  // shift 0 first; a tile whose sums of weights times V overflowed is redone
  // with the weights scaled down (Kernels::exp2_sum): here when the tile is
  // one chunk, in merge when it is split.
  void compute(std::int64_t tile_index, std::int64_t chunk, Scratch& s, int shift = 0) {
    const QueryTile t = cpu::query_tile(p_, g_, tile_index);
    const std::int64_t rows = t.rows();
    const std::int64_t end_key = cpu::visible_key_end(p_, io_, t);
    const std::int64_t end_block = (end_key + kKeyBlock - 1) / kKeyBlock;
    // Blocks left of every row's window hold no visible key: skipped, as the
    // blocks past the causal diagonal are.
    const std::int64_t begin_block = cpu::visible_key_begin(p_, io_, t) / kKeyBlock;
    // A split tile's chunks share out its own visible blocks (a paged entry's,
    // not the table's capacity): fixed by the tile, whatever the threads and
    // the batch. A tile that does not split is chunk 0's alone.
    const std::int64_t parts = parts_of(begin_block, end_block);
    if (chunk >= parts) return;  // a tile of fewer chunks than the plan's most
    const bool split = parts > 1;
    const std::int64_t per_chunk = (end_block - begin_block + parts - 1) / parts;
    const std::int64_t first = std::min(begin_block + chunk * per_chunk, end_block);
    const std::int64_t last = std::min(first + per_chunk, end_block);
    const bool direct = direct_;
    if (!direct) s.pack.pack(p_, g_, io_, t.b, t.kv_head, first, last);
    // A split tile's chunks one after the other in one scratch read the rows
    // of Q packed for the first (unless K's descale is folded into them).
    std::int64_t& packed = packed_tile_[static_cast<std::size_t>(&s - scratch_.data())];
    if (packed != tile_index || !io_.k_codes.empty()) cpu::pack_queries(p_, g_, io_, t, s.q.data(), s.q_bf16.data());
    packed = tile_index;
    // K's descale, in place (the pack dequantises with it).
    const Geometry g = direct ? cpu::with_k_descale(g_, p_, io_, t, s.q.data()) : g_;
    // A split tile's chunk sums into its own partials (merge combines them),
    // a whole tile's into the scratch.
    const std::int64_t base = (tile_index * chunks_ + chunk) * g_.tile_rows;
    const Sums sums = split ? Sums{partial_m_.data() + base, partial_l_.data() + base, partial_o_.data() + base * g_.dv_pad}
                            : Sums{s.m.data(), s.l.data(), s.o.data()};
    std::fill_n(sums.m, rows, kNegInf);
    std::fill_n(sums.l, rows, 0.0f);
    std::fill_n(sums.o, rows * g_.dv_pad, 0.0f);
    // The AMX kernels read P's padding rows; the softmax writes only real
    // ones. (The AVX-512 and portable kernels read the rows they are given.)
    if (g_.bf16_kernels && kernels_.bf16_rows_align > 1) {
      std::fill(s.p_bf16.begin() + rows * kKeyBlock, s.p_bf16.end(), bf16{});
    }

    const std::int64_t read_end = std::min(end_key, std::min(last, end_block) * kKeyBlock);  // this task's last key
    // In place: the rows of each block's keys (through the page table), and
    // those of the next block, which the kernels ask the memory for while
    // they compute this one.
    // A block's runs of rows (at most one a query: tiles hold at most
    // kMaxTileRows / group queries, or one).
    std::array<cpu::ColumnRun, kMaxTileRows> runs;  // the first n_runs set for each block
    BlockRows rows_a, rows_b;
    BlockRows* here = &rows_a;
    BlockRows* ahead = &rows_b;
    for (std::int64_t block = std::max(first, begin_block); block < std::min(last, end_block); ++block) {
      const std::int64_t j0 = block * kKeyBlock;
      // In place, no key past the tile's last visible one is read (a paged
      // entry's unused slots, keys hidden by kv_len); packed, they are zeros.
      if (direct) {
        if (block == std::max(first, begin_block)) key_rows(t, j0, read_end, *here);
        else std::swap(here, ahead);
        // A chunk's last block asks for the first keys of the tile's next
        // chunk, which this thread most often computes next.
        key_rows(t, j0 + kKeyBlock, j0 + kKeyBlock < read_end ? read_end : end_key, *ahead);
      }
      const std::int64_t keys = direct ? here->n : std::min(kKeyBlock, p_.seq_k - j0);
      // Only the rows that see a key of the block compute it (a window's edge
      // blocks reach part of the tile); AMX works on whole 16-row tiles, so
      // there every row does (a row that sees none computes nothing).
      const QueryTile seen = narrow_rows_ ? cpu::rows_seeing_block(p_, io_, t, j0) : t;
      if (seen.queries == 0) continue;
      const std::int64_t r0 = (seen.first_query - t.first_query) * g_.group, live = seen.rows();
      float* const scores = s.scores.data() + r0 * kKeyBlock;
      float* const block_max = s.block_max.data() + r0;
      const float* const q = s.q.data() + r0 * p_.head_dim;
      const bf16* const q_bf16 = s.q_bf16.data() + r0 * g_.head_dim_pairs * 2;
      const bool full = cpu::block_fully_visible(p_, io_, seen, j0);
      // Packed, an edge block (the diagonal, a window's left edge) is computed
      // in runs of rows that see the same 16-key column groups, each over
      // those only: a partly visible block costs about what its rows see.
      // (AMX computes whole 16-row tiles: one run.)
      std::int64_t n_runs = 1;
      runs[0] = {0, live, 0, kKeyBlock};
      if (!direct && !full && narrow_rows_) n_runs = cpu::column_runs(p_, io_, g_, seen, j0, runs.data());
      if (direct) {
        const cpu::Ahead next{ahead->k.data(), ahead->n, k_format_.row_bytes(p_.head_dim)};
        if (g_.bf16_kernels) {
          kernels_.qk_bf16_direct(q_bf16, live, p_.head_dim, g_.head_dim_pairs * 2, here->k.data(), k_format_, keys, scores,
                                  next);
        } else {
          kernels_.qk_direct(q, live, p_.head_dim, here->k.data(), k_format_, keys, scores, next);
        }
      } else {
        for (std::int64_t u = 0; u < n_runs; ++u) {
          const cpu::ColumnRun& run = runs[static_cast<std::size_t>(u)];
          const std::int64_t n = run.end - run.begin, cols = run.c1 - run.c0;
          if (cols == 0) continue;  // rows that see none of it: finish_scores hides all 64
          float* const sr = scores + run.begin * kKeyBlock + run.c0;
          if (g_.bf16_kernels) {
            kernels_.qk_bf16(q_bf16 + run.begin * g_.head_dim_pairs * 2, n, g_.head_dim_pairs, s.pack.k_bf16(block) + run.c0 * 2, sr,
                             block_max + run.begin, cols);
          } else {
            kernels_.qk_f32(q + run.begin * p_.head_dim, n, p_.head_dim, s.pack.k_f32(block) + run.c0, sr, block_max + run.begin, cols);
          }
        }
      }
      // What exp2 still has to multiply the scores by: 1 once finish_scores has
      // scaled them, or the scale for a fully visible block of raw bfloat16
      // products, whose maxima (qk_bf16's, or taken here) are then scaled.
      float pending = 1.0f;
      if (g_.bf16_kernels && g.score_scale > 0 && full) {
        pending = g.score_scale;
        for (std::int64_t r = 0; r < live; ++r) {
          block_max[r] = (direct ? kernels_.max_of(scores + r * kKeyBlock, kKeyBlock) : block_max[r]) * pending;
        }
      } else {
        const bool kernel_max = !direct && !g_.bf16_kernels;
        cpu::finish_scores(p_, g, io_, kernels_, seen, j0, scores, block_max, kernel_max);
      }
      online_softmax(s, sums, r0, live, pending, shift);
      if (io_.dropout.active()) {  // the dropped weights 0 once l took them (cpu::drop_weights)
        cpu::drop_weights(p_, g_, io_, mask_, t, r0, live, j0, keys, s.scores.data(),
                          g_.bf16_kernels ? s.p_bf16.data() : nullptr);
      }
      float* const o = sums.o + r0 * g_.dv_pad;
      const bf16* const p_bf16 = s.p_bf16.data() + r0 * kKeyBlock;
      if (direct) {
        const cpu::Ahead next{ahead->v.data(), ahead->n, v_format_.row_bytes(p_.head_dim_v)};
        if (g_.bf16_kernels) {
          kernels_.pv_bf16_direct(p_bf16, live, keys, here->v.data(), v_format_, p_.head_dim_v, g_.dv_pad, o, next);
        } else {
          kernels_.pv_direct(scores, live, keys, here->v.data(), v_format_, p_.head_dim_v, g_.dv_pad, o, next);
        }
      } else {
        for (std::int64_t u = 0; u < n_runs; ++u) {  // each run over the keys of its columns (P is 0 elsewhere)
          const cpu::ColumnRun& run = runs[static_cast<std::size_t>(u)];
          const std::int64_t n = run.end - run.begin, k0 = run.c0, k1 = std::min(run.c1, keys);
          if (k1 <= k0) continue;
          float* const orow = o + run.begin * g_.dv_pad;
          if (g_.bf16_kernels) {
            kernels_.pv_bf16(p_bf16 + run.begin * kKeyBlock + k0, n, (k1 - k0 + 1) / 2 * 2, s.pack.v_bf16(j0 + k0), g_.dv_pad, orow);
          } else {
            kernels_.pv_f32(scores + run.begin * kKeyBlock + k0, n, k1 - k0, s.pack.v_f32(j0 + k0), s.pack.ldv(), g_.dv_pad, orow);
          }
        }
      }
    }
    if (io_.dropout.active()) {  // the kept weights' 1 / (1 - p), once on each sum
      const float keep_scale = static_cast<float>(mask_.keep_scale());
      std::for_each(sums.o, sums.o + rows * g_.dv_pad, [&](float& x) { x *= keep_scale; });
    }
    if (direct && !io_.v_codes.empty()) {  // V's descale, on the sums of weights times codes
      const float descale = io_.v_codes.descale_of(t.b, t.kv_head);
      if (descale != 1.0f) std::for_each(sums.o, sums.o + rows * g_.dv_pad, [&](float& x) { x *= descale; });
    }
    if (!split) {
      // (after the descale: with the weights scaled down the sums are at most
      // V's largest value, finite)
      if (shift == 0 && g_.weight_shift > 0 && !cpu::outputs_finite(g_, s.o.data(), rows)) {
        s.keep_first_pass(rows);
        compute(tile_index, chunk, s, g_.weight_shift);
        return;
      }
      cpu::write_rows(p_, g_, io_, t, s.o.data(), s.m.data(), s.l.data(), shift, shift ? s.m0.data() : nullptr,
                      shift ? s.l0.data() : nullptr);
      return;
    }
  }

  // The rows of K and V of keys [j0, min(j0 + 64, end)) of the tile's
  // entry, in place: one lookup in the page table per page.
  void key_rows(const QueryTile& t, std::int64_t j0, std::int64_t end, BlockRows& out) const {
    out.n = std::clamp<std::int64_t>(end - j0, 0, kKeyBlock);
    const std::int64_t k_step = step(io_.k, io_.k_codes), v_step = step(io_.v, io_.v_codes);
    const SequenceMap map = io_.sequences(p_);
    for (std::int64_t j = j0; j < j0 + out.n;) {
      // One lookup a page, for K and V both; the page's run ends where its
      // slots do.
      const SequenceMap::Key key = map.key(t.b, j);
      const std::int64_t run_end = p_.paged() ? std::min(j0 + out.n, j + p_.page_size - key.s) : j0 + out.n;
      const auto* k = static_cast<const std::byte*>(in_place(io_.k, io_.k_codes, t, key));
      const auto* v = static_cast<const std::byte*>(in_place(io_.v, io_.v_codes, t, key));
      for (std::int64_t r = 0; r < run_end - j; ++r) {
        out.k[static_cast<std::size_t>(j - j0 + r)] = k + r * k_step;
        out.v[static_cast<std::size_t>(j - j0 + r)] = v + r * v_step;
      }
      j = run_end;
    }
  }

  // The row of K or V (its codes when quantised) of a key where the sequence
  // map puts it (through the page table when paged), in place.
  const void* in_place(const TensorView& view, const QuantView& codes, const QueryTile& t, SequenceMap::Key key) const {
    if (!codes.empty()) return codes.row(key.b, t.kv_head, key.s);
    const std::int64_t offset = view.offset(key.b, t.kv_head, key.s, 0);
    return static_cast<const std::byte*>(view.data) + offset * static_cast<std::int64_t>(dtype_size(view.dtype));
  }
  // Bytes from a key's row to the next one's of K or V.
  static std::int64_t step(const TensorView& view, const QuantView& codes) {
    return codes.empty() ? view.strides[2] * static_cast<std::int64_t>(dtype_size(view.dtype)) : codes.strides[2];
  }


  // Folds the scores of rows [r0, r0 + live) of the current block (times
  // `pending`) into their running max, sum and output; the block's
  // probabilities go to the rows of s.p_bf16 for bfloat16 kernels, else over
  // the rows of s.scores. A row that has seen nothing visible yet (max -inf)
  // gets weights 0: its scores are all -inf, taken against 0. Up to
  // kMaxTileRows rows at a time (a tile holds more when one kv head has more
  // query heads).
  void online_softmax(Scratch& s, const Sums& acc, std::int64_t r0, std::int64_t live, float pending, int shift) {
    std::array<float, kMaxTileRows> m_new, against, sums;
    for (std::int64_t first = r0; first < r0 + live; first += kMaxTileRows) {
      const std::int64_t n = std::min(kMaxTileRows, r0 + live - first);
      for (std::int64_t i = 0; i < n; ++i) {
        const auto r = static_cast<std::size_t>(first + i), at = static_cast<std::size_t>(i);
        m_new[at] = std::max(acc.m[r], s.block_max[r]);
        against[at] = m_new[at] == kNegInf ? 0.0f : m_new[at];
      }
      float* const scores = s.scores.data() + first * kKeyBlock;
      if (g_.bf16_kernels) {
        kernels_.exp2_rows_bf16(scores, n, kKeyBlock, pending, against.data(), shift, s.p_bf16.data() + first * kKeyBlock, sums.data());
      } else {
        kernels_.exp2_rows(scores, n, kKeyBlock, pending, against.data(), shift, sums.data());
      }
      for (std::int64_t i = 0; i < n; ++i) {
        const auto r = static_cast<std::size_t>(first + i), at = static_cast<std::size_t>(i);
        const float m_old = acc.m[r];
        if (m_new[at] == kNegInf) continue;  // nothing visible yet
        // Lazy: rescale only when the max grew. A row that has seen nothing
        // visible yet (each chunk's first block) still holds its zeros.
        if (m_new[at] > m_old && m_old != kNegInf) {
          const float alpha = std::exp2(m_old - m_new[at]);
          float* o = acc.o + (first + i) * g_.dv_pad;
          kernels_.scale(o, alpha, g_.dv_pad);
          acc.l[r] *= alpha;
        }
        acc.l[r] += sums[at];
        acc.m[r] = m_new[at];
      }
    }
  }

  // Combines the chunks of one tile: weights 2^(m_c - M) so each partial sum
  // is measured against the common max M.
  // The key blocks [begin, end) that hold a tile's visible keys (compute's
  // range, for merge).
  std::pair<std::int64_t, std::int64_t> visible_blocks(const QueryTile& t) const {
    return {cpu::visible_key_begin(p_, io_, t) / kKeyBlock, (cpu::visible_key_end(p_, io_, t) + kKeyBlock - 1) / kKeyBlock};
  }
  // The chunks a tile whose visible keys span blocks [begin, end) splits
  // into: 1 unless its entry has few tiles (chunks_ > 1) and the tile's own
  // keys are many, then split_parts of them. A function of the entry alone.
  std::int64_t parts_of(std::int64_t begin_block, std::int64_t end_block) const {
    return chunks_ > 1 && end_block - begin_block >= 2 * kSplitChunks ? split_parts(end_block - begin_block) : 1;
  }
  // One chunk per kChunkBlocks blocks, 2 to kSplitChunks of them: each
  // chunk costs its set-up, more rescales, a cold start and its share of
  // the merge (measured: 8 chunks of a 4096-key row about 1 % of the row's
  // time each), so a 4096-key row splits in 4 and rows of 8192 keys and
  // more in 8.
  static std::int64_t split_parts(std::int64_t blocks) { return std::clamp<std::int64_t>(blocks / kChunkBlocks, 2, kSplitChunks); }

  void merge(std::int64_t tile_index, Scratch& s, int shift = 0) {
    const QueryTile t = cpu::query_tile(p_, g_, tile_index);
    const auto [begin_block, end_block] = visible_blocks(t);
    const std::int64_t parts = parts_of(begin_block, end_block);
    if (parts == 1) return;  // written whole by its one chunk
    for (std::int64_t r = 0; r < t.rows(); ++r) {
      float global = kNegInf;
      for (std::int64_t c = 0; c < parts; ++c) global = std::max(global, partial_m_[(tile_index * chunks_ + c) * g_.tile_rows + r]);
      float l = 0;
      float* o = s.o.data() + r * g_.dv_pad;
      std::fill_n(o, g_.dv_pad, 0.0f);
      for (std::int64_t c = 0; c < parts; ++c) {
        const std::int64_t at = (tile_index * chunks_ + c) * g_.tile_rows + r;
        if (partial_l_[at] == 0) continue;
        const float w = std::exp2(partial_m_[at] - global);
        l += w * partial_l_[at];
        const float* po = partial_o_.data() + at * g_.dv_pad;
        kernels_.add_scaled(o, po, w, g_.dv_pad);
      }
      s.m[static_cast<std::size_t>(r)] = global;
      s.l[static_cast<std::size_t>(r)] = l;
    }
    if (shift == 0 && g_.weight_shift > 0 && !cpu::outputs_finite(g_, s.o.data(), t.rows())) {
      // Every chunk of this tile again, here, with the weights scaled down;
      // only this task touches the tile's partials.
      s.keep_first_pass(t.rows());
      for (std::int64_t c = 0; c < parts; ++c) compute(tile_index, c, s, g_.weight_shift);
      merge(tile_index, s, g_.weight_shift);
      return;
    }
    cpu::write_rows(p_, g_, io_, t, s.o.data(), s.m.data(), s.l.data(), shift, shift ? s.m0.data() : nullptr,
                    shift ? s.l0.data() : nullptr);
  }

  Problem p_;
  AttentionIO io_;
  const cpu::Kernels& kernels_;
  Geometry g_;
  DropoutMask mask_;  // AttentionIO::dropout's, when active
  int threads_ = 1;
  bool direct_ = false;  // every tile reads K and V in place
  cpu::RowFormat k_format_ = DType::f32, v_format_ = DType::f32;  // what their rows hold
  bool narrow_rows_ = true;  // a block computed only by the rows that see one of its keys
  std::int64_t tiles_ = 0, chunks_ = 1;
  std::vector<std::int64_t> packed_tile_;  // per scratch: the tile whose Q it holds packed (-1: none)
  std::vector<Scratch> scratch_;
  std::vector<float> partial_o_, partial_m_, partial_l_;
};

class StreamingBackend final : public Backend {
 public:
  StreamingBackend() {
    description_ = "FlashAttention-2 on the CPU: tiled online softmax, O(seq) memory, split-K decode; micro-kernels: " +
                   std::string(cpu::best_kernels().isa);
  }
  std::string_view name() const override { return "streaming"; }
  std::string_view description() const override { return description_; }
  // Not float64: the kernels accumulate in float32.
  Capabilities capabilities() const override {
    return {.dtypes = dtype_bit(DType::f32) | dtype_bit(DType::f16) | dtype_bit(DType::bf16), .features = kAllFeatures, .lse = true, .backward = true,
            .encodings = kAllEncodings, .batch_invariant = true,
            .bitwise_relations = kRelationLayout, .dropout = true};
  }
  Status supports(const Problem&) const override { return Status::yes(); }
  std::unique_ptr<Plan> prepare(const Problem& p, const AttentionIO& io, const RunOptions& options) const override {
    // Scores in float32: values beyond its range are computed as an equivalent case that fits, or refused.
    return prepare_in_float32_range(p, io, [&](const Problem& fit, const AttentionIO& fit_io) -> std::unique_ptr<Plan> {
      if (fit.ragged) return plan_per_entry(fit, fit_io, options, *this);  // each entry a dense problem, in place
      return std::make_unique<StreamingPlan>(fit, fit_io, options);
    });
  }
  // FlashAttention-2's backward (impls/cpu_kernels/flash_backward.hpp), with this backend's tile height.
  std::unique_ptr<BackwardPlan> prepare_backward(const Problem& p, const BackwardIO& io, const RunOptions& options) const override {
    return prepare_backward_in_float32_range(p, io, [&](const Problem& fit, const BackwardIO& fit_io) -> std::unique_ptr<BackwardPlan> {
      if (fit.ragged) return plan_backward_per_entry(fit, fit_io, options, *this);
      // A float32-product forward that read K in place summed Q K^T in the
      // in-place kernel's order: the backward recomputes S in it too.
      const Geometry g = Geometry::of(fit, kMaxTileRows, cpu::best_kernels());
      const bool in_place = !g.bf16_kernels && reads_in_place(fit, fit_io.forward, g);
      return cpu::make_flash_backward_plan(fit, fit_io, options, kMaxTileRows, in_place);
    });
  }

 private:
  std::string description_;
};

}  // namespace

std::unique_ptr<Backend> make_streaming_backend() { return std::make_unique<StreamingBackend>(); }

}  // namespace attn
