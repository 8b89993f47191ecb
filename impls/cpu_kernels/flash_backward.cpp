#include "impls/cpu_kernels/flash_backward.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "attnbench/dropout.hpp"
#include "attnbench/error.hpp"
#include "attnbench/value_range.hpp"
#include "core/thread_pool.hpp"
#include "impls/cpu_kernels/gradients.hpp"
#include "impls/cpu_kernels/tiling.hpp"

namespace attn::cpu {

namespace {

constexpr double kLog2e = 1.4426950408889634;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Tasks the key chunks aim at, whatever the thread count (which must not
// change the sums): enough for 2 to 8 threads to share a causal problem's
// unequal key blocks.
constexpr std::int64_t kTargetTasks = 16;

std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }
std::size_t size(std::int64_t n) { return static_cast<std::size_t>(n); }

// One thread's scratch: a key block packed three ways (K^T for S, K rows for
// dQ, V^T for dP), its dK and dV sums, and one tile's scores.
struct Worker {
  LineVector<float> kt, kr, vt, v_row, dk, dv, s, dp, raw, t, row_max;
  LineVector<float> qd;  // a tile's scaled Q rows at stride head_dim, for the in-place kernel
  std::array<const void*, kKeyBlock> kr_rows{};  // kr's rows, as the in-place kernel reads keys
  // The bfloat16 path's: K as pairs of dims per key (S) and as pairs of keys
  // per column (dQ), V as pairs of dims per key (dP); a 64-row chunk of P^T
  // or dS^T, of Q or dO as pairs of rows per column, and dS of a tile.
  LineVector<bf16> kp, kpairs, vp, pt, pb, ds;
};

class FlashBackwardPlan final : public BackwardPlan {
 public:
  FlashBackwardPlan(const Problem& p, const BackwardIO& io, const RunOptions& options, std::int64_t max_tile_rows,
                    bool forward_in_place)
      : p_(p), io_(io), kernels_(best_kernels()), g_(Geometry::of(p, max_tile_rows, kernels_)), mask_(p, io.forward.dropout) {
    if (p.ragged || p.paged()) throw Unsupported("the flash backward takes dense problems (packed ones run per entry)");
    if (!io.forward.lse) throw Unsupported("the flash backward needs the forward's lse");
    // bfloat16 cases multiply in bfloat16 pairs (vdpbf16ps), P and dS rounded
    // to bfloat16 as FlashAttention-2's 16-bit backward feeds them, where the
    // host multiplies bfloat16 in pairs (Geometry's bf16_kernels) and the
    // kernels take any row count (AVX-512, portable); the AMX set wants rows
    // and pairs padded to its tiles and keeps the float32 path, as does a host
    // whose pairs are the slower.
    bf16_ = g_.bf16_kernels && kernels_.bf16_rows_align == 1 && kernels_.bf16_pairs_align == 1;
    // The scores exactly the forward's (log2 units, finish_scores; float32 Q
    // prescaled, bfloat16 products scaled there as the forward's bfloat16
    // tiles are), so that P meets the forward's lse: scores rounded otherwise
    // would be off from it by their rounding, which at |s| in the thousands
    // (a very negative bias) is a part in a thousand of P.
    g_.bf16_kernels = false;
    g_.q_prescaled = !bf16_;
    // A forward that read K in place (streaming's decode tiles) summed Q K^T
    // in its in-place kernel's order: recomputed in another order, a score of
    // magnitude |s| is off by its rounding and P = exp2(s - lse) misses 1 by
    // about |s| * 2^-24 even where one key takes all the weight.
    direct_scores_ = forward_in_place && !bf16_;
    g_.scratch_rows = g_.tile_rows;
    threads_ = resolve_threads(options.threads);
    d_pad_ = round_up(p.head_dim, 16);
    qpairs_ = (p.head_dim + 1) / 2;
    vpairs_ = (p.head_dim_v + 1) / 2;
    units_ = p.batch * p.heads_kv;
    unit_overflowed_ = std::make_unique<std::atomic<bool>[]>(size(units_));
    rows_ = p.seq_q * g_.group;
    with_dbias_ = !io.dbias.empty();
    // The key chunks follow the entry (its kv heads), never the batch: dQ's
    // partial sums are added in chunk order, so an entry's dQ keeps its bits
    // alone and in any batch (docs/verification/invariance.md).
    const std::int64_t owners = with_dbias_ ? 1 : p.heads_kv;
    chunks_ = std::clamp<std::int64_t>((kTargetTasks + owners - 1) / owners, 1, std::max<std::int64_t>(g_.key_blocks, 1));
    per_chunk_ = (g_.key_blocks + chunks_ - 1) / chunks_;
    auto d = [](std::int64_t x) { return static_cast<double>(x); };
    const double all_rows = d(units_) * d(rows_);
    const double dbias_elements = with_dbias_ ? d(p.broadcast_elements(p.bias)) : 0.0;
    chunks_per_tile_ = (g_.tile_rows + kKeyBlock - 1) / kKeyBlock;
    const double pair_rows = bf16_ ? d(units_) * d(g_.query_tiles * chunks_per_tile_ * kKeyBlock) : 0.0;
    require_workspace(4.0 * all_rows * d(2 * d_pad_ + g_.dv_pad + 2 + chunks_ * d_pad_) + 8.0 * dbias_elements +
                          4.0 * d(threads_) * (d(kKeyBlock) * d(3 * d_pad_ + 3 * g_.dv_pad) + 4.0 * d(g_.tile_rows) * d(kKeyBlock) + 4096.0) +
                          (bf16_ ? 2.0 * (all_rows * d(2 * (qpairs_ + vpairs_)) + pair_rows * d(d_pad_ + g_.dv_pad)) : 0.0),
                      "the flash backward's packed Q and dO, dQ partials and key blocks");
    if (!bf16_) qs_.assign(size(units_ * rows_ * d_pad_), 0.0f);
    qn_.assign(size(units_ * rows_ * d_pad_), 0.0f);
    dout_.assign(size(units_ * rows_ * g_.dv_pad), 0.0f);
    delta_.assign(size(units_ * rows_), 0.0f);
    lse_hi_.assign(size(units_ * rows_), 0.0f);
    lse_lo_.assign(size(units_ * rows_), 0.0f);
    delta64_.assign(io.dsinks ? size(units_ * rows_) : 0, 0.0);
    partial_.assign(size(units_ * chunks_ * rows_ * d_pad_), 0.0f);
    dbias_.assign(size(static_cast<std::int64_t>(dbias_elements)), 0.0);
    tile_keys_.assign(size(units_ * g_.query_tiles), {0, 0});
    workers_.resize(size(threads_));
    if (bf16_) {
      qb_.assign(size(units_ * rows_ * qpairs_ * 2), bf16{});
      dob_.assign(size(units_ * rows_ * vpairs_ * 2), bf16{});
      row_pairs_q_.assign(size(static_cast<std::int64_t>(pair_rows) * d_pad_), bf16{});
      row_pairs_dout_.assign(size(static_cast<std::int64_t>(pair_rows) * g_.dv_pad), bf16{});
    }
    for (Worker& w : workers_) {
      if (bf16_) {
        w.kp.assign(size(qpairs_ * kKeyBlock * 2), bf16{});
        w.kpairs.assign(size(kKeyBlock * d_pad_), bf16{});
        w.vp.assign(size(vpairs_ * kKeyBlock * 2), bf16{});
        w.pt.assign(size(kKeyBlock * kKeyBlock), bf16{});
        w.ds.assign(size(g_.tile_rows * kKeyBlock), bf16{});
        w.pb.assign(size(g_.tile_rows * kKeyBlock), bf16{});
      }
      if (!bf16_) {
        w.kt.assign(size(d_pad_ * kKeyBlock), 0.0f);
        w.vt.assign(size(g_.dv_pad * kKeyBlock), 0.0f);
      }
      w.kr.assign(size(kKeyBlock * d_pad_), 0.0f);  // dQ's float32 product in both paths
      if (direct_scores_) {
        w.qd.assign(size(g_.tile_rows * p.head_dim), 0.0f);
        for (std::int64_t jj = 0; jj < kKeyBlock; ++jj) w.kr_rows[size(jj)] = w.kr.data() + jj * d_pad_;
      }
      w.v_row.assign(size(g_.dv_pad), 0.0f);
      w.dk.assign(size(kKeyBlock * d_pad_), 0.0f);
      w.dv.assign(size(kKeyBlock * g_.dv_pad), 0.0f);
      for (auto* tile : {&w.s, &w.dp, &w.raw}) tile->assign(size(g_.tile_rows * kKeyBlock), 0.0f);
      w.t.assign(size(kKeyBlock * kKeyBlock), 0.0f);
      w.row_max.assign(size(g_.tile_rows), 0.0f);
    }
  }

  // Every gradient is linear in dO: a (batch entry, kv head) whose float32
  // sums overflowed (V near float32's largest, a true gradient still finite)
  // is redone with dO scaled down and P up (GradientPass), as the forward
  // redoes a tile with its weights scaled down. Each unit is rescued on its
  // own data and the others run as before, to the bit: an entry's gradients
  // do not follow what else is in the batch (blocked and streaming declare
  // batch invariance; a whole-batch rescue broke it, fuzz seed 3 case 657).
  // An overflowed dbias, summed across units, rescues every unit.
  void run() override {
    passes_.assign(size(units_), GradientPass{});
    for (;;) {
      for (std::int64_t u = 0; u < units_; ++u) unit_overflowed_[size(u)] = false;
      dbias_overflowed_ = false;
      pass();
      bool again = false;
      for (std::int64_t u = 0; u < units_; ++u) {
        if (!unit_overflowed_[size(u)] && !dbias_overflowed_) continue;
        const GradientShifts shifts = gradient_overflow_shifts(p_, io_, u / p_.heads_kv, u % p_.heads_kv);
        again |= next_gradient_pass(passes_[size(u)], shifts);
      }
      if (!again) return;
    }
  }

 private:
  void pass() {
    ThreadPool& pool = ThreadPool::get(threads_);
    pool.parallel_for(units_, [&](std::int64_t unit, int worker) { pack_rows(unit, workers_[size(worker)]); });
    std::fill(dbias_.begin(), dbias_.end(), 0.0);
    if (with_dbias_) {
      // A chunk of keys across every (batch, kv head): its dbias sums stay in this task.
      pool.parallel_for(chunks_, [&](std::int64_t chunk, int worker) {
        for (std::int64_t unit = 0; unit < units_; ++unit) key_chunk(unit, chunk, workers_[size(worker)]);
      });
    } else {
      pool.parallel_for(units_ * chunks_, [&](std::int64_t task, int worker) {
        key_chunk(task / chunks_, task % chunks_, workers_[size(worker)]);
      });
    }
    pool.parallel_for(units_, [&](std::int64_t unit, int) { write_dq(unit); });
    if (with_dbias_ && !store_dbias(p_, io_.dbias, dbias_, 0)) dbias_overflowed_ = true;
    if (io_.dsinks) write_dsinks();
  }

  std::int64_t row_of(std::int64_t unit, std::int64_t r) const { return unit * rows_ + r; }

  // Q (unscaled and times score_scale), dO, D = rowsum(dO o O) and lse in
  // log2 units of one (batch, kv head), rows r = position * group + head in
  // group; and the keys each of its tiles may see.
  void pack_rows(std::int64_t unit, Worker& w) {
    const std::int64_t b = unit / p_.heads_kv, kv_head = unit % p_.heads_kv;
    const AttentionIO& f = io_.forward;
    const TensorView out{f.out.data, f.out.dtype, f.out.shape, f.out.strides};
    float* o = w.v_row.data();  // a row of O
    for (std::int64_t i = 0; i < p_.seq_q; ++i) {
      for (std::int64_t hg = 0; hg < g_.group; ++hg) {
        const std::int64_t h = kv_head * g_.group + hg, at = row_of(unit, i * g_.group + hg);
        float* qn = qn_.data() + at * d_pad_;
        read_row(f.q, f.q.offset(b, h, i, 0), p_.head_dim, qn);
        if (!bf16_) {
          float* qs = qs_.data() + at * d_pad_;
          for (std::int64_t d = 0; d < p_.head_dim; ++d) qs[d] = qn[d] * g_.score_scale;
        }
        float* dout = dout_.data() + at * g_.dv_pad;
        read_row(io_.dout, io_.dout.offset(b, h, i, 0), p_.head_dim_v, dout);
        if (const int shift = passes_[size(unit)].dout_shift; shift > 0) {
          for (std::int64_t c = 0; c < p_.head_dim_v; ++c) dout[c] = std::ldexp(dout[c], -shift);
        }
        if (bf16_) {  // exact: the case is bfloat16 (dO scaled by a power of two)
          bf16* qb = qb_.data() + at * qpairs_ * 2;
          bf16* dob = dob_.data() + at * vpairs_ * 2;
          for (std::int64_t d = 0; d < p_.head_dim; ++d) qb[d] = float_to_bf16(qn[d]);
          for (std::int64_t c = 0; c < p_.head_dim_v; ++c) dob[c] = float_to_bf16(dout[c]);
        }
        read_row(out, out.offset(b, h, i, 0), p_.head_dim_v, o);
        double delta = 0;
        for (std::int64_t c = 0; c < p_.head_dim_v; ++c) delta += static_cast<double>(dout[c]) * static_cast<double>(o[c]);
        delta_[size(at)] = static_cast<float>(delta);
        if (io_.dsinks) delta64_[size(at)] = delta;
        // lse in log2 units as a float and what its rounding left out: at
        // |lse| in the thousands the float alone would be off by a part in a
        // thousand, and P with it.
        const double lse = f.lse[(b * p_.heads_q + h) * p_.seq_q + i];
        split_lse2(lse, lse_hi_[size(at)], lse_lo_[size(at)]);
      }
    }
    for (std::int64_t tile = 0; tile < g_.query_tiles; ++tile) {
      const QueryTile t = query_tile(p_, g_, unit * g_.query_tiles + tile);
      tile_keys_[size(unit * g_.query_tiles + tile)] = {visible_key_begin(p_, f, t), visible_key_end(p_, f, t)};
      if (!bf16_) continue;
      // Q and dO of each 64-row chunk of the tile as pairs of rows per column
      // (what pv_bf16 reads as its V), zero past the tile's rows.
      const std::int64_t r0 = t.first_query * g_.group;
      for (std::int64_t c = 0; c < chunks_per_tile_; ++c) {
        bf16* q_pairs = row_pairs_q_.data() + ((unit * g_.query_tiles + tile) * chunks_per_tile_ + c) * kKeyBlock * d_pad_;
        bf16* dout_pairs = row_pairs_dout_.data() + ((unit * g_.query_tiles + tile) * chunks_per_tile_ + c) * kKeyBlock * g_.dv_pad;
        for (std::int64_t r = 0; r < kKeyBlock; ++r) {
          const std::int64_t row = c * kKeyBlock + r;
          const bool real = row < t.rows();
          const bf16* q = real ? qb_.data() + row_of(unit, r0 + row) * qpairs_ * 2 : nullptr;
          const bf16* dout = real ? dob_.data() + row_of(unit, r0 + row) * vpairs_ * 2 : nullptr;
          for (std::int64_t d = 0; d < d_pad_; ++d) q_pairs[((r / 2) * d_pad_ + d) * 2 + r % 2] = real && d < p_.head_dim ? q[d] : bf16{};
          for (std::int64_t d = 0; d < g_.dv_pad; ++d) {
            dout_pairs[((r / 2) * g_.dv_pad + d) * 2 + r % 2] = real && d < p_.head_dim_v ? dout[d] : bf16{};
          }
        }
      }
    }
  }

  // Keys [j0, j0 + 64) of one (batch, kv head): K^T, K rows and V^T, zero past seq_k.
  void pack_keys(std::int64_t b, std::int64_t kv_head, std::int64_t j0, Worker& w) const {
    const AttentionIO& f = io_.forward;
    for (std::int64_t jj = 0; jj < kKeyBlock; ++jj) {
      const std::int64_t j = j0 + jj;
      float* kr = w.kr.data() + jj * d_pad_;
      float* vrow = w.v_row.data();
      if (j < p_.seq_k) {
        read_row(f.k, f.k.offset(b, kv_head, j, 0), p_.head_dim, kr);
        read_row(f.v, f.v.offset(b, kv_head, j, 0), p_.head_dim_v, vrow);
      } else {
        std::fill_n(kr, p_.head_dim, 0.0f);
        std::fill_n(vrow, p_.head_dim_v, 0.0f);
      }
      if (bf16_) {
        for (std::int64_t d = 0; d < p_.head_dim; ++d) {
          const bf16 x = float_to_bf16(kr[d]);
          w.kp[size(((d / 2) * kKeyBlock + jj) * 2 + d % 2)] = x;
          w.kpairs[size(((jj / 2) * d_pad_ + d) * 2 + jj % 2)] = x;
        }
        for (std::int64_t c = 0; c < p_.head_dim_v; ++c) w.vp[size(((c / 2) * kKeyBlock + jj) * 2 + c % 2)] = float_to_bf16(vrow[c]);
      } else {
        for (std::int64_t d = 0; d < p_.head_dim; ++d) w.kt[size(d * kKeyBlock + jj)] = kr[d];
        for (std::int64_t c = 0; c < p_.head_dim_v; ++c) w.vt[size(c * kKeyBlock + jj)] = vrow[c];
      }
    }
  }

  // acc[64][width] += x^T y in bfloat16 pairs: x is rows x 64 bfloat16 (row
  // stride 64), transposed 64 rows at a time; y_pairs the tile's rows in
  // 64-row chunks as pairs of rows per column (packed in pack_rows).
  void add_transposed_bf16(const bf16* x, std::int64_t rows, const bf16* y_pairs, std::int64_t width, float* acc,
                           Worker& w) const {
    for (std::int64_t r0 = 0, c = 0; r0 < rows; r0 += kKeyBlock, ++c) {
      const std::int64_t n = std::min(kKeyBlock, rows - r0), even = (n + 1) / 2 * 2;
      for (std::int64_t j = 0; j < kKeyBlock; ++j) {
        bf16* tj = w.pt.data() + j * kKeyBlock;
        const bf16* xj = x + r0 * kKeyBlock + j;
        for (std::int64_t r = 0; r < n; ++r) tj[r] = xj[r * kKeyBlock];
        if (even > n) tj[n] = bf16{};
      }
      kernels_.pv_bf16(w.pt.data(), kKeyBlock, even, y_pairs + c * kKeyBlock * width, width, acc);
    }
  }

  // acc[64][width] += x^T y: x is rows x 64 (row stride 64), y rows x width
  // (row stride ld); through pv_f32, 64 rows of x transposed at a time.
  void add_transposed(const float* x, std::int64_t rows, const float* y, std::int64_t ld, std::int64_t width, float* acc,
                      Worker& w) const {
    for (std::int64_t r0 = 0; r0 < rows; r0 += kKeyBlock) {
      const std::int64_t n = std::min(kKeyBlock, rows - r0);
      for (std::int64_t j = 0; j < kKeyBlock; ++j) {
        float* tj = w.t.data() + j * kKeyBlock;
        for (std::int64_t r = 0; r < n; ++r) tj[r] = x[(r0 + r) * kKeyBlock + j];
      }
      kernels_.pv_f32(w.t.data(), kKeyBlock, n, y + r0 * ld, ld, width, acc);
    }
  }

  void key_chunk(std::int64_t unit, std::int64_t chunk, Worker& w) {
    const std::int64_t first = std::min(chunk * per_chunk_, g_.key_blocks);
    const std::int64_t last = std::min(first + per_chunk_, g_.key_blocks);
    float* partial = partial_.data() + (unit * chunks_ + chunk) * rows_ * d_pad_;
    std::fill_n(partial, rows_ * d_pad_, 0.0f);
    for (std::int64_t block = first; block < last; ++block) key_block(unit, block, partial, w);
  }

  // S of tile t's rows that see a key of block j0, as the forward's in-place
  // decode path computed them (Kernels::qk_direct over those rows, the keys'
  // rows widened to float32 exactly as its loads widen them), so P meets the
  // forward's lse to the last bit; the other rows are hidden by finish_scores.
  void in_place_scores(const QueryTile& t, std::int64_t j0, std::int64_t keys, const float* qs, Worker& w) const {
    const QueryTile seen = rows_seeing_block(p_, io_.forward, t, j0);
    if (seen.queries == 0) return;
    const std::int64_t s0 = (seen.first_query - t.first_query) * g_.group, live = seen.rows();
    for (std::int64_t r = 0; r < live; ++r) std::copy_n(qs + (s0 + r) * d_pad_, p_.head_dim, w.qd.data() + r * p_.head_dim);
    kernels_.qk_direct(w.qd.data(), live, p_.head_dim, w.kr_rows.data(), DType::f32, keys, w.s.data() + s0 * kKeyBlock, Ahead{});
  }

  // Every query tile of `unit` that sees keys [j0, j0 + 64): their
  // contributions to this block's dK and dV (written at the end) and to dQ.
  void key_block(std::int64_t unit, std::int64_t block, float* partial, Worker& w) {
    const std::int64_t b = unit / p_.heads_kv, kv_head = unit % p_.heads_kv;
    const std::int64_t j0 = block * kKeyBlock, keys = std::min(kKeyBlock, p_.seq_k - j0);
    const AttentionIO& f = io_.forward;
    pack_keys(b, kv_head, j0, w);
    std::fill(w.dk.begin(), w.dk.end(), 0.0f);
    std::fill(w.dv.begin(), w.dv.end(), 0.0f);
    for (std::int64_t tile = 0; tile < g_.query_tiles; ++tile) {
      const auto [begin, end] = tile_keys_[size(unit * g_.query_tiles + tile)];
      if (end <= j0 || begin >= j0 + kKeyBlock || begin >= end) continue;  // no row of the tile sees this block
      const QueryTile t = query_tile(p_, g_, unit * g_.query_tiles + tile);
      const std::int64_t rows = t.rows(), r0 = t.first_query * g_.group;
      if (bf16_) {
        tile_bf16(unit, t, j0, keys, partial, w);
        continue;
      }
      const float* lse_hi = lse_hi_.data() + row_of(unit, r0);
      const float* lse_lo = lse_lo_.data() + row_of(unit, r0);
      const float* delta = delta_.data() + row_of(unit, r0);
      const float* qs = qs_.data() + row_of(unit, r0) * d_pad_;
      const float* dout = dout_.data() + row_of(unit, r0) * g_.dv_pad;
      // P from the recomputed scores and the forward's lse.
      if (direct_scores_) in_place_scores(t, j0, keys, qs, w);
      else kernels_.qk_f32(qs, rows, d_pad_, w.kt.data(), w.s.data(), w.row_max.data(), kKeyBlock);
      if (p_.softcap != 0) std::copy_n(w.s.begin(), rows * kKeyBlock, w.raw.begin());
      finish_scores(p_, g_, f, kernels_, t, j0, w.s.data(), w.row_max.data(), true);
      for (std::int64_t r = 0; r < rows; ++r) {
        probabilities_from_lse(kernels_, w.s.data() + r * kKeyBlock, kKeyBlock, lse_hi[r], lse_lo[r],
                               passes_[size(unit)].weight_lift);
      }
      // dP = dO V^T, then dS = P (dP - D) in place of dP, times scale and the
      // softcap's slope 1 - tanh^2 (what Q K^T is multiplied by).
      kernels_.qk_f32(dout, rows, g_.dv_pad, w.vt.data(), w.dp.data(), w.row_max.data(), kKeyBlock);
      scores_to_ds(t, rows, j0, keys, delta, w);
      float32_products(unit, t, keys, partial, w);
    }
    const int shift = passes_[size(unit)].result_shift();
    if (!store_rows(io_.dk, b, kv_head, j0, w.dk.data(), keys, p_.head_dim, d_pad_, shift)) unit_overflowed_[size(unit)] = true;
    if (!store_rows(io_.dv, b, kv_head, j0, w.dv.data(), keys, p_.head_dim_v, g_.dv_pad, shift)) unit_overflowed_[size(unit)] = true;
  }

  // One tile against one key block in bfloat16 pairs: S = Q K^T and dP = dO
  // V^T (qk_bf16), dS in float32, then dV += R(P)^T dO, dK += R(dS)^T Q and
  // dQ += R(dS) K (pv_bf16).
  void tile_bf16(std::int64_t unit, const QueryTile& t, std::int64_t j0, std::int64_t keys, float* partial, Worker& w) {
    const std::int64_t rows = t.rows(), r0 = t.first_query * g_.group;
    const float* lse_hi = lse_hi_.data() + row_of(unit, r0);
    const float* lse_lo = lse_lo_.data() + row_of(unit, r0);
    const float* delta = delta_.data() + row_of(unit, r0);
    const bf16* qb = qb_.data() + row_of(unit, r0) * qpairs_ * 2;
    const bf16* dob = dob_.data() + row_of(unit, r0) * vpairs_ * 2;
    kernels_.qk_bf16(qb, rows, qpairs_, w.kp.data(), w.s.data(), nullptr, kKeyBlock);
    if (p_.softcap != 0) {
      for (std::int64_t e = 0; e < rows * kKeyBlock; ++e) w.raw[size(e)] = w.s[size(e)] * g_.score_scale;
    }
    finish_scores(p_, g_, io_.forward, kernels_, t, j0, w.s.data(), w.row_max.data(), false);
    bool tiny = false;
    for (std::int64_t r = 0; r < rows; ++r) {
      tiny |= probabilities_from_lse(kernels_, w.s.data() + r * kKeyBlock, kKeyBlock, lse_hi[r], lse_lo[r], passes_[size(unit)].weight_lift);
    }
    kernels_.qk_bf16(dob, rows, vpairs_, w.vp.data(), w.dp.data(), nullptr, kKeyBlock);
    // bfloat16 dot products read a subnormal input as 0: a tile whose P or
    // dS holds one (a key nearly hidden, a gradient near float32's smallest
    // normal) takes the float32 products, which keep it.
    tiny |= scores_to_ds(t, rows, j0, keys, delta, w, true) < std::numeric_limits<float>::min();
    if (tiny) {
      float32_products(unit, t, keys, partial, w);
      return;
    }
    kernels_.to_bf16(w.s.data(), rows * kKeyBlock, w.pb.data());   // R(P)
    kernels_.to_bf16(w.dp.data(), rows * kKeyBlock, w.ds.data());  // R(dS)
    const std::int64_t chunk0 = (unit * g_.query_tiles + t.first_query / g_.tile_queries) * chunks_per_tile_ * kKeyBlock;
    add_transposed_bf16(w.pb.data(), rows, row_pairs_dout_.data() + chunk0 * g_.dv_pad, g_.dv_pad, w.dv.data(), w);  // dV += P^T dO
    add_transposed_bf16(w.ds.data(), rows, row_pairs_q_.data() + chunk0 * d_pad_, d_pad_, w.dk.data(), w);         // dK += dS^T Q
    kernels_.pv_bf16(w.ds.data(), rows, (keys + 1) / 2 * 2, w.kpairs.data(), d_pad_, partial + r0 * d_pad_);  // dQ += dS K
  }

  // dV += P^T dO, dK += dS^T Q and dQ += dS K in float32 from P in w.s and
  // dS in w.dp.
  void float32_products(std::int64_t unit, const QueryTile& t, std::int64_t keys, float* partial, Worker& w) const {
    const std::int64_t rows = t.rows(), r0 = t.first_query * g_.group;
    const float* qn = qn_.data() + row_of(unit, r0) * d_pad_;
    const float* dout = dout_.data() + row_of(unit, r0) * g_.dv_pad;
    add_transposed(w.s.data(), rows, dout, g_.dv_pad, g_.dv_pad, w.dv.data(), w);
    add_transposed(w.dp.data(), rows, qn, d_pad_, d_pad_, w.dk.data(), w);
    kernels_.pv_f32(w.dp.data(), rows, keys, w.kr.data(), d_pad_, d_pad_, partial + r0 * d_pad_);
  }

  // dS = P (dP - D) in place of dP (rows x 64), dbias from it, then times
  // scale and the softcap's slope 1 - tanh^2 (from the raw scores in w.raw).
  // With dropout, the forward's mask replayed from its seed: dS = P (c dP -
  // D) and P becomes P c for dV (c: 0 dropped, 1 / (1 - p) kept).
  // With `smallest`, returns the smallest |dS| that is not 0 (infinity when
  // none; what the bfloat16 products must not be fed).
  float scores_to_ds(const QueryTile& t, std::int64_t rows, std::int64_t j0, std::int64_t keys, const float* delta, Worker& w,
                     bool smallest_wanted = false) {
    float smallest = std::numeric_limits<float>::infinity();
    const float scale = static_cast<float>(p_.scale);
    const float cap2 = static_cast<float>(p_.softcap * kLog2e);
    const bool dropout = io_.forward.dropout.active();
    const float keep_scale = static_cast<float>(mask_.keep_scale());
    std::array<std::uint8_t, kKeyBlock> keep{};
    for (std::int64_t r = 0; r < rows; ++r) {
      float* pr = w.s.data() + r * kKeyBlock;
      float* dsr = w.dp.data() + r * kKeyBlock;
      if (dropout) {
        mask_.row(t.b, t.head(g_, r), t.query(g_, r), j0, keys, keep.data());
        for (std::int64_t j = 0; j < kKeyBlock; ++j) {
          const float c = j < keys && keep[size(j)] ? keep_scale : 0.0f;
          dsr[j] = pr[j] * (c * dsr[j] - delta[r]);
          pr[j] *= c;
        }
      } else {
        for (std::int64_t j = 0; j < kKeyBlock; ++j) dsr[j] = pr[j] * (dsr[j] - delta[r]);
      }
      if (with_dbias_) add_dbias(t, r, j0, keys, dsr);
      if (p_.softcap != 0) {
        const float* raw = w.raw.data() + r * kKeyBlock;
        for (std::int64_t j = 0; j < kKeyBlock; ++j) {
          const float th = std::tanh(raw[j] / cap2);
          dsr[j] *= scale * (1.0f - th * th);
        }
      } else {
        for (std::int64_t j = 0; j < kKeyBlock; ++j) dsr[j] *= scale;
      }
      if (!smallest_wanted) continue;
      for (std::int64_t j = 0; j < kKeyBlock; ++j) {
        const float a = std::fabs(dsr[j]);
        smallest = std::min(smallest, a > 0.0f ? a : std::numeric_limits<float>::infinity());
      }
    }
    return smallest;
  }

  // dbias over the bias's stored shape, summed over its broadcast axes: row r
  // of tile t, keys [j0, j0 + keys).
  void add_dbias(const QueryTile& t, std::int64_t r, std::int64_t j0, std::int64_t keys, const float* ds) {
    double* sums = dbias_.data() + dbias_row(p_, t.b, t.head(g_, r), t.query(g_, r)) + j0;
    // At the true size whatever the unit's pass (the sums cross units).
    const int shift = passes_[size(t.b * p_.heads_kv + t.head(g_, r) / g_.group)].result_shift();
    for (std::int64_t j = 0; j < keys; ++j) {
      sums[j] += shift == 0 ? static_cast<double>(ds[j]) : std::ldexp(static_cast<double>(ds[j]), shift);
    }
  }

  // dQ of one (batch, kv head): its chunks' partial sums in chunk order.
  void write_dq(std::int64_t unit) {
    const std::int64_t b = unit / p_.heads_kv, kv_head = unit % p_.heads_kv;
    const float* partials = partial_.data() + unit * chunks_ * rows_ * d_pad_;
    const int shift = passes_[size(unit)].result_shift();  // dQ is summed from dS
    for (std::int64_t r = 0; r < rows_; ++r) {
      const std::int64_t h = kv_head * g_.group + r % g_.group, i = r / g_.group;
      for (std::int64_t d = 0; d < p_.head_dim; ++d) {
        float sum = 0;
        for (std::int64_t c = 0; c < chunks_; ++c) sum += partials[(c * rows_ + r) * d_pad_ + d];
        if (!std::isfinite(sum)) unit_overflowed_[size(unit)] = true;
        store_float(io_.dq, io_.dq.offset(b, h, i, d), shift == 0 ? sum : std::ldexp(sum, shift));
      }
    }
  }

  // dsinks_h = -sum over the head's rows of exp(sink - lse) D.
  void write_dsinks() {
    for (std::int64_t h = 0; h < p_.heads_q; ++h) {
      const double sink = io_.forward.sinks[h];
      double sum = 0;
      for (std::int64_t b = 0; b < p_.batch; ++b) {
        const std::int64_t unit = b * p_.heads_kv + h / g_.group;
        for (std::int64_t i = 0; i < p_.seq_q; ++i) {
          const std::int64_t at = row_of(unit, i * g_.group + h % g_.group);
          const double lse = io_.forward.lse[(b * p_.heads_q + h) * p_.seq_q + i];
          // D's dO was scaled by its unit's pass, P_sink never lifted
          sum += std::ldexp(std::exp(sink - lse) * delta64_[size(at)], passes_[size(unit)].dout_shift);
        }
      }
      io_.dsinks[h] = -sum;
    }
  }

  Problem p_;
  BackwardIO io_;
  const Kernels& kernels_;
  Geometry g_;
  DropoutMask mask_;  // the forward's dropout, replayed (AttentionIO::dropout)
  int threads_ = 1;
  std::int64_t d_pad_ = 16, units_ = 0, rows_ = 0, chunks_ = 1, per_chunk_ = 0;
  bool with_dbias_ = false;
  bool bf16_ = false;                      // the bfloat16 pairs path
  std::int64_t qpairs_ = 1, vpairs_ = 1;   // bfloat16 pairs along head_dim and head_dim_v
  LineVector<bf16> qb_, dob_;              // Q and dO in bfloat16 [rows][pairs * 2]
  LineVector<bf16> row_pairs_q_, row_pairs_dout_;  // per tile and 64-row chunk: [32][width][2]
  std::int64_t chunks_per_tile_ = 1;
  std::vector<GradientPass> passes_;       // each (batch, kv head)'s scaling of dO and P in this pass
  std::unique_ptr<std::atomic<bool>[]> unit_overflowed_;  // a result of the unit's pass is not finite
  std::atomic<bool> dbias_overflowed_{false};
  LineVector<float> qs_, qn_, dout_, delta_, lse_hi_, lse_lo_, partial_;
  std::vector<double> dbias_, delta64_;  // D in float64 for dsinks
  std::vector<std::pair<std::int64_t, std::int64_t>> tile_keys_;
  std::vector<Worker> workers_;
  bool direct_scores_ = false;  // S recomputed by the in-place kernel, as the forward's
};

}  // namespace

std::unique_ptr<BackwardPlan> make_flash_backward_plan(const Problem& p, const BackwardIO& io,
                                                       const RunOptions& options, std::int64_t max_tile_rows,
                                                       bool forward_in_place) {
  return std::make_unique<FlashBackwardPlan>(p, io, options, max_tile_rows, forward_in_place);
}

}  // namespace attn::cpu
