// Broken backends for format version 4, on the test side: naive behind a
// wrapper that hands it the codes and scales with one bug of scale plumbing,
// the class of bug that serving stacks publish (a descale dropped or applied
// twice, read for the query head, a nibble order, a zero point's sign, a
// group's scale taken per token). The arithmetic is naive's own, so only the
// plumbing can make them FAIL. One is right in every batch but not the same
// in all: K's descale folded into the softmax scale for a batch of one
// sequence (a single-request fast path), which only batch invariance sees.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "attnbench/backend.hpp"
#include "impls/naive/naive.hpp"

namespace attn {

namespace {

enum class Flaw { v_descale_dropped, descale_twice, q_descale_by_query_head, q4_0_nibbles_interleaved, zero_point_sign,
                  group_scale_per_token, k_descale_folded_alone };

// The inner plan with the flawed copies it reads.
class FlawedPlan final : public Plan {
 public:
  std::vector<std::vector<float>> floats;
  std::vector<std::vector<std::int32_t>> integers;
  std::vector<std::vector<std::uint8_t>> bytes;
  std::unique_ptr<Plan> inner;
  Problem problem;  // what the inner plan runs
  void run() override { inner->run(); }
  void read_output() override { inner->read_output(); }
  bool has_lse() const override { return inner->has_lse(); }
};

std::int64_t element_count(const std::array<std::int64_t, 4>& shape) { return shape[0] * shape[1] * shape[2] * shape[3]; }

// Bytes from a view's first code to one past its last row.
std::int64_t code_bytes(const Problem& p, char t, const QuantView& codes) {
  const auto shape = p.stored_shape(t);
  return (shape[0] - 1) * codes.strides[0] + (shape[1] - 1) * codes.strides[1] + (shape[2] - 1) * codes.strides[2] +
         encoded_row_bytes(codes.encoding, codes.dim);
}

// Rewrites each Q4_0 block so that the format's decoder reads what a decoder
// with the nibble order 2n (low), 2n + 1 (high) reads from the original.
void interleave_nibbles(std::uint8_t* row, std::int64_t dim) {
  for (std::int64_t block = 0; block < dim / 32; ++block) {
    std::uint8_t* qs = row + block * 18 + 2;
    int nibble[32];
    for (int n = 0; n < 16; ++n) nibble[2 * n] = qs[n] & 0xF, nibble[2 * n + 1] = qs[n] >> 4;
    for (int n = 0; n < 16; ++n) qs[n] = static_cast<std::uint8_t>(nibble[n] | (nibble[n + 16] << 4));
  }
}

class QuantMutant final : public Backend {
 public:
  QuantMutant(std::string name, Flaw flaw) : name_(std::move(name)), flaw_(flaw), inner_(make_naive_backend()) {}
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return "naive behind a flaw of scale plumbing (test only)"; }
  Capabilities capabilities() const override {
    Capabilities c = inner_->capabilities();
    c.backward = false;
    return c;
  }
  Status supports(const Problem& p) const override { return inner_->supports(p); }
  std::unique_ptr<Plan> prepare(const Problem& p, const AttentionIO& io, const RunOptions& options) const override {
    auto plan = std::make_unique<FlawedPlan>();
    plan->problem = p;
    AttentionIO flawed = io;
    for (char t : {'q', 'k', 'v'}) {
      QuantView& codes = t == 'q' ? flawed.q_codes : t == 'k' ? flawed.k_codes : flawed.v_codes;
      if (codes.empty()) continue;
      const QuantSpec& spec = p.quant(t);
      const std::int64_t descales = spec.descale == Descale::entry_head ? p.batch * p.heads_kv : 1;
      switch (flaw_) {
        case Flaw::v_descale_dropped:
          if (t == 'v') codes.descale = nullptr;
          break;
        case Flaw::descale_twice:
          if (codes.descale) {
            std::vector<float>& twice = plan->floats.emplace_back(codes.descale, codes.descale + descales);
            for (float& x : twice) x *= x;
            codes.descale = twice.data();
          }
          break;
        case Flaw::q_descale_by_query_head:
          if (t == 'q' && spec.descale == Descale::entry_head) {  // index e * heads_kv + h: padded, so reads stay inside
            std::vector<float>& padded = plan->floats.emplace_back(static_cast<std::size_t>(p.batch * p.heads_kv + p.heads_q));
            for (std::size_t i = 0; i < padded.size(); ++i) padded[i] = codes.descale[static_cast<std::int64_t>(i) % descales];
            codes.descale = padded.data();
            codes.descale_group = 1;
          }
          break;
        case Flaw::q4_0_nibbles_interleaved:
          if (codes.encoding == Encoding::q4_0) {
            const std::int64_t n = code_bytes(p, t, codes);
            std::vector<std::uint8_t>& copy = plan->bytes.emplace_back(codes.codes, codes.codes + n);
            const auto shape = p.stored_shape(t);
            for (std::int64_t b = 0; b < shape[0]; ++b)
              for (std::int64_t h = 0; h < shape[1]; ++h)
                for (std::int64_t s = 0; s < shape[2]; ++s) {
                  interleave_nibbles(copy.data() + b * codes.strides[0] + h * codes.strides[1] + s * codes.strides[2], codes.dim);
                }
            codes.codes = copy.data();
          }
          break;
        case Flaw::zero_point_sign:
          if (codes.zero_point) {
            std::vector<std::int32_t>& negated =
                plan->integers.emplace_back(codes.zero_point, codes.zero_point + element_count(spec.scale));
            for (std::int32_t& z : negated) z = -z;
            codes.zero_point = negated.data();
          }
          break;
        case Flaw::group_scale_per_token:
          if (codes.scale) codes.group = codes.dim;  // every element of a row takes its first group's scale
          break;
        case Flaw::k_descale_folded_alone:
          if (t == 'k' && p.batch == 1 && spec.descale == Descale::tensor) {  // scale * descale, rounded once
            plan->problem.scale = p.scale * static_cast<double>(codes.descale[0]);
            codes.descale = nullptr;
          }
          break;
      }
    }
    plan->inner = inner_->prepare(plan->problem, flawed, options);
    return plan;
  }

 private:
  std::string name_;
  Flaw flaw_;
  std::unique_ptr<Backend> inner_;
};

}  // namespace

std::unique_ptr<Backend> make_quant_v_descale_dropped() {
  return std::make_unique<QuantMutant>("quant_v_descale_dropped", Flaw::v_descale_dropped);
}
std::unique_ptr<Backend> make_quant_descale_twice() {
  return std::make_unique<QuantMutant>("quant_descale_twice", Flaw::descale_twice);
}
std::unique_ptr<Backend> make_quant_q_descale_by_query_head() {
  return std::make_unique<QuantMutant>("quant_q_descale_by_query_head", Flaw::q_descale_by_query_head);
}
std::unique_ptr<Backend> make_quant_q4_0_nibbles_interleaved() {
  return std::make_unique<QuantMutant>("quant_q4_0_nibbles_2n", Flaw::q4_0_nibbles_interleaved);
}
std::unique_ptr<Backend> make_quant_zero_point_sign() {
  return std::make_unique<QuantMutant>("quant_zero_point_sign", Flaw::zero_point_sign);
}
std::unique_ptr<Backend> make_quant_group_scale_per_token() {
  return std::make_unique<QuantMutant>("quant_group_scale_per_token", Flaw::group_scale_per_token);
}
std::unique_ptr<Backend> make_quant_k_descale_folded_alone() {
  return std::make_unique<QuantMutant>("quant_k_descale_folded_alone", Flaw::k_descale_folded_alone);
}

}  // namespace attn
