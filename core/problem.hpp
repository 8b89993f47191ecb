// The attention problem descriptor: every size and option that defines one
// scaled-dot-product attention case, with one canonical text form that parses
// back to the same problem. The same string names a benchmark, appears in a
// fixture listing and is printed in reproduce commands.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.hpp"

namespace attn {

enum class Causal : std::uint8_t {
  none,
  top_left,      // key j visible to query i iff j <= i
  bottom_right,  // key j visible to query i iff j <= i + seq_k - seq_q
};
std::string_view causal_name(Causal causal);
inline std::string_view format_as(Causal causal) { return causal_name(causal); }

// Memory layout of q, k, v and out as handed to a backend.
enum class Layout : std::uint8_t {
  bhsd,  // [batch, heads, seq, dim]
  bshd,  // [batch, seq, heads, dim]
};
std::string_view layout_name(Layout layout);
inline std::string_view format_as(Layout layout) { return layout_name(layout); }

// Shape of an optional mask or bias: [batch, heads, rows, seq_k] where each of
// the first three is either 1 (broadcast) or the full size (batch, heads_q,
// seq_q).
struct BroadcastShape {
  bool present = false;
  std::int64_t batch = 1;
  std::int64_t heads = 1;
  std::int64_t rows = 1;
  bool operator==(const BroadcastShape&) const = default;
};

struct Problem {
  std::int64_t batch = 1;
  std::int64_t heads_q = 1;
  std::int64_t heads_kv = 1;  // heads_q % heads_kv == 0; query head h reads kv head h / (heads_q / heads_kv)
  std::int64_t seq_q = 1;
  std::int64_t seq_k = 1;     // may be 0: every row then has no visible key
  std::int64_t head_dim = 1;  // width of q and k
  std::int64_t head_dim_v = 1;  // width of v and out
  double scale = 1.0;         // multiplies q.k before bias is added
  Causal causal = Causal::none;
  BroadcastShape mask;        // uint8, non-zero = attend
  BroadcastShape bias;        // additive, in dtype; -inf hides the key
  bool kv_len = false;        // int64 [batch]: keys j >= kv_len[b] are hidden
  DType dtype = DType::f32;
  Layout layout = Layout::bhsd;

  bool operator==(const Problem&) const = default;

  // Throws InputError naming the first rule broken.
  void validate() const;

  // Canonical text, e.g.
  // "dtype=f16,b=2,hq=4,hkv=2,sq=17,sk=33,d=64,dv=64,scale=0.125,causal=bottom_right,mask=1x4x17,kv_len"
  std::string to_string() const;
  // Parses any order of the same keys; `dv` defaults to `d` and `scale` to
  // 1/sqrt(d). Throws InputError on anything unknown or malformed, and
  // validates the result.
  static Problem parse(std::string_view text);

  std::int64_t group_size() const { return heads_q / heads_kv; }
  std::int64_t q_elements() const { return batch * heads_q * seq_q * head_dim; }
  std::int64_t k_elements() const { return batch * heads_kv * seq_k * head_dim; }
  std::int64_t v_elements() const { return batch * heads_kv * seq_k * head_dim_v; }
  std::int64_t out_elements() const { return batch * heads_q * seq_q * head_dim_v; }
  std::int64_t rows() const { return batch * heads_q * seq_q; }
  std::int64_t broadcast_elements(const BroadcastShape& shape) const {
    return shape.batch * shape.heads * shape.rows * seq_k;
  }

  // Whether key j is visible to query i under the causal rule alone.
  bool causal_visible(std::int64_t i, std::int64_t j) const {
    switch (causal) {
      case Causal::none: return true;
      case Causal::top_left: return j <= i;
      case Causal::bottom_right: return j <= i + seq_k - seq_q;
    }
    return true;
  }
  // Keys [0, key_end) may be visible to query i: the causal rule and kv_len
  // (kv_len_b: this batch entry's kv_len, or seq_k when there is none). Masks
  // and bias may hide more inside that range, never beyond it.
  std::int64_t key_end(std::int64_t i, std::int64_t kv_len_b) const {
    std::int64_t end = kv_len_b < seq_k ? kv_len_b : seq_k;
    if (causal == Causal::top_left && i + 1 < end) end = i + 1;
    if (causal == Causal::bottom_right && i + seq_k - seq_q + 1 < end) end = i + seq_k - seq_q + 1;
    return end > 0 ? end : 0;
  }
  // Number of (query, key) pairs the causal rule leaves visible per head.
  std::int64_t causal_visible_pairs() const;
};

double default_scale(std::int64_t head_dim);

}  // namespace attn
