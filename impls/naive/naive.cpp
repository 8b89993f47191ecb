#include "impls/naive/naive.hpp"

#include "attnbench/dropout.hpp"
#include "attnbench/error.hpp"
#include "attnbench/value_range.hpp"
#include "impls/naive/naive_backward.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace attn {

namespace {

template <typename T> using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T> Acc<T> widen(T x) { return static_cast<Acc<T>>(to_float(x)); }
template <typename T> T narrow(Acc<T> x) {
  if constexpr (std::is_same_v<T, double>) return x;
  else return from_float<T>(x);
}

bool causal_rule(Causal causal, std::int64_t i, std::int64_t j, std::int64_t seq_q, std::int64_t seq_k) {
  if (causal == Causal::none) return true;
  std::int64_t limit = i;  // top_left
  if (causal == Causal::bottom_right) limit = i + seq_k - seq_q;
  return j <= limit;
}

// The diagonal of query i in an entry of q_len queries and k_len keys, for
// the window and ALiBi (the causal alignment, or `align` when not causal).
std::int64_t diagonal(const Problem& p, std::int64_t i, std::int64_t q_len, std::int64_t k_len) {
  const bool top_left = p.causal == Causal::top_left || (p.causal == Causal::none && p.align == Align::top_left);
  return top_left ? i : i + k_len - q_len;
}

bool window_rule(const Problem& p, std::int64_t j, std::int64_t diag) {
  // Distances from the diagonal: a window up to INT64_MAX cannot overflow.
  if (p.window_left >= 0 && diag - j > p.window_left) return false;
  if (p.window_right >= 0 && j - diag > p.window_right) return false;
  return true;
}

// In: the element type of q, k and v as handed here (T, or for a quantised
// case the accumulation type, which holds their dequantised values).
template <typename T, typename In = T>
void naive_attention(const Problem& p, const AttentionIO& io) {
  using A = Acc<T>;
  const In* q = io.q.as<In>();
  const In* k = io.k.as<In>();
  const In* v = io.v.as<In>();
  T* out = io.out.as<T>();
  const T* bias = io.bias.as<T>();
  const A scale = static_cast<A>(p.scale);
  const A cap = static_cast<A>(p.softcap);
  std::vector<A> weights(static_cast<std::size_t>(p.seq_k));
  std::vector<char> visible(static_cast<std::size_t>(p.seq_k));
  // The sums (the denominator and P V) in float64: a float32 sum of 2^25 equal
  // weights stops at 2^24, and one of a long row's tiny P V terms stops adding.
  std::vector<double> acc(static_cast<std::size_t>(p.head_dim_v));
  // Dropout: one row's keep bits, drawn for its keys at once.
  const DropoutMask dropout(p, io.dropout);
  const A keep_scale = static_cast<A>(dropout.keep_scale());
  std::vector<std::uint8_t> keep(io.dropout.active() ? static_cast<std::size_t>(p.seq_k) : 0);
  // Where key j of entry e lives in k and v: (tensor batch, seq).
  auto key_batch = [&](std::int64_t e, std::int64_t j) {
    if (p.paged()) return io.page_table[e * p.pages_per_entry() + j / p.page_size];
    return p.ragged ? std::int64_t{0} : e;
  };
  auto key_seq = [&](std::int64_t e, std::int64_t j) {
    if (p.paged()) return j % p.page_size;
    return p.ragged ? io.cu_seqlens_k[e] + j : j;
  };

  // Format version 4: q, k and v hold the dequantised values without their
  // descales (prepare), which multiply here: per batch entry and kv head.
  auto descale = [](const QuantView& codes, std::int64_t e, std::int64_t h) {
    return codes.empty() || e < 0 ? A{1} : static_cast<A>(codes.descale_of(e, h));
  };

  for (std::int64_t b = 0; b < p.q_batch(); ++b) {
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const std::int64_t g = h / p.group_size();
      const A sink = io.sinks ? static_cast<A>(io.sinks[h]) : -std::numeric_limits<A>::infinity();
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        // The row's batch entry e and its position qi there; a packed row past
        // the last sequence belongs to none (e = -1) and sees no key.
        std::int64_t e = b, qi = i, q_len = p.seq_q, k_len = p.seq_k;
        if (p.ragged) {  // the entry whose queries hold row i, by bisection
          const std::int64_t* end = io.cu_seqlens_q + p.batch + 1;
          const std::int64_t* after = std::upper_bound(io.cu_seqlens_q, end, i);
          e = after == end ? -1 : (after - io.cu_seqlens_q) - 1;
          if (e >= 0) {
            qi = i - io.cu_seqlens_q[e];
            q_len = io.cu_seqlens_q[e + 1] - io.cu_seqlens_q[e];
            k_len = io.cu_seqlens_k[e + 1] - io.cu_seqlens_k[e];
          } else {
            k_len = 0;
          }
        }
        if (p.paged()) k_len = io.seq_lens[b];
        const std::int64_t kv_len = io.kv_len ? io.kv_len[b] : k_len;
        const std::int64_t diag = diagonal(p, qi, q_len, k_len);
        const std::int64_t keys = k_len;
        const A qk_descale = descale(io.q_codes, e, h) * descale(io.k_codes, e, g);
        const A v_descale = descale(io.v_codes, e, g);
        A max_score = -std::numeric_limits<A>::infinity();
        bool any = false;
        for (std::int64_t j = 0; j < keys; ++j) {
          auto& vis = visible[static_cast<std::size_t>(j)];
          vis = j < kv_len && causal_rule(p.causal, qi, j, q_len, k_len) && window_rule(p, j, diag);
          if (vis && !io.mask.empty()) vis = io.mask.at(b, h, i, j) != 0;
          A bias_value = 0;
          if (vis && bias) {
            bias_value = widen(bias[io.bias.offset(b, h, i, j)]);
            vis = !(std::isinf(bias_value) && bias_value < 0);
          }
          if (!vis) continue;
          const std::int64_t kb = key_batch(e, j), kj = key_seq(e, j);
          A dot = 0;
          for (std::int64_t d = 0; d < p.head_dim; ++d) {
            dot += widen(q[io.q.offset(b, h, i, d)]) * widen(k[io.k.offset(kb, g, kj, d)]);
          }
          dot *= qk_descale;  // 1 unless quantised: exact
          A scaled = scale * dot;
          if (p.softcap != 0) scaled = cap * std::tanh(scaled / cap);
          if (io.alibi_slopes) scaled -= static_cast<A>(io.alibi_slopes[h]) * static_cast<A>(std::abs(diag - j));
          const A s = scaled + bias_value;
          weights[static_cast<std::size_t>(j)] = s;
          max_score = std::max(max_score, s);
          any = true;
        }
        const std::int64_t row = (b * p.heads_q + h) * p.seq_q + i;
        if (!any) {
          for (std::int64_t d = 0; d < p.head_dim_v; ++d) out[io.out.offset(b, h, i, d)] = narrow<T>(A{0});
          if (io.lse) io.lse[row] = static_cast<double>(sink);
          continue;
        }
        // A sink is one more logit in the denominator, with no value.
        max_score = std::max(max_score, sink);
        double sum = 0;
        for (std::int64_t j = 0; j < keys; ++j) {
          if (!visible[static_cast<std::size_t>(j)]) continue;
          A& w = weights[static_cast<std::size_t>(j)];
          w = std::exp(w - max_score);
          sum += static_cast<double>(w);
        }
        // The sink last: added first, a sink far above the scores would round
        // every small weight after it at its own magnitude (found by attn fuzz).
        if (io.sinks) sum += static_cast<double>(std::exp(sink - max_score));
        std::fill(acc.begin(), acc.end(), 0.0);
        if (!keep.empty()) {
          dropout.row(e, h, qi, 0, keys, keep.data());
          if (io.dropout.kept) {
            std::uint8_t* kept = io.dropout.kept + ((e * p.heads_q + h) * p.seq_q + qi) * p.seq_k;
            for (std::int64_t j = 0; j < keys; ++j) {
              if (visible[static_cast<std::size_t>(j)]) kept[j] = keep[static_cast<std::size_t>(j)];
            }
          }
        }
        for (std::int64_t j = 0; j < keys; ++j) {
          if (!visible[static_cast<std::size_t>(j)]) continue;
          if (!keep.empty() && !keep[static_cast<std::size_t>(j)]) continue;  // dropped: contributes 0
          A w = static_cast<A>(static_cast<double>(weights[static_cast<std::size_t>(j)]) / sum) * v_descale;
          if (!keep.empty()) w *= keep_scale;
          const std::int64_t kb = key_batch(e, j), kj = key_seq(e, j);
          for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
            double& a = acc[static_cast<std::size_t>(d)];
            a += static_cast<double>(w * widen(v[io.v.offset(kb, g, kj, d)]));
          }
        }
        for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
          out[io.out.offset(b, h, i, d)] = narrow<T>(static_cast<A>(acc[static_cast<std::size_t>(d)]));
        }
        if (io.lse) io.lse[row] = static_cast<double>(max_score) + std::log(static_cast<double>(sum));
      }
    }
  }
}

// Format version 4: q, k and v in the accumulation type (float32, or float64
// for float64 cases) at the strides their views declare: a quantised
// tensor's codes dequantised, (code - zero point) * scale rounded once (its
// descale is applied in the loops; in the dtype, the value before the
// descale could overflow float16), the others widened exactly.
Buffer in_accumulation_type(const QuantView& codes, TensorView& view, DType acc) {
  Buffer buffer(static_cast<std::size_t>(view.extent()) * dtype_size(acc));
  std::vector<double> row(static_cast<std::size_t>(view.shape[3]));
  for (std::int64_t b = 0; b < view.shape[0]; ++b)
    for (std::int64_t h = 0; h < view.shape[1]; ++h)
      for (std::int64_t s = 0; s < view.shape[2]; ++s) {
        if (!codes.empty()) codes.dequantise_row(b, h, s, row.data());  // exact
        for (std::int64_t d = 0; d < view.shape[3]; ++d) {
          const double x = codes.empty() ? load_as_double(view.data, view.offset(b, h, s, d), view.dtype) : row[static_cast<std::size_t>(d)];
          store_from_double(buffer.data(), view.offset(b, h, s, d), acc, x);
        }
      }
  view.data = buffer.data();
  view.dtype = acc;
  return buffer;
}

class NaivePlan final : public Plan {
 public:
  NaivePlan(const Problem& p, const AttentionIO& io) : problem_(p), io_(io) {
    if (!p.quantised()) return;
    const DType acc = p.dtype == DType::f64 ? DType::f64 : DType::f32;
    q_ = in_accumulation_type(io.q_codes, io_.q, acc);
    k_ = in_accumulation_type(io.k_codes, io_.k, acc);
    v_ = in_accumulation_type(io.v_codes, io_.v, acc);
  }
  void run() override {
    dispatch_dtype(problem_.dtype, [&](auto tag) {
      using T = decltype(tag);
      if (problem_.quantised()) naive_attention<T, Acc<T>>(problem_, io_);
      else naive_attention<T>(problem_, io_);
    });
  }
  bool has_lse() const override { return true; }

 private:
  Problem problem_;
  AttentionIO io_;
  Buffer q_, k_, v_;  // version 4: q, k and v in the accumulation type, quantised ones dequantised
};

class NaiveBackend final : public Backend {
 public:
  std::string_view name() const override { return "naive"; }
  std::string_view description() const override {
    return "textbook attention: materialised scores, max-subtracted softmax, P V; float32 scores, float64 sums";
  }
  Capabilities capabilities() const override {
    return {.dtypes = kAllDTypes, .features = kAllFeatures, .lse = true, .backward = true, .uses_threads = false,
            .encodings = kAllEncodings, .batch_invariant = true,
            .bitwise_relations = kRelationVScale | kRelationLayout | kRelationDoutScale, .dropout = true};
  }
  Status supports(const Problem&) const override { return Status::yes(); }
  // Its scores are float32 outside float64: values beyond that range are
  // computed as an equivalent case that fits, or refused.
  std::unique_ptr<Plan> prepare(const Problem& problem, const AttentionIO& io, const RunOptions&) const override {
    const PlanMaker make = [](const Problem& fit, const AttentionIO& fit_io) -> std::unique_ptr<Plan> {
      return std::make_unique<NaivePlan>(fit, fit_io);
    };
    return problem.dtype == DType::f64 ? make(problem, io) : prepare_in_float32_range(problem, io, make);
  }
  std::unique_ptr<BackwardPlan> prepare_backward(const Problem& problem, const BackwardIO& io,
                                                 const RunOptions&) const override {
    const BackwardPlanMaker make = [](const Problem& fit, const BackwardIO& fit_io) {
      return make_naive_backward_plan(fit, fit_io);
    };
    return problem.dtype == DType::f64 ? make(problem, io) : prepare_backward_in_float32_range(problem, io, make);
  }
};

}  // namespace

std::unique_ptr<Backend> make_naive_backend() { return std::make_unique<NaiveBackend>(); }

}  // namespace attn
