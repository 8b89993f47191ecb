// example-cpp: a C++ backend written exactly as an in-tree one (a subclass of
// attn::Backend, attnbench/backend.hpp), built out of tree against the installed
// package and loaded by `attn --plugin`. attnbench/cpp_plugin.hpp turns it into
// the C ABI; nothing C++ crosses the boundary.
#include <attnbench/cpp_plugin.hpp>

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
    for (std::int64_t j = 0; j < p_.seq_k; ++j) {
      double s = -std::numeric_limits<double>::infinity();
      if (j >= keys.lo && j < keys.hi && (io_.mask.empty() || io_.mask.at(b, h, i, j) != 0)) {
        double dot = 0;
        for (std::int64_t d = 0; d < p_.head_dim; ++d) {
          dot += static_cast<double>(attn::load_float(io_.q, io_.q.offset(b, h, i, d))) *
                 static_cast<double>(attn::load_float(io_.k, io_.k.offset(b, g, j, d)));
        }
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
    for (std::int64_t d = 0; d < p_.head_dim_v; ++d) {
      double acc = 0;
      for (std::int64_t j = 0; j < p_.seq_k && total > 0; ++j) {
        const double w = scores_[static_cast<std::size_t>(j)];
        if (w != 0) acc += w * static_cast<double>(attn::load_float(io_.v, io_.v.offset(b, g, j, d)));
      }
      attn::store_float(io_.out, io_.out.offset(b, h, i, d), total > 0 ? static_cast<float>(acc / total) : 0.0f);
    }
    // lse: -inf for a row with no visible key.
    if (io_.lse != nullptr) {
      io_.lse[(b * p_.heads_q + h) * p_.seq_q + i] = total > 0 ? top + std::log(total) : -std::numeric_limits<double>::infinity();
    }
  }

  attn::Problem p_;
  attn::AttentionIO io_;
  std::vector<double> scores_;
};

class ExampleBackend final : public attn::Backend {
 public:
  std::string_view name() const override { return "example-cpp"; }
  std::string_view description() const override {
    return "an attn::Backend subclass built out of tree: double sums, results through float";
  }
  // Not float64: its results pass through float. Two format version 2
  // additions (sliding windows, softcap), and lse.
  attn::Capabilities capabilities() const override {
    return {attn::dtype_bit(attn::DType::f32) | attn::dtype_bit(attn::DType::f16) | attn::dtype_bit(attn::DType::bf16),
            attn::kFeatureWindow | attn::kFeatureSoftcap, true};
  }
  attn::Status supports(const attn::Problem&) const override { return attn::Status::yes(); }
  std::unique_ptr<attn::Plan> prepare(const attn::Problem& p, const attn::AttentionIO& io,
                                      const attn::RunOptions&) const override {
    return std::make_unique<ExamplePlan>(p, io);
  }
};

std::unique_ptr<attn::Backend> make_example_backend() { return std::make_unique<ExampleBackend>(); }

}  // namespace

ATTN_CPP_PLUGIN(make_example_backend)
