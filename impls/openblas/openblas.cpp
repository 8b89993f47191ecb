// The openblas backend: cblas_sgemm for Q K^T and P V over blocks of query
// rows, a vectorised softmax between them. 16-bit inputs are widened to
// float32 first (OpenBLAS 0.3.21's sbgemm has no fast kernel on the Haswell
// core this machine must use).
#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attnbench/backend.hpp"
#include "attnbench/per_entry.hpp"
#include "attnbench/value_range.hpp"
#include "core/thread_pool.hpp"
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

class OpenBlasPlan final : public Plan {
 public:
  OpenBlasPlan(const Problem& p, const AttentionIO& io, const RunOptions& options)
      : p_(p), io_(io), kernels_(cpu::best_kernels()) {
    threads_ = resolve_threads(options.threads);
    const std::int64_t rows = std::min(kRowBlock, p.seq_q);
    auto d = [](std::int64_t x) { return static_cast<double>(x); };
    require_workspace(4.0 * (d(p.seq_q) * d(p.head_dim) + d(p.seq_k) * d(p.head_dim + p.head_dim_v) +
                             d(rows) * (d(std::max<std::int64_t>(p.seq_k, 1)) + d(p.head_dim_v))),
                      "openblas's float32 copies of a head and a row block's scores");
    q_.assign(static_cast<std::size_t>(p.seq_q * p.head_dim), 0.0f);
    k_.assign(static_cast<std::size_t>(p.seq_k * p.head_dim), 0.0f);
    v_.assign(static_cast<std::size_t>(p.seq_k * p.head_dim_v), 0.0f);
    s_.assign(static_cast<std::size_t>(rows * std::max<std::int64_t>(p.seq_k, 1)), 0.0f);
    o_.assign(static_cast<std::size_t>(rows * p.head_dim_v), 0.0f);
    m_.assign(static_cast<std::size_t>(rows), 0.0f);
    l_.assign(static_cast<std::size_t>(rows), 0.0f);
  }

  void run() override {
    openblas_set_num_threads(threads_);
    for (std::int64_t b = 0; b < p_.batch; ++b) {
      for (std::int64_t g = 0; g < p_.heads_kv; ++g) {
        widen(io_.k, b, g, p_.seq_k, p_.head_dim, k_.data());
        widen(io_.v, b, g, p_.seq_k, p_.head_dim_v, v_.data());
        for (std::int64_t h = g * p_.group_size(); h < (g + 1) * p_.group_size(); ++h) head(b, h);
      }
    }
  }
  bool has_lse() const override { return true; }
  std::size_t workspace_bytes() const override {
    return (q_.size() + k_.size() + v_.size() + s_.size() + o_.size() + m_.size() + l_.size()) * sizeof(float);
  }

 private:
  void head(std::int64_t b, std::int64_t h) {
    widen(io_.q, b, h, p_.seq_q, p_.head_dim, q_.data());
    const std::int64_t n = p_.seq_k;
    for (std::int64_t i0 = 0; i0 < p_.seq_q; i0 += kRowBlock) {
      const std::int64_t rows = std::min(kRowBlock, p_.seq_q - i0);
      if (n > 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(n),
                    static_cast<int>(p_.head_dim), 1.0f, q_.data() + i0 * p_.head_dim, static_cast<int>(p_.head_dim),
                    k_.data(), static_cast<int>(p_.head_dim), 0.0f, s_.data(), static_cast<int>(n));
      }
      // shift 0 first; a row block whose sums of weights times V overflowed
      // is redone with the weights scaled down (Kernels::exp2_sum).
      int shift = 0;
      for (;;) {
        for (std::int64_t r = 0; r < rows; ++r) softmax_row(b, h, i0 + r, r, shift);
        std::fill(o_.begin(), o_.end(), 0.0f);
        if (n > 0) {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), static_cast<int>(p_.head_dim_v),
                      static_cast<int>(n), 1.0f, s_.data(), static_cast<int>(n), v_.data(),
                      static_cast<int>(p_.head_dim_v), 0.0f, o_.data(), static_cast<int>(p_.head_dim_v));
        }
        if (shift != 0 || shift_ == 0 ||
            std::all_of(o_.begin(), o_.begin() + rows * p_.head_dim_v, [](float x) { return std::isfinite(x); })) {
          break;
        }
        shift = shift_;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(n),
                    static_cast<int>(p_.head_dim), 1.0f, q_.data() + i0 * p_.head_dim, static_cast<int>(p_.head_dim),
                    k_.data(), static_cast<int>(p_.head_dim), 0.0f, s_.data(), static_cast<int>(n));
      }
      write(b, h, i0, rows, shift);
    }
  }

  // Scores of one row in the log2 domain, hidden keys -inf, then exp2 and sum.
  void softmax_row(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t r, int shift) {
    float* row = s_.data() + r * p_.seq_k;
    const SequenceMap::Row place = io_.sequences(p_).entry_row(b, i);  // causal, window, kv_len
    const std::int64_t begin = place.keys.lo, end = place.keys.hi;
    const float cap = static_cast<float>(p_.softcap);
    const float slope = io_.alibi_slopes ? io_.alibi_slopes[h] : 0.0f;
    // scale * log2(e) rounded once (in double, then to float): rounding the
    // scale first and the product again scales every score by up to 2 ulps,
    // which large logits turn into 5x the error of a plain implementation
    // (found by attn fuzz --seed 6).
    const float scale = static_cast<float>(p_.scale * 1.4426950408889634);
    float m = kNegInf;
    for (std::int64_t j = 0; j < p_.seq_k; ++j) {
      const bool shown = j >= begin && j < end;
      float s = shown ? row[j] * scale : kNegInf;
      // Softcap on the natural-log score, then ALiBi, then the bias (log2 domain).
      if (shown && cap != 0) s = softcapped(s / kLog2e, cap) * kLog2e;
      if (shown && io_.alibi_slopes) s += alibi_term(slope, place.diag, j) * kLog2e;
      if (shown && !io_.mask.empty() && io_.mask.at(b, h, i, j) == 0) s = kNegInf;
      if (shown && !io_.bias.empty()) {
        const float bias = load_float(io_.bias, io_.bias.offset(b, h, i, j));
        s = std::isinf(bias) && bias < 0 ? kNegInf : s + bias * kLog2e;
      }
      row[j] = s;
      m = std::max(m, s);
    }
    m_[static_cast<std::size_t>(r)] = m;
    if (m == kNegInf) {
      std::fill_n(row, p_.seq_k, 0.0f);
      l_[static_cast<std::size_t>(r)] = 0;
      return;
    }
    l_[static_cast<std::size_t>(r)] = kernels_.exp2_sum(row, p_.seq_k, 1.0f, m, shift);
  }

  void write(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows, int shift) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const float l = l_[static_cast<std::size_t>(r)];
      float inv = l > 0 ? 1.0f / l : 0.0f;
      // log2 of the sum of exp2 of the row's scores (the weights were 2^(x - m - shift)).
      double total2 = l > 0 ? static_cast<double>(m_[static_cast<std::size_t>(r)]) + std::log2(static_cast<double>(l)) + shift
                            : -std::numeric_limits<double>::infinity();
      if (io_.sinks) {  // the sink's share of the denominator
        const SinkShare share = with_sink(total2, static_cast<double>(io_.sinks[h]) * 1.4426950408889634);
        inv = static_cast<float>(static_cast<double>(inv) * share.keep);
        total2 = share.lse2;
      }
      for (std::int64_t c = 0; c < p_.head_dim_v; ++c) {
        const float value = o_[static_cast<std::size_t>(r * p_.head_dim_v + c)] * inv;
        store_float(io_.out, io_.out.offset(b, h, i0 + r, c), value);
      }
      if (io_.lse) io_.lse[(b * p_.heads_q + h) * p_.seq_q + i0 + r] = std::isinf(total2) ? total2 : total2 * 0.6931471805599453;
    }
  }

  Problem p_;
  AttentionIO io_;
  const cpu::Kernels& kernels_;
  int threads_ = 1;
  std::vector<float> q_, k_, v_, s_, o_, m_, l_;
  int shift_ = cpu::weight_shift(p_.seq_k);  // for a row block that overflowed
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
    return {dtype_bit(DType::f32) | dtype_bit(DType::f16) | dtype_bit(DType::bf16), kFeatureWindow | kFeatureSoftcap | kFeatureAlibi | kFeatureSinks | kFeatureRagged, true};
  }
  Status supports(const Problem&) const override { return Status::yes(); }
  std::unique_ptr<Plan> prepare(const Problem& p, const AttentionIO& io, const RunOptions& options) const override {
    require_float32_scores(p, io);  // scores in float32: values beyond its range are refused, not computed wrong
    if (p.ragged) return plan_per_entry(p, io, options, *this);
    return std::make_unique<OpenBlasPlan>(p, io, options);
  }

 private:
  std::string description_;
};

}  // namespace

std::unique_ptr<Backend> make_openblas_backend() { return std::make_unique<OpenBlasBackend>(); }

}  // namespace attn
