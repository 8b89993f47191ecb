#include "tests/mutants/flash_mutant.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

namespace attn::testing {

namespace {

constexpr std::int64_t kBlock = 64;

// The dtype value next to a (non-negative dtype value) a, one step up or down.
double step_magnitude(double a, DType dtype, int direction) {
  switch (dtype) {
    case DType::f64: return std::nextafter(a, direction > 0 ? INFINITY : 0.0);
    case DType::f32: return std::nextafter(static_cast<float>(a), direction > 0 ? INFINITY : 0.0f);
    case DType::f16: {
      f16 h = float_to_f16(static_cast<float>(a));
      h.bits = static_cast<std::uint16_t>(h.bits + direction);
      return f16_to_float(h);
    }
    case DType::bf16: {
      bf16 h = float_to_bf16(static_cast<float>(a));
      h.bits = static_cast<std::uint16_t>(h.bits + direction);
      return bf16_to_float(h);
    }
  }
  return a;
}

double round_directed(double x, DType dtype, Rounding mode) {
  const double r = round_to_dtype(x, dtype);
  const double a = std::fabs(r);
  if (mode == Rounding::toward_zero && a > std::fabs(x)) return std::copysign(step_magnitude(a, dtype, -1), r);
  if (mode == Rounding::downward && r > x) {
    return r > 0 ? step_magnitude(a, dtype, -1) : -step_magnitude(a, dtype, +1);
  }
  return r;
}

float to_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

class FlashMutantPlan final : public Plan {
 public:
  FlashMutantPlan(const Problem& p, const AttentionIO& io, const FlashFlaws& f) : p_(p), io_(io), f_(f) {}

  void run() override {
    for (std::int64_t b = 0; b < p_.batch; ++b)
      for (std::int64_t h = 0; h < p_.heads_q; ++h)
        for (std::int64_t i = 0; i < p_.seq_q; ++i) row(b, h, i);
  }

 private:
  float load(const TensorView& view, std::int64_t at) const {
    const float x = load_float(view, at);
    return f_.flush_subnormals && std::fabs(x) < std::numeric_limits<float>::min() ? 0.0f : x;
  }

  float load_v(std::int64_t b, std::int64_t g, std::int64_t j, std::int64_t d) const {
    if (!f_.dense_v_strides) return load(io_.v, io_.v.offset(b, g, j, d));
    return load(io_.v, ((b * p_.heads_kv + g) * p_.seq_k + j) * p_.head_dim_v + d);
  }

  float exp_of(float x) const {
    float e = std::exp(x);
    if (f_.exp_error != 0) {
      const double phase = 3.0 * (static_cast<double>(x) * std::numbers::log2e);
      e *= static_cast<float>(1.0 + f_.exp_error * std::cos(2 * std::numbers::pi * (phase - std::floor(phase))));
    }
    return e;
  }

  bool visible(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j, float& bias) const {
    bias = 0;
    if (!p_.causal_visible(i, j)) return false;
    if (io_.kv_len && j >= io_.kv_len[b]) return false;
    if (!io_.mask.empty() && io_.mask.at(b, h, i, j) == 0) return false;
    if (!io_.bias.empty()) {
      bias = load_float(io_.bias, io_.bias.offset(b, h, i, j));
      if (std::isinf(bias) && bias < 0) return false;
    }
    return true;
  }

  // Weights times `weight_scale` (1, or 2^-k with 2^k >= seq_k when the
  // first try overflowed float32: |v| near its largest over many keys), as
  // the production backends do (Kernels::exp2_sum).
  void row(std::int64_t b, std::int64_t h, std::int64_t i) const {
    if (!row_with(b, h, i, 1.0f)) {
      float scale = 1.0f;
      while (scale * static_cast<float>(p_.seq_k) > 1.0f) scale *= 0.5f;
      row_with(b, h, i, scale);
    }
  }

  bool row_with(std::int64_t b, std::int64_t h, std::int64_t i, float weight_scale) const {
    const std::int64_t g = h / p_.group_size();
    const auto dv = static_cast<std::size_t>(p_.head_dim_v);
    std::vector<float> o(dv, 0.0f), s(kBlock);
    std::vector<char> seen(kBlock);
    float m = -std::numeric_limits<float>::infinity(), l = 0;
    const float scale = static_cast<float>(p_.scale);
    for (std::int64_t j0 = 0; j0 < p_.seq_k; j0 += kBlock) {
      const std::int64_t n = std::min(kBlock, p_.seq_k - j0);
      float block_max = -std::numeric_limits<float>::infinity();
      for (std::int64_t t = 0; t < n; ++t) {
        float bias = 0;
        seen[static_cast<std::size_t>(t)] = visible(b, h, i, j0 + t, bias);
        if (!seen[static_cast<std::size_t>(t)]) continue;
        float dot = 0;
        std::int64_t dims = p_.head_dim;
        if (f_.odd_tail_dropped_16bit && dtype_size(p_.dtype) == 2 && dims > 1) dims -= dims % 2;
        for (std::int64_t d = 0; d < dims; ++d) {
          dot += load(io_.q, io_.q.offset(b, h, i, d)) * load(io_.k, io_.k.offset(b, g, j0 + t, d));
        }
        s[static_cast<std::size_t>(t)] = scale * dot + bias;
        block_max = std::max(block_max, s[static_cast<std::size_t>(t)]);
      }
      if (block_max == -std::numeric_limits<float>::infinity()) continue;
      const float m_new = std::max(m, block_max);
      float alpha = m == -std::numeric_limits<float>::infinity() ? 0.0f : exp_of(m - m_new);
      if (f_.rescale_in_bf16) alpha = to_bf16(alpha);
      l = f_.l_not_rescaled ? l : alpha * l;
      for (float& x : o) x *= alpha;
      for (std::int64_t t = 0; t < n; ++t) {
        if (!seen[static_cast<std::size_t>(t)]) continue;
        const float e = exp_of(s[static_cast<std::size_t>(t)] - m_new) * weight_scale;
        l += e;
        if (f_.l_in_bf16) l = to_bf16(l);
        const auto pe = static_cast<float>(round_directed(e, p_.dtype, f_.p_rounding));
        for (std::size_t d = 0; d < dv; ++d) {
          o[d] += pe * load_v(b, g, j0 + t, static_cast<std::int64_t>(d));
        }
      }
      if (f_.o_in_bf16) for (float& x : o) x = to_bf16(x);
      m = m_new;
    }
    if (weight_scale == 1.0f && !std::all_of(o.begin(), o.end(), [](float x) { return std::isfinite(x); })) return false;
    double inverse = 0;
    if (m != -std::numeric_limits<float>::infinity()) {
      inverse = 1.0 / static_cast<double>(l);
      if (f_.reciprocal_bits > 0) {
        int exponent;
        const double mantissa = std::frexp(inverse, &exponent);
        inverse = std::ldexp(std::nearbyint(std::ldexp(mantissa, f_.reciprocal_bits)), exponent - f_.reciprocal_bits);
      }
    }
    for (std::size_t d = 0; d < dv; ++d) {
      // The exact quotient, rounded once: float32 then the dtype would round twice.
      const double result = f_.reciprocal_bits > 0 ? static_cast<double>(o[d]) * inverse
                                                   : (inverse == 0 ? 0.0 : static_cast<double>(o[d]) / static_cast<double>(l));
      double value = round_directed(result, p_.dtype, f_.out_rounding);
      if (f_.flush_subnormals && std::fabs(value) < std::numeric_limits<float>::min()) value = 0;
      store_float(io_.out, io_.out.offset(b, h, i, static_cast<std::int64_t>(d)), static_cast<float>(value));
    }
    return true;
  }

  Problem p_;
  AttentionIO io_;
  FlashFlaws f_;
};

class FlashMutant final : public Backend {
 public:
  FlashMutant(std::string name, const FlashFlaws& flaws) : name_(std::move(name)), flaws_(flaws) {}
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return "test-only flash-style backend with a planted flaw"; }
  Capabilities capabilities() const override {
    return {.dtypes = dtype_bit(DType::f32) | dtype_bit(DType::f16) | dtype_bit(DType::bf16)};
  }
  Status supports(const Problem&) const override { return Status::yes(); }
  std::unique_ptr<Plan> prepare(const Problem& p, const AttentionIO& io, const RunOptions&) const override {
    return std::make_unique<FlashMutantPlan>(p, io, flaws_);
  }

 private:
  std::string name_;
  FlashFlaws flaws_;
};

}  // namespace

std::unique_ptr<Backend> make_flash_mutant(std::string name, const FlashFlaws& flaws) {
  return std::make_unique<FlashMutant>(std::move(name), flaws);
}

}  // namespace attn::testing

// The flash mutants of the catalogue (tests/mutants/CMakeLists.txt), by name.
namespace attn {
std::unique_ptr<Backend> make_flash_flush_subnormals() {
  return testing::make_flash_mutant("flash_flush_subnormals", {.flush_subnormals = true});
}
std::unique_ptr<Backend> make_flash_odd_tail_dropped_16bit() {
  return testing::make_flash_mutant("flash_odd_tail_16bit", {.odd_tail_dropped_16bit = true});
}
std::unique_ptr<Backend> make_flash_dense_v_strides() {
  return testing::make_flash_mutant("flash_dense_v_strides", {.dense_v_strides = true});
}
}  // namespace attn
