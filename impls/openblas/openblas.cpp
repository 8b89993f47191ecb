// The openblas backend: cblas_sgemm for Q K^T and P V over blocks of query
// rows, a vectorised softmax between them; its backward the five GEMMs of
// the textbook formulation over the same row blocks. 16-bit inputs are widened to
// float32 first (OpenBLAS 0.3.21's sbgemm has no fast kernel on the Haswell
// core this machine must use).
#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "attnbench/backend.hpp"
#include "attnbench/per_entry.hpp"
#include "attnbench/value_range.hpp"
#include "core/thread_pool.hpp"
#include "attnbench/error.hpp"
#include "impls/cpu_kernels/gradients.hpp"
#include "impls/cpu_kernels/kernels.hpp"

namespace attn {

namespace {

constexpr std::int64_t kRowBlock = 256;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.4426950408889634f;


// Copies [rows, cols] of head (b, h) into a dense float32 matrix.
void widen(const TensorView& v, std::int64_t b, std::int64_t h, std::int64_t rows, std::int64_t cols, float* out) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) out[r * cols + c] = load_float(v, v.offset(b, h, r, c));
}
// Rows [first, first + rows) of head (b, h).
void widen(const TensorView& v, std::int64_t b, std::int64_t h, std::int64_t first, std::int64_t rows, std::int64_t cols,
           float* out) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) out[r * cols + c] = load_float(v, v.offset(b, h, first + r, c));
}

// Turns row i of head (b, h)'s Q K^T (unscaled, seq_k of them) into scores
// in the log2 domain, hidden keys -inf, and returns their maximum: what the
// forward exponentiates and the backward recomputes bit for bit. tanh_out
// (when not null) receives tanh(s / cap) per key for the softcap's slope.
float scores_row(const Problem& p, const AttentionIO& io, std::int64_t b, std::int64_t h, std::int64_t i, float* row,
                 float* tanh_out) {
  const SequenceMap::Row place = io.sequences(p).entry_row(b, i);  // causal, window, kv_len
  const std::int64_t begin = place.keys.lo, end = place.keys.hi;
  const float cap = static_cast<float>(p.softcap);
  const float slope = io.alibi_slopes ? io.alibi_slopes[h] : 0.0f;
  // scale * log2(e) rounded once (in double, then to float): rounding the
  // scale first and the product again scales every score by up to 2 ulps,
  // which large logits turn into 5x the error of a plain implementation
  // (found by attn fuzz --seed 6).
  const float scale = static_cast<float>(p.scale * 1.4426950408889634);
  float m = kNegInf;
  for (std::int64_t j = 0; j < p.seq_k; ++j) {
    const bool shown = j >= begin && j < end;
    float s = shown ? row[j] * scale : kNegInf;
    // Softcap on the natural-log score, then ALiBi, then the bias (log2 domain,
    // each joined with one rounding).
    if (shown && cap != 0) {
      const float natural = s / kLog2e;
      if (tanh_out) tanh_out[j] = std::tanh(natural / cap);
      s = softcapped(natural, cap) * kLog2e;
    }
    if (shown && io.alibi_slopes) s = std::fma(alibi_term(slope, place.diag, j), kLog2e, s);
    if (shown && !io.mask.empty() && io.mask.at(b, h, i, j) == 0) s = kNegInf;
    if (shown && !io.bias.empty()) {
      const float bias = load_float(io.bias, io.bias.offset(b, h, i, j));
      s = std::isinf(bias) && bias < 0 ? kNegInf : std::fma(bias, kLog2e, s);
    }
    row[j] = s;
    m = std::max(m, s);
  }
  return m;
}

// OpenBLAS's own threads split a GEMM by the thread count, and its kernels
// give other bits for other splits (measured: 0.3.21's sgemm differs from one
// thread at two and at eight in up to 75% of the elements; docs/results/
// 2026-12-04-openblas-threads-amd-epyc.md). So every sgemm call here runs on
// one OpenBLAS thread, on blocks fixed by the problem, and attnbench's pool
// runs the blocks: the results are the same bits at every thread count. The
// guard puts back the thread count it found (NumPy in the same process uses it).
class OneOpenBlasThread {
 public:
  OneOpenBlasThread() : previous_(openblas_get_num_threads()) { openblas_set_num_threads(1); }
  ~OneOpenBlasThread() { openblas_set_num_threads(previous_); }
  OneOpenBlasThread(const OneOpenBlasThread&) = delete;
  OneOpenBlasThread& operator=(const OneOpenBlasThread&) = delete;

 private:
  int previous_;
};

class OpenBlasPlan final : public Plan {
 public:
  OpenBlasPlan(const Problem& p, const AttentionIO& io, const RunOptions& options)
      : p_(p), io_(io), kernels_(cpu::best_kernels()), pool_(ThreadPool::get(resolve_threads(options.threads))) {
    const std::int64_t rows = std::min(kRowBlock, p.seq_q);
    auto d = [](std::int64_t x) { return static_cast<double>(x); };
    const double workers = d(pool_.size());
    require_workspace(4.0 * (d(p.seq_k) * d(p.head_dim + p.head_dim_v) +
                             workers * d(rows) * (d(p.head_dim) + d(std::max<std::int64_t>(p.seq_k, 1)) + d(p.head_dim_v) + 2.0)),
                      "openblas's float32 copies of a kv head, and per thread a row block's queries and scores");
    k_.assign(static_cast<std::size_t>(p.seq_k * p.head_dim), 0.0f);
    v_.assign(static_cast<std::size_t>(p.seq_k * p.head_dim_v), 0.0f);
    scratch_.resize(static_cast<std::size_t>(pool_.size()));
    for (Scratch& w : scratch_) {
      w.q.assign(static_cast<std::size_t>(rows * p.head_dim), 0.0f);
      w.s.assign(static_cast<std::size_t>(rows * std::max<std::int64_t>(p.seq_k, 1)), 0.0f);
      w.o.assign(static_cast<std::size_t>(rows * p.head_dim_v), 0.0f);
      w.m.assign(static_cast<std::size_t>(rows), 0.0f);
      w.l.assign(static_cast<std::size_t>(rows), 0.0f);
    }
  }

  void run() override {
    const OneOpenBlasThread one;
    const std::int64_t blocks = (p_.seq_q + kRowBlock - 1) / kRowBlock, group = p_.group_size();
    for (std::int64_t b = 0; b < p_.batch; ++b) {
      for (std::int64_t g = 0; g < p_.heads_kv; ++g) {
        widen(io_.k, b, g, p_.seq_k, p_.head_dim, k_.data());
        widen(io_.v, b, g, p_.seq_k, p_.head_dim_v, v_.data());
        // Each (query head of the group, row block) on its own.
        pool_.parallel_for(group * blocks, [&](std::int64_t task, int worker) {
          block(b, g * group + task / blocks, (task % blocks) * kRowBlock, scratch_[static_cast<std::size_t>(worker)]);
        });
      }
    }
  }
  bool has_lse() const override { return true; }
  std::size_t workspace_bytes() const override {
    std::size_t floats = k_.size() + v_.size();
    for (const Scratch& w : scratch_) floats += w.q.size() + w.s.size() + w.o.size() + w.m.size() + w.l.size();
    return floats * sizeof(float);
  }

 private:
  struct Scratch {
    std::vector<float> q, s, o, m, l;
  };

  void block(std::int64_t b, std::int64_t h, std::int64_t i0, Scratch& w) {
    const std::int64_t n = p_.seq_k, rows = std::min(kRowBlock, p_.seq_q - i0);
    widen(io_.q, b, h, i0, rows, p_.head_dim, w.q.data());
    auto scores = [&] {
      if (n == 0) return;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(n),
                  static_cast<int>(p_.head_dim), 1.0f, w.q.data(), static_cast<int>(p_.head_dim), k_.data(),
                  static_cast<int>(p_.head_dim), 0.0f, w.s.data(), static_cast<int>(n));
    };
    scores();
    // shift 0 first; a row block whose sums of weights times V overflowed
    // is redone with the weights scaled down (Kernels::exp2_sum).
    int shift = 0;
    for (;;) {
      for (std::int64_t r = 0; r < rows; ++r) softmax_row(b, h, i0 + r, r, shift, w);
      std::fill(w.o.begin(), w.o.end(), 0.0f);
      if (n > 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), static_cast<int>(p_.head_dim_v),
                    static_cast<int>(n), 1.0f, w.s.data(), static_cast<int>(n), v_.data(), static_cast<int>(p_.head_dim_v),
                    0.0f, w.o.data(), static_cast<int>(p_.head_dim_v));
      }
      if (shift != 0 || shift_ == 0 ||
          std::all_of(w.o.begin(), w.o.begin() + rows * p_.head_dim_v, [](float x) { return std::isfinite(x); })) {
        break;
      }
      shift = shift_;
      scores();
    }
    write(b, h, i0, rows, shift, w);
  }

  // Scores of one row in the log2 domain, hidden keys -inf, then exp2 and sum.
  void softmax_row(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t r, int shift, Scratch& w) {
    float* row = w.s.data() + r * p_.seq_k;
    const float m = scores_row(p_, io_, b, h, i, row, nullptr);
    w.m[static_cast<std::size_t>(r)] = m;
    if (m == kNegInf) {
      std::fill_n(row, p_.seq_k, 0.0f);
      w.l[static_cast<std::size_t>(r)] = 0;
      return;
    }
    w.l[static_cast<std::size_t>(r)] = kernels_.exp2_sum(row, p_.seq_k, 1.0f, m, shift);
  }

  void write(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows, int shift, const Scratch& w) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const float l = w.l[static_cast<std::size_t>(r)];
      float inv = l > 0 ? 1.0f / l : 0.0f;
      // log2 of the sum of exp2 of the row's scores (the weights were 2^(x - m - shift)).
      double total2 = l > 0 ? static_cast<double>(w.m[static_cast<std::size_t>(r)]) + std::log2(static_cast<double>(l)) + shift
                            : -std::numeric_limits<double>::infinity();
      if (io_.sinks) {  // the sink's share of the denominator
        const SinkShare share = with_sink(total2, static_cast<double>(io_.sinks[h]) * 1.4426950408889634);
        inv = static_cast<float>(static_cast<double>(inv) * share.keep);
        total2 = share.lse2;
      }
      for (std::int64_t c = 0; c < p_.head_dim_v; ++c) {
        const float value = w.o[static_cast<std::size_t>(r * p_.head_dim_v + c)] * inv;
        store_float(io_.out, io_.out.offset(b, h, i0 + r, c), value);
      }
      if (io_.lse) io_.lse[(b * p_.heads_q + h) * p_.seq_q + i0 + r] = std::isinf(total2) ? total2 : total2 * 0.6931471805599453;
    }
  }

  Problem p_;
  AttentionIO io_;
  const cpu::Kernels& kernels_;
  ThreadPool& pool_;
  std::vector<float> k_, v_;
  std::vector<Scratch> scratch_;  // one per worker
  int shift_ = cpu::weight_shift(p_.seq_k);  // for a row block that overflowed
};

// The backward pass in the GEMM formulation: per head, row blocks of P and dS
// materialised (seq_k wide) and five sgemm calls, S = Q K^T, dP = dO V^T,
// dV += P^T dO, dK += dS^T Q, dQ = dS K; P recomputed from the forward's
// scores (scores_row, bit for bit) and lse. Per (batch, kv head) the (query
// head, row block) items are cut into chunks fixed by the problem; each chunk
// sums its items' dK and dV in order, on one worker, and the chunks' sums are
// added in chunk order: the same bits at every thread count. With a bias
// gradient, whose sums rows of several chunks would share, one chunk.
class OpenBlasBackwardPlan final : public BackwardPlan {
 public:
  OpenBlasBackwardPlan(const Problem& p, const BackwardIO& io, const RunOptions& options)
      : p_(p), io_(io), kernels_(cpu::best_kernels()), pool_(ThreadPool::get(resolve_threads(options.threads))) {
    if (!io.forward.lse) throw Unsupported("openblas's backward needs the forward's lse");
    rows_ = std::min(kRowBlock, std::max<std::int64_t>(p.seq_q, 1));
    blocks_ = (p.seq_q + kRowBlock - 1) / kRowBlock;
    items_ = p.group_size() * blocks_;
    auto d = [](std::int64_t x) { return static_cast<double>(x); };
    const double n = d(std::max<std::int64_t>(p.seq_k, 1)), kv = n * d(p.head_dim + p.head_dim_v);
    // Chunks: at most kChunks, none when there is nothing to split, one with
    // a bias gradient, and no more than 256 MiB of partial sums.
    chunks_ = io.dbias.empty() ? std::clamp<std::int64_t>(std::min<std::int64_t>(items_, kChunks), 1, kChunks) : 1;
    chunks_ = std::max<std::int64_t>(1, std::min<std::int64_t>(chunks_, static_cast<std::int64_t>(double(1 << 26) / kv)));
    const double workers = d(pool_.size());
    require_workspace(4.0 * (kv * (1.0 + d(chunks_)) + workers * d(rows_) * (3.0 * n + 2.0 * d(p.head_dim) + d(p.head_dim_v) + 3.0)) +
                          8.0 * (io.dbias.empty() ? 0.0 : d(p.broadcast_elements(p.bias))) + 8.0 * d(items_),
                      "openblas's float32 copies of a kv head and its gradients, per chunk its partial dK and dV, and "
                      "per thread a row block's P and dS");
    auto sized = [](std::vector<float>& v, double count) { v.assign(static_cast<std::size_t>(count), 0.0f); };
    sized(k_, n * d(p.head_dim));
    sized(v_, n * d(p.head_dim_v));
    sized(dk_, d(chunks_) * n * d(p.head_dim));
    sized(dv_, d(chunks_) * n * d(p.head_dim_v));
    scratch_.resize(static_cast<std::size_t>(pool_.size()));
    for (Scratch& w : scratch_) {
      sized(w.q, d(rows_) * d(p.head_dim));
      sized(w.dout, d(rows_) * d(p.head_dim_v));
      sized(w.out, d(p.head_dim_v));
      sized(w.prob, d(rows_) * n);
      sized(w.ds, d(rows_) * n);
      sized(w.tanh, p.softcap != 0 ? d(rows_) * n : 0.0);
      sized(w.dq, d(rows_) * d(p.head_dim));
      sized(w.hi, d(rows_));
      sized(w.lo, d(rows_));
      w.delta.assign(static_cast<std::size_t>(rows_), 0.0);
    }
    sink_sums_.assign(static_cast<std::size_t>(items_), 0.0);
    dbias_.assign(io.dbias.empty() ? 0 : static_cast<std::size_t>(p.broadcast_elements(p.bias)), 0.0);
  }

  void run() override {
    const OneOpenBlasThread one;
    // dO scaled down, P up, and the pass redone where it overflowed (impls/cpu_kernels/gradients.hpp)
    cpu::run_gradient_passes(p_, io_, [&](const cpu::GradientPass& pass) {
      pass_ = pass;
      overflowed_ = false;
      this->pass();
      return overflowed_.load();
    });
  }

 private:
  static constexpr std::int64_t kChunks = 8;

  struct Scratch {
    std::vector<float> q, dout, out, prob, ds, tanh, dq, hi, lo;
    std::vector<double> delta;
  };

  void pass() {
    std::fill(dbias_.begin(), dbias_.end(), 0.0);
    if (io_.dsinks) std::fill_n(io_.dsinks, p_.heads_q, 0.0);
    const std::size_t dk_size = static_cast<std::size_t>(p_.seq_k * p_.head_dim);
    const std::size_t dv_size = static_cast<std::size_t>(p_.seq_k * p_.head_dim_v);
    for (std::int64_t b = 0; b < p_.batch; ++b) {
      for (std::int64_t g = 0; g < p_.heads_kv; ++g) {
        widen(io_.forward.k, b, g, p_.seq_k, p_.head_dim, k_.data());
        widen(io_.forward.v, b, g, p_.seq_k, p_.head_dim_v, v_.data());
        std::fill(dk_.begin(), dk_.end(), 0.0f);
        std::fill(dv_.begin(), dv_.end(), 0.0f);
        pool_.parallel_for(chunks_, [&](std::int64_t chunk, int worker) {
          float* dk = dk_.data() + static_cast<std::size_t>(chunk) * dk_size;
          float* dv = dv_.data() + static_cast<std::size_t>(chunk) * dv_size;
          for (std::int64_t t = chunk * items_ / chunks_; t < (chunk + 1) * items_ / chunks_; ++t) {
            item(b, g * p_.group_size() + t / blocks_, (t % blocks_) * kRowBlock, t, dk, dv,
                 scratch_[static_cast<std::size_t>(worker)]);
          }
        });
        // The chunks' sums in chunk order, into the first.
        for (std::int64_t c = 1; c < chunks_; ++c) {
          for (std::size_t e = 0; e < dk_size; ++e) dk_[e] += dk_[static_cast<std::size_t>(c) * dk_size + e];
          for (std::size_t e = 0; e < dv_size; ++e) dv_[e] += dv_[static_cast<std::size_t>(c) * dv_size + e];
        }
        const int shift = pass_.result_shift();
        if (!cpu::store_rows(io_.dk, b, g, 0, dk_.data(), p_.seq_k, p_.head_dim, p_.head_dim, shift)) overflowed_ = true;
        if (!cpu::store_rows(io_.dv, b, g, 0, dv_.data(), p_.seq_k, p_.head_dim_v, p_.head_dim_v, shift)) overflowed_ = true;
        if (io_.dsinks) {
          for (std::int64_t t = 0; t < items_; ++t) io_.dsinks[g * p_.group_size() + t / blocks_] -= sink_sums_[static_cast<std::size_t>(t)];
        }
      }
    }
    if (!dbias_.empty() && !cpu::store_dbias(p_, io_.dbias, dbias_, pass_.result_shift())) overflowed_ = true;
    if (io_.dsinks) {  // from D, whose dO was scaled; P_sink is never lifted
      for (std::int64_t h = 0; h < p_.heads_q; ++h) io_.dsinks[h] = std::ldexp(io_.dsinks[h], pass_.dout_shift);
    }
  }

  // One row block of one query head: its share of dK and dV into dk and dv,
  // its rows of dQ, and (item t) its rows' share of dsinks.
  void item(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t t, float* dk, float* dv, Scratch& w) {
    const AttentionIO& f = io_.forward;
    const TensorView out{f.out.data, f.out.dtype, f.out.shape, f.out.strides};
    const std::int64_t rows = std::min(kRowBlock, p_.seq_q - i0), n = p_.seq_k;
    widen(f.q, b, h, i0, rows, p_.head_dim, w.q.data());
    widen(io_.dout, b, h, i0, rows, p_.head_dim_v, w.dout.data());
    double sink_sum = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      float* dout = w.dout.data() + r * p_.head_dim_v;
      if (pass_.dout_shift > 0) {
        std::transform(dout, dout + p_.head_dim_v, dout, [&](float x) { return std::ldexp(x, -pass_.dout_shift); });
      }
      widen(out, b, h, i0 + r, 1, p_.head_dim_v, w.out.data());
      double delta = 0;
      for (std::int64_t c = 0; c < p_.head_dim_v; ++c) delta += static_cast<double>(dout[c]) * static_cast<double>(w.out[static_cast<std::size_t>(c)]);
      w.delta[static_cast<std::size_t>(r)] = delta;
      const double lse = f.lse[(b * p_.heads_q + h) * p_.seq_q + i0 + r];
      cpu::split_lse2(lse, w.hi[static_cast<std::size_t>(r)], w.lo[static_cast<std::size_t>(r)]);
      if (f.sinks) sink_sum += std::exp(static_cast<double>(f.sinks[h]) - lse) * delta;
    }
    sink_sums_[static_cast<std::size_t>(t)] = sink_sum;
    const int d = static_cast<int>(p_.head_dim), dvi = static_cast<int>(p_.head_dim_v), ni = static_cast<int>(n);
    const int ri = static_cast<int>(rows);
    if (n == 0) {
      std::fill_n(w.dq.begin(), rows * p_.head_dim, 0.0f);
      write_dq(b, h, i0, rows, w);
      return;
    }
    const float scale = static_cast<float>(p_.scale);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ri, ni, d, 1.0f, w.q.data(), d, k_.data(), d, 0.0f, w.prob.data(), ni);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ri, ni, dvi, 1.0f, w.dout.data(), dvi, v_.data(), dvi, 0.0f, w.ds.data(), ni);
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t i = i0 + r;
      float* prob = w.prob.data() + r * n;
      float* ds = w.ds.data() + r * n;
      float* th = w.tanh.empty() ? nullptr : w.tanh.data() + r * n;
      scores_row(p_, f, b, h, i, prob, th);
      cpu::probabilities_from_lse(kernels_, prob, n, w.hi[static_cast<std::size_t>(r)], w.lo[static_cast<std::size_t>(r)],
                                  pass_.weight_lift);
      const float delta = static_cast<float>(w.delta[static_cast<std::size_t>(r)]);
      for (std::int64_t j = 0; j < n; ++j) ds[j] = prob[j] * (ds[j] - delta);
      if (!dbias_.empty()) {  // one chunk: the items in order
        double* sums = dbias_.data() + cpu::dbias_row(p_, b, h, i);
        for (std::int64_t j = 0; j < n; ++j) sums[j] += static_cast<double>(ds[j]);
      }
      if (th) {
        for (std::int64_t j = 0; j < n; ++j) ds[j] *= scale * (1.0f - th[j] * th[j]);
      } else {
        for (std::int64_t j = 0; j < n; ++j) ds[j] *= scale;
      }
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ni, dvi, ri, 1.0f, w.prob.data(), ni, w.dout.data(), dvi, 1.0f, dv, dvi);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ni, d, ri, 1.0f, w.ds.data(), ni, w.q.data(), d, 1.0f, dk, d);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ri, d, ni, 1.0f, w.ds.data(), ni, k_.data(), d, 0.0f, w.dq.data(), d);
    write_dq(b, h, i0, rows, w);
  }

  void write_dq(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows, const Scratch& w) {
    if (!cpu::store_rows(io_.dq, b, h, i0, w.dq.data(), rows, p_.head_dim, p_.head_dim, pass_.result_shift())) overflowed_ = true;
  }

  Problem p_;
  BackwardIO io_;
  const cpu::Kernels& kernels_;
  ThreadPool& pool_;
  cpu::GradientPass pass_;  // this pass's scaling of dO and P
  std::atomic<bool> overflowed_ = false;
  std::int64_t rows_ = 1, blocks_ = 0, items_ = 0, chunks_ = 1;
  std::vector<float> k_, v_, dk_, dv_;  // dk_ and dv_: chunks_ partial sums, the first their total
  std::vector<Scratch> scratch_;        // one per worker
  std::vector<double> sink_sums_;       // per item of a (batch, kv head)
  std::vector<double> dbias_;
};

std::string trim(std::string text) {
  text.erase(0, text.find_first_not_of(' '));
  text.erase(text.find_last_not_of(' ') + 1);
  return text;
}

class OpenBlasBackend final : public Backend {
 public:
  OpenBlasBackend()
      : description_(fmt::format("cblas_sgemm for Q K^T and P V, vectorised softmax; {} with its {} kernels",
                                 trim(OPENBLAS_VERSION), openblas_get_corename())) {}
  std::string_view name() const override { return "openblas"; }
  std::string_view description() const override { return description_; }
  // Not float64: it multiplies with sgemm (16-bit inputs are widened to
  // float32). Not paged KV: sgemm needs each head's K and V contiguous, and
  // gathering the pages on every call is not what a paged kernel does.
  Capabilities capabilities() const override {
    return {.dtypes = dtype_bit(DType::f32) | dtype_bit(DType::f16) | dtype_bit(DType::bf16),
            .features = kFeatureWindow | kFeatureSoftcap | kFeatureAlibi | kFeatureSinks | kFeatureRagged,
            .lse = true,
            .backward = true};
  }
  Status supports(const Problem&) const override { return Status::yes(); }
  std::unique_ptr<Plan> prepare(const Problem& p, const AttentionIO& io, const RunOptions& options) const override {
    // Scores in float32: values beyond its range are computed as an equivalent case that fits, or refused.
    return prepare_in_float32_range(p, io, [&](const Problem& fit, const AttentionIO& fit_io) -> std::unique_ptr<Plan> {
      if (fit.ragged) return plan_per_entry(fit, fit_io, options, *this);  // each entry a dense problem, in place
      return std::make_unique<OpenBlasPlan>(fit, fit_io, options);
    });
  }
  std::unique_ptr<BackwardPlan> prepare_backward(const Problem& p, const BackwardIO& io, const RunOptions& options) const override {
    return prepare_backward_in_float32_range(p, io, [&](const Problem& fit, const BackwardIO& fit_io) -> std::unique_ptr<BackwardPlan> {
      if (fit.ragged) return plan_backward_per_entry(fit, fit_io, options, *this);
      return std::make_unique<OpenBlasBackwardPlan>(fit, fit_io, options);
    });
  }

 private:
  std::string description_;
};

}  // namespace

std::unique_ptr<Backend> make_openblas_backend() { return std::make_unique<OpenBlasBackend>(); }

}  // namespace attn
