#include "impls/naive/naive.hpp"

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

template <typename T>
void naive_attention(const Problem& p, const AttentionIO& io) {
  using A = Acc<T>;
  const T* q = io.q.as<T>();
  const T* k = io.k.as<T>();
  const T* v = io.v.as<T>();
  T* out = io.out.as<T>();
  const T* bias = io.bias.as<T>();
  const A scale = static_cast<A>(p.scale);
  const std::int64_t keys = p.seq_k;
  std::vector<A> weights(static_cast<std::size_t>(p.seq_k));
  std::vector<char> visible(static_cast<std::size_t>(p.seq_k));
  std::vector<A> acc(static_cast<std::size_t>(p.head_dim_v));

  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t kv_len = io.kv_len ? io.kv_len[b] : p.seq_k;
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const std::int64_t g = h / p.group_size();
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        A max_score = -std::numeric_limits<A>::infinity();
        bool any = false;
        for (std::int64_t j = 0; j < keys; ++j) {
          auto& vis = visible[static_cast<std::size_t>(j)];
          vis = j < kv_len && causal_rule(p.causal, i, j, p.seq_q, p.seq_k);
          if (vis && !io.mask.empty()) vis = io.mask.at(b, h, i, j) != 0;
          A bias_value = 0;
          if (vis && bias) {
            bias_value = widen(bias[io.bias.offset(b, h, i, j)]);
            vis = !(std::isinf(bias_value) && bias_value < 0);
          }
          if (!vis) continue;
          A dot = 0;
          for (std::int64_t d = 0; d < p.head_dim; ++d) {
            dot += widen(q[io.q.offset(b, h, i, d)]) * widen(k[io.k.offset(b, g, j, d)]);
          }
          const A s = scale * dot + bias_value;
          weights[static_cast<std::size_t>(j)] = s;
          max_score = std::max(max_score, s);
          any = true;
        }
        const std::int64_t row = (b * p.heads_q + h) * p.seq_q + i;
        if (!any) {
          for (std::int64_t d = 0; d < p.head_dim_v; ++d) out[io.out.offset(b, h, i, d)] = narrow<T>(A{0});
          if (io.lse) io.lse[row] = -std::numeric_limits<double>::infinity();
          continue;
        }
        A sum = 0;
        for (std::int64_t j = 0; j < keys; ++j) {
          if (!visible[static_cast<std::size_t>(j)]) continue;
          A& w = weights[static_cast<std::size_t>(j)];
          w = std::exp(w - max_score);
          sum += w;
        }
        std::fill(acc.begin(), acc.end(), A{0});
        for (std::int64_t j = 0; j < keys; ++j) {
          if (!visible[static_cast<std::size_t>(j)]) continue;
          const A w = weights[static_cast<std::size_t>(j)] / sum;
          for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
            A& a = acc[static_cast<std::size_t>(d)];
            a += w * widen(v[io.v.offset(b, g, j, d)]);
          }
        }
        for (std::int64_t d = 0; d < p.head_dim_v; ++d) out[io.out.offset(b, h, i, d)] = narrow<T>(acc[static_cast<std::size_t>(d)]);
        if (io.lse) io.lse[row] = static_cast<double>(max_score) + std::log(static_cast<double>(sum));
      }
    }
  }
}

class NaivePlan final : public Plan {
 public:
  NaivePlan(const Problem& p, const AttentionIO& io) : problem_(p), io_(io) {}
  void run() override {
    dispatch_dtype(problem_.dtype, [&](auto tag) { naive_attention<decltype(tag)>(problem_, io_); });
  }
  bool has_lse() const override { return true; }

 private:
  Problem problem_;
  AttentionIO io_;
};

class NaiveBackend final : public Backend {
 public:
  std::string_view name() const override { return "naive"; }
  std::string_view description() const override {
    return "textbook attention: materialised scores, max-subtracted softmax, P V; float32 accumulation";
  }
  std::string_view capabilities() const override {
    return "all dtypes, both layouts, masks, bias, kv_len, causal, GQA/MQA, any head_dim; lse";
  }
  Status supports(const Problem&) const override { return Status::yes(); }
  std::unique_ptr<Plan> prepare(const Problem& problem, const AttentionIO& io, const RunOptions&) const override {
    return std::make_unique<NaivePlan>(problem, io);
  }
};

}  // namespace

std::unique_ptr<Backend> make_naive_backend() { return std::make_unique<NaiveBackend>(); }

}  // namespace attn
