#include "impls/blocked/blocked.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cmath>
#include <limits>
#include <vector>

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

constexpr std::int64_t kMaxTileRows = 48;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using Scratch = cpu::TileScratch;

// The rows of an entry's keys in K or V (its codes when quantised) of one kv
// head, where the sequence map puts them (through the page table when
// paged): one lookup a page.
struct RowsInPlace {
  const Problem& p;
  const TensorView& view;
  const QuantView& codes;
  SequenceMap map;
  std::int64_t b = 0, kv_head = 0;
  void fill(std::int64_t j0, std::int64_t n, std::array<const void*, kKeyBlock>& out) const {
    const auto element = static_cast<std::int64_t>(dtype_size(view.dtype));
    const std::int64_t step = codes.empty() ? view.strides[2] * element : codes.strides[2];
    for (std::int64_t j = j0; j < j0 + n;) {
      const SequenceMap::Key key = map.key(b, j);
      const std::int64_t run_end = p.paged() ? std::min(j0 + n, j + p.page_size - key.s) : j0 + n;
      const auto* row = codes.empty()
                            ? static_cast<const std::byte*>(view.data) + view.offset(key.b, kv_head, key.s, 0) * element
                            : reinterpret_cast<const std::byte*>(codes.row(key.b, kv_head, key.s));
      for (std::int64_t r = 0; r < run_end - j; ++r) out[static_cast<std::size_t>(j - j0 + r)] = row + r * step;
      j = run_end;
    }
  }
};

class BlockedPlan final : public Plan {
 public:
  BlockedPlan(const Problem& p, const AttentionIO& io, const RunOptions& options)
      : p_(p), io_(io), kernels_(cpu::best_kernels()), g_(Geometry::of(p, kMaxTileRows, kernels_)), mask_(p, io.dropout) {
    threads_ = resolve_threads(options.threads);
    // Decode tiles read K and V in place (cpu::reads_in_place): bfloat16 in
    // bfloat16 pairs where the packed path multiplies so, else (float16;
    // bfloat16 where pairs are the slower) widened on load to float32
    // products; fp8 and ggml codes decoded on load (K's descale folded into
    // the score scale or Q, V's applied to the sums). Other quantised caches
    // are dequantised into the pack.
    in_place_ = cpu::reads_in_place(p, io, g_);
    if (in_place_ && !g_.bf16_kernels) g_ = g_.with_float32_products();
    k_format_ = cpu::format_of(io.k, io.k_codes);
    v_format_ = cpu::format_of(io.v, io.v_codes);
    require_workspace(threads_ * Scratch::bytes_for(p, g_, !in_place_, g_.key_blocks), "blocked's scores of a row block, per thread");
    scratch_.resize(static_cast<std::size_t>(threads_));
    for (Scratch& s : scratch_) s.reserve(p, io, g_, !in_place_, g_.key_blocks);  // scores of every key block
  }

  void run() override {
    for (Scratch& s : scratch_) s.pack.forget();  // K and V as they are now
    ThreadPool::get(threads_).parallel_for(p_.batch * p_.heads_kv * g_.query_tiles, [&](std::int64_t tile, int worker) {
      compute(tile, scratch_[static_cast<std::size_t>(worker)]);
    });
  }
  bool has_lse() const override { return true; }
  std::size_t workspace_bytes() const override {
    std::size_t bytes = 0;
    for (const Scratch& s : scratch_) bytes += s.bytes();
    return bytes;
  }

 private:
  // shift 0 first; a tile whose sums of weights times V overflowed is redone
  // with the weights scaled down (Kernels::exp2_sum).
  void compute(std::int64_t tile_index, Scratch& s, int shift = 0) {
    const QueryTile t = cpu::query_tile(p_, g_, tile_index);
    const std::int64_t rows = t.rows();
    const std::int64_t end_key = cpu::visible_key_end(p_, io_, t);
    const std::int64_t end_block = (end_key + kKeyBlock - 1) / kKeyBlock;
    // Blocks left of every row's window hold no visible key.
    const std::int64_t begin_block = std::min(cpu::visible_key_begin(p_, io_, t) / kKeyBlock, end_block);
    if (!in_place_) s.pack.pack(p_, g_, io_, t.b, t.kv_head, 0, g_.key_blocks);
    // In place: the rows of a block's keys up to the last visible one (the
    // previous block's look-ahead when it was the one before), and the next
    // block's, which the kernels ask the memory for as they go.
    std::array<const void*, kKeyBlock> rows_a{}, rows_b{};
    std::array<const void*, kKeyBlock>* here = &rows_a;
    std::array<const void*, kKeyBlock>* ahead = &rows_b;
    const TensorView* ahead_view = nullptr;  // whose rows of block ahead_block `ahead` holds
    std::int64_t ahead_block = -1;
    auto in_block = [&](std::int64_t block) { return std::clamp<std::int64_t>(end_key - block * kKeyBlock, 0, kKeyBlock); };
    auto rows_in_place = [&](const TensorView& view, const QuantView& codes, std::int64_t block, std::int64_t bytes) {
      const RowsInPlace rows_of_view{p_, view, codes, io_.sequences(p_), t.b, t.kv_head};
      if (ahead_view == &view && ahead_block == block) std::swap(here, ahead);
      else rows_of_view.fill(block * kKeyBlock, in_block(block), *here);
      rows_of_view.fill((block + 1) * kKeyBlock, in_block(block + 1), *ahead);
      ahead_view = &view;
      ahead_block = block + 1;
      return cpu::Ahead{ahead->data(), in_block(block + 1), bytes};
    };
    cpu::pack_queries(p_, g_, io_, t, s.q.data(), s.q_bf16.data());
    // K's descale, in place (the pack dequantises with it).
    const Geometry g = in_place_ ? cpu::with_k_descale(g_, p_, io_, t, s.q.data()) : g_;
    std::fill_n(s.m.begin(), rows, kNegInf);
    // Only the rows that see a key of a block compute it (a window's edge
    // blocks reach part of the tile); AMX works on whole 16-row tiles, so
    // there every row does (a row that sees none computes nothing).
    const bool narrow = !g_.bf16_kernels || kernels_.bf16_rows_align == 1;
    auto rows_of = [&](std::int64_t block) { return narrow ? cpu::rows_seeing_block(p_, io_, t, block * kKeyBlock) : t; };
    // Pass 1: every score of the row block, and the exact row maxima.
    for (std::int64_t block = begin_block; block < end_block; ++block) {
      const QueryTile seen = rows_of(block);
      const std::int64_t r0 = (seen.first_query - t.first_query) * g_.group, live = seen.rows();
      float* tile_scores = s.scores.data() + block * g_.scratch_rows * kKeyBlock + r0 * kKeyBlock;
      if (live == 0) continue;
      if (in_place_) {
        const cpu::Ahead next = rows_in_place(io_.k, io_.k_codes, block, k_format_.row_bytes(p_.head_dim));
        if (g_.bf16_kernels) {
          kernels_.qk_bf16_direct(s.q_bf16.data() + r0 * g_.head_dim_pairs * 2, live, p_.head_dim, g_.head_dim_pairs * 2,
                                  here->data(), k_format_, in_block(block), tile_scores, next);
        } else {
          kernels_.qk_direct(s.q.data() + r0 * p_.head_dim, live, p_.head_dim, here->data(), k_format_, in_block(block),
                             tile_scores, next);
        }
      } else if (g_.bf16_kernels) {
        kernels_.qk_bf16(s.q_bf16.data() + r0 * g_.head_dim_pairs * 2, live, g_.head_dim_pairs, s.pack.k_bf16(block), tile_scores,
                         nullptr, kKeyBlock);
      } else {
        kernels_.qk_f32(s.q.data() + r0 * p_.head_dim, live, p_.head_dim, s.pack.k_f32(block), tile_scores, s.block_max.data() + r0,
                        kKeyBlock);
      }
      // (the float32 packed kernel gives the block's row maxima; otherwise finish_scores takes them)
      cpu::finish_scores(p_, g, io_, kernels_, seen, block * kKeyBlock, tile_scores, s.block_max.data() + r0,
                         !in_place_ && !g_.bf16_kernels);
      for (std::int64_t r = r0; r < r0 + live; ++r) s.m[r] = std::max(s.m[r], s.block_max[r]);
    }
    // Pass 2: exponentials against the final maxima, sums, and P V.
    std::fill_n(s.l.begin(), rows, 0.0f);
    std::fill_n(s.o.begin(), rows * g_.dv_pad, 0.0f);
    for (std::int64_t block = begin_block; block < end_block; ++block) {
      const QueryTile seen = rows_of(block);
      const std::int64_t r0 = (seen.first_query - t.first_query) * g_.group, live = seen.rows();
      if (live == 0) continue;
      float* tile_scores = s.scores.data() + block * g_.scratch_rows * kKeyBlock + r0 * kKeyBlock;
      for (std::int64_t r = 0; r < live; ++r) {
        float* row = tile_scores + r * kKeyBlock;
        if (s.m[r0 + r] == kNegInf) std::fill_n(row, kKeyBlock, 0.0f);
        else s.l[r0 + r] += kernels_.exp2_sum(row, kKeyBlock, 1.0f, s.m[r0 + r], shift);
      }
      const std::int64_t j0 = block * kKeyBlock;
      const std::int64_t keys = std::min(kKeyBlock, p_.seq_k - j0);
      // Dropout: the dropped weights 0 once l took them (cpu::drop_weights).
      if (io_.dropout.active()) cpu::drop_weights(p_, g_, io_, mask_, t, r0, live, j0, keys, s.scores.data() + block * g_.scratch_rows * kKeyBlock, nullptr);
      float* o = s.o.data() + r0 * g_.dv_pad;
      if (in_place_) {
        const cpu::Ahead next = rows_in_place(io_.v, io_.v_codes, block, v_format_.row_bytes(p_.head_dim_v));
        if (g_.bf16_kernels) {
          bf16* p_rows = s.p_bf16.data() + r0 * kKeyBlock;
          kernels_.to_bf16(tile_scores, live * kKeyBlock, p_rows);
          kernels_.pv_bf16_direct(p_rows, live, in_block(block), here->data(), v_format_, p_.head_dim_v, g_.dv_pad, o, next);
        } else {
          kernels_.pv_direct(tile_scores, live, in_block(block), here->data(), v_format_, p_.head_dim_v, g_.dv_pad, o, next);
        }
      } else if (g_.bf16_kernels) {
        // P in bfloat16, and the rows after it zero: the AMX kernels read the
        // padding rows up to scratch_rows (where r0 is 0).
        bf16* p_rows = s.p_bf16.data() + r0 * kKeyBlock;
        kernels_.to_bf16(tile_scores, live * kKeyBlock, p_rows);
        std::fill(p_rows + live * kKeyBlock, s.p_bf16.data() + g_.scratch_rows * kKeyBlock, bf16{});
        kernels_.pv_bf16(p_rows, live, (keys + 1) / 2 * 2, s.pack.v_bf16(j0), g_.dv_pad, o);
      } else {
        kernels_.pv_f32(tile_scores, live, keys, s.pack.v_f32(j0), s.pack.ldv(), g_.dv_pad, o);
      }
    }
    if (io_.dropout.active()) {  // the kept weights' 1 / (1 - p), once on each sum
      const float keep_scale = static_cast<float>(mask_.keep_scale());
      std::for_each(s.o.begin(), s.o.begin() + rows * g_.dv_pad, [&](float& x) { x *= keep_scale; });
    }
    if (in_place_ && !io_.v_codes.empty()) {  // V's descale, on the sums of weights times codes
      const float descale = io_.v_codes.descale_of(t.b, t.kv_head);
      if (descale != 1.0f) std::for_each(s.o.begin(), s.o.begin() + rows * g_.dv_pad, [&](float& x) { x *= descale; });
    }
    if (shift == 0 && g_.weight_shift > 0 && !cpu::outputs_finite(g_, s.o.data(), rows)) {
      s.keep_first_pass(rows);
      compute(tile_index, s, g_.weight_shift);
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
  bool in_place_ = false;  // decode tiles read K and V where they are (cpu::reads_in_place)
  cpu::RowFormat k_format_ = DType::f32, v_format_ = DType::f32;  // what their rows hold
  int threads_ = 1;
  std::vector<Scratch> scratch_;
};

class BlockedBackend final : public Backend {
 public:
  BlockedBackend() {
    description_ = "materialised scores per row block, exact two-pass softmax, cache-blocked micro-kernels (" +
                   std::string(cpu::best_kernels().isa) + ")";
  }
  std::string_view name() const override { return "blocked"; }
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
      return std::make_unique<BlockedPlan>(fit, fit_io, options);
    });
  }
  // FlashAttention-2's backward (impls/cpu_kernels/flash_backward.hpp), with this backend's tile height.
  std::unique_ptr<BackwardPlan> prepare_backward(const Problem& p, const BackwardIO& io, const RunOptions& options) const override {
    return prepare_backward_in_float32_range(p, io, [&](const Problem& fit, const BackwardIO& fit_io) -> std::unique_ptr<BackwardPlan> {
      if (fit.ragged) return plan_backward_per_entry(fit, fit_io, options, *this);
      // A float32-product forward that read K in place summed Q K^T in the
      // in-place kernel's order: the backward recomputes S in it too.
      const Geometry g = Geometry::of(fit, kMaxTileRows, cpu::best_kernels());
      const bool in_place = !g.bf16_kernels && cpu::reads_in_place(fit, fit_io.forward, g);
      return cpu::make_flash_backward_plan(fit, fit_io, options, kMaxTileRows, in_place);
    });
  }

 private:
  std::string description_;
};

}  // namespace

std::unique_ptr<Backend> make_blocked_backend() { return std::make_unique<BlockedBackend>(); }

}  // namespace attn
