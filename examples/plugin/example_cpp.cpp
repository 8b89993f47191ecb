// example-cpp: a C++ backend written exactly as an in-tree one (a subclass of
// attn::Backend, attnbench/backend.hpp), forward and backward, built out of tree against the installed
// package and loaded by `attn --plugin`. attnbench/cpp_plugin.hpp turns it into
// the C ABI; nothing C++ crosses the boundary.
#include <attnbench/cpp_plugin.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

class ExamplePlan final : public attn::Plan {
 public:
  ExamplePlan(const attn::Problem& p, const attn::AttentionIO& io) : p_(p), io_(io), scores_(static_cast<std::size_t>(p.seq_k)) {}
  bool has_lse() const override { return true; }  // written when io.lse is not null

  void run() override {
    const std::int64_t group = p_.heads_q / p_.heads_kv;
    for (std::int64_t b = 0; b < p_.batch; ++b) {
      const std::int64_t kv_len = io_.kv_len ? io_.kv_len[b] : p_.seq_k;
      for (std::int64_t h = 0; h < p_.heads_q; ++h) {
        for (std::int64_t i = 0; i < p_.seq_q; ++i) row(b, h, h / group, i, kv_len);
      }
    }
  }

 private:
  void row(std::int64_t b, std::int64_t h, std::int64_t g, std::int64_t i, std::int64_t kv_len) {
    double top = -std::numeric_limits<double>::infinity();
    // Causal, the sliding window and kv_len leave keys [lo, hi).
    const attn::Problem::KeyRange keys = p_.key_range(i, p_.seq_q, p_.seq_k, kv_len);
    const std::vector<double>& q = values(io_.q, io_.q_codes, b, h, i, q_row_);  // once a row
    for (std::int64_t j = 0; j < p_.seq_k; ++j) {
      double s = -std::numeric_limits<double>::infinity();
      if (j >= keys.lo && j < keys.hi && (io_.mask.empty() || io_.mask.at(b, h, i, j) != 0)) {
        const std::vector<double>& k = values(io_.k, io_.k_codes, b, g, j, k_row_);
        double dot = 0;
        for (std::int64_t d = 0; d < p_.head_dim; ++d) dot += q[static_cast<std::size_t>(d)] * k[static_cast<std::size_t>(d)];
        s = p_.scale * dot;
        if (p_.softcap > 0) s = p_.softcap * std::tanh(s / p_.softcap);
        if (!io_.bias.empty()) s += static_cast<double>(attn::load_float(io_.bias, io_.bias.offset(b, h, i, j)));
      }
      scores_[static_cast<std::size_t>(j)] = s;
      top = std::max(top, s);
    }
    double total = 0;
    if (std::isfinite(top)) {
      for (double& s : scores_) {
        s = std::exp(s - top);
        total += s;
      }
    }
    std::vector<double> acc(static_cast<std::size_t>(p_.head_dim_v), 0.0);
    for (std::int64_t j = 0; j < p_.seq_k && total > 0; ++j) {
      const double w = scores_[static_cast<std::size_t>(j)];
      if (w == 0) continue;
      const std::vector<double>& v = values(io_.v, io_.v_codes, b, g, j, v_row_);
      for (std::int64_t d = 0; d < p_.head_dim_v; ++d) acc[static_cast<std::size_t>(d)] += w * v[static_cast<std::size_t>(d)];
    }
    for (std::int64_t d = 0; d < p_.head_dim_v; ++d) {
      attn::store_float(io_.out, io_.out.offset(b, h, i, d), total > 0 ? static_cast<float>(acc[static_cast<std::size_t>(d)] / total) : 0.0f);
    }
    // lse: -inf for a row with no visible key.
    if (io_.lse != nullptr) {
      io_.lse[(b * p_.heads_q + h) * p_.seq_q + i] = total > 0 ? top + std::log(total) : -std::numeric_limits<double>::infinity();
    }
  }

  // Row (b, head, s) of q, k or v in double: the dtype's values, or
  // (format version 4) the codes dequantised with the entry's descale,
  // exactly as attnbench/quant.hpp defines them.
  const std::vector<double>& values(const attn::TensorView& t, const attn::QuantView& codes, std::int64_t b,
                                    std::int64_t head, std::int64_t s, std::vector<double>& row) const {
    row.resize(static_cast<std::size_t>(t.shape[3]));
    if (codes.empty()) {
      for (std::size_t d = 0; d < row.size(); ++d) row[d] = attn::load_float(t, t.offset(b, head, s, static_cast<std::int64_t>(d)));
      return row;
    }
    codes.dequantise_row(b, head, s, row.data());
    const double descale = codes.descale_of(b, head);
    for (double& x : row) x *= descale;
    return row;
  }

  attn::Problem p_;
  attn::AttentionIO io_;
  std::vector<double> scores_, q_row_, k_row_, v_row_;
};

// The backward pass (format version 3): the textbook gradient in double, P
// recomputed per row from the scores, D from this backend's own forward
// output, dK and dV summed over the query heads of a group.
class ExampleBackwardPlan final : public attn::BackwardPlan {
 public:
  ExampleBackwardPlan(const attn::Problem& p, const attn::BackwardIO& io)
      : p_(p), io_(io), f_(io.forward),
        dk_(static_cast<std::size_t>(p.k_elements())), dv_(static_cast<std::size_t>(p.v_elements())),
        dbias_(io.dbias.empty() ? 0 : static_cast<std::size_t>(p.broadcast_elements(p.bias))),
        weight_(static_cast<std::size_t>(p.seq_k)), slope_(static_cast<std::size_t>(p.seq_k)),
        dq_(static_cast<std::size_t>(p.head_dim)) {}

  void run() override {
    for (auto* sums : {&dk_, &dv_, &dbias_}) std::fill(sums->begin(), sums->end(), 0.0);
    const std::int64_t group = p_.heads_q / p_.heads_kv;
    for (std::int64_t b = 0; b < p_.batch; ++b) {
      const std::int64_t kv_len = f_.kv_len ? f_.kv_len[b] : p_.seq_k;
      for (std::int64_t h = 0; h < p_.heads_q; ++h) {
        for (std::int64_t i = 0; i < p_.seq_q; ++i) row(b, h, h / group, i, kv_len);
      }
    }
    for (std::int64_t b = 0; b < p_.batch; ++b)
      for (std::int64_t g = 0; g < p_.heads_kv; ++g)
        for (std::int64_t j = 0; j < p_.seq_k; ++j) {
          for (std::int64_t d = 0; d < p_.head_dim; ++d) {
            attn::store_float(io_.dk, io_.dk.offset(b, g, j, d), static_cast<float>(dk_[at(b, g, j, d, p_.heads_kv, p_.seq_k, p_.head_dim)]));
          }
          for (std::int64_t d = 0; d < p_.head_dim_v; ++d) {
            attn::store_float(io_.dv, io_.dv.offset(b, g, j, d), static_cast<float>(dv_[at(b, g, j, d, p_.heads_kv, p_.seq_k, p_.head_dim_v)]));
          }
        }
    const attn::BroadcastShape& s = p_.bias;
    for (std::int64_t b = 0; b < s.batch && !dbias_.empty(); ++b)
      for (std::int64_t h = 0; h < s.heads; ++h)
        for (std::int64_t i = 0; i < s.rows; ++i)
          for (std::int64_t j = 0; j < p_.seq_k; ++j) {
            attn::store_float(io_.dbias, io_.dbias.offset(b, h, i, j), static_cast<float>(dbias_[at(b, h, i, j, s.heads, s.rows, p_.seq_k)]));
          }
  }

 private:
  static std::size_t at(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d, std::int64_t nb, std::int64_t nc,
                        std::int64_t nd) {
    return static_cast<std::size_t>(((a * nb + b) * nc + c) * nd + d);
  }
  double in(const attn::TensorView& t, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) const {
    return static_cast<double>(attn::load_float(t, t.offset(a, b, c, d)));
  }

  void row(std::int64_t b, std::int64_t h, std::int64_t g, std::int64_t i, std::int64_t kv_len) {
    const attn::Problem::KeyRange keys = p_.key_range(i, p_.seq_q, p_.seq_k, kv_len);
    const attn::TensorView out{f_.out.data, f_.out.dtype, f_.out.shape, f_.out.strides};
    double top = -std::numeric_limits<double>::infinity();
    for (std::int64_t j = 0; j < p_.seq_k; ++j) {
      double s = -std::numeric_limits<double>::infinity(), slope = 1;
      if (j >= keys.lo && j < keys.hi && (f_.mask.empty() || f_.mask.at(b, h, i, j) != 0)) {
        double dot = 0;
        for (std::int64_t d = 0; d < p_.head_dim; ++d) dot += in(f_.q, b, h, i, d) * in(f_.k, b, g, j, d);
        s = p_.scale * dot;
        if (p_.softcap > 0) {
          const double t = std::tanh(s / p_.softcap);
          s = p_.softcap * t;
          slope = 1 - t * t;  // the cap's derivative at the scaled score
        }
        if (!f_.bias.empty()) s += in(f_.bias, b, h, i, j);
      }
      weight_[static_cast<std::size_t>(j)] = s;
      slope_[static_cast<std::size_t>(j)] = slope;
      top = std::max(top, s);
    }
    std::fill(dq_.begin(), dq_.end(), 0.0);
    if (std::isfinite(top)) {  // a row with no visible key has dQ 0 and gives nothing
      double total = 0;
      for (double& w : weight_) total += (w = std::exp(w - top));
      double delta = 0;  // D = dO . O, from this backend's own forward output
      for (std::int64_t d = 0; d < p_.head_dim_v; ++d) delta += in(io_.dout, b, h, i, d) * in(out, b, h, i, d);
      for (std::int64_t j = 0; j < p_.seq_k; ++j) {
        const double pj = weight_[static_cast<std::size_t>(j)] / total;
        if (pj == 0) continue;
        double dp = 0;
        for (std::int64_t d = 0; d < p_.head_dim_v; ++d) {
          dp += in(io_.dout, b, h, i, d) * in(f_.v, b, g, j, d);
          dv_[at(b, g, j, d, p_.heads_kv, p_.seq_k, p_.head_dim_v)] += pj * in(io_.dout, b, h, i, d);
        }
        const double ds = pj * (dp - delta), dx = ds * slope_[static_cast<std::size_t>(j)] * p_.scale;
        for (std::int64_t d = 0; d < p_.head_dim; ++d) {
          dq_[static_cast<std::size_t>(d)] += dx * in(f_.k, b, g, j, d);
          dk_[at(b, g, j, d, p_.heads_kv, p_.seq_k, p_.head_dim)] += dx * in(f_.q, b, h, i, d);
        }
        if (!dbias_.empty()) {  // summed over the bias's broadcast axes
          const attn::BroadcastShape& s = p_.bias;
          dbias_[at(s.batch == 1 ? 0 : b, s.heads == 1 ? 0 : h, s.rows == 1 ? 0 : i, j, s.heads, s.rows, p_.seq_k)] += ds;
        }
      }
    }
    for (std::int64_t d = 0; d < p_.head_dim; ++d) {
      attn::store_float(io_.dq, io_.dq.offset(b, h, i, d), static_cast<float>(dq_[static_cast<std::size_t>(d)]));
    }
  }

  attn::Problem p_;
  attn::BackwardIO io_;
  attn::AttentionIO f_;
  std::vector<double> dk_, dv_, dbias_, weight_, slope_, dq_;
};

class ExampleBackend final : public attn::Backend {
 public:
  std::string_view name() const override { return "example-cpp"; }
  std::string_view description() const override {
    return "an attn::Backend subclass built out of tree: double sums, results through float";
  }
  // Not float64: its results pass through float. Two format version 2
  // additions (sliding windows, softcap), lse, and every quantised encoding
  // of format version 4 (forward only).
  attn::Capabilities capabilities() const override {
    return {.dtypes = attn::dtype_bit(attn::DType::f32) | attn::dtype_bit(attn::DType::f16) | attn::dtype_bit(attn::DType::bf16),
            .features = attn::kFeatureWindow | attn::kFeatureSoftcap,
            .lse = true,
            .backward = true,
            .encodings = attn::kAllEncodings};
  }
  attn::Status supports(const attn::Problem&) const override { return attn::Status::yes(); }
  std::unique_ptr<attn::Plan> prepare(const attn::Problem& p, const attn::AttentionIO& io,
                                      const attn::RunOptions&) const override {
    return std::make_unique<ExamplePlan>(p, io);
  }
  std::unique_ptr<attn::BackwardPlan> prepare_backward(const attn::Problem& p, const attn::BackwardIO& io,
                                                       const attn::RunOptions&) const override {
    return std::make_unique<ExampleBackwardPlan>(p, io);
  }
};

std::unique_ptr<attn::Backend> make_example_backend() { return std::make_unique<ExampleBackend>(); }

}  // namespace

ATTN_CPP_PLUGIN(make_example_backend)
