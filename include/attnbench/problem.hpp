// The attention problem descriptor: every size and option that defines one
// scaled-dot-product attention case, with one canonical text form that parses
// back to the same problem. The same string names a benchmark, appears in a
// fixture listing and is printed in reproduce commands.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "attnbench/dtype.hpp"
#include "attnbench/quant.hpp"

namespace attn {

enum class Causal : std::uint8_t {
  none,
  top_left,      // key j visible to query i iff j <= i
  bottom_right,  // key j visible to query i iff j <= i + seq_k - seq_q
};
std::string_view causal_name(Causal causal);
inline std::string_view format_as(Causal causal) { return causal_name(causal); }

// The diagonal that sliding windows and ALiBi are measured from when the case
// is not causal (a causal case uses its own alignment): query i of an entry
// with q_len queries and k_len keys sits at key position i (top_left) or
// i + k_len - q_len (bottom_right).
enum class Align : std::uint8_t { top_left, bottom_right };
std::string_view align_name(Align align);

// The format version 2 additions (docs/format/v2.md), as bits: a
// backend declares which it implements (Backend::features); any other is SKIP.
enum Feature : unsigned {
  kFeatureWindow = 1u << 0,   // sliding window
  kFeatureSoftcap = 1u << 1,  // cap * tanh(s / cap)
  kFeatureAlibi = 1u << 2,    // a slope per query head
  kFeatureSinks = 1u << 3,    // a logit per query head in the denominator
  kFeatureRagged = 1u << 4,   // packed sequences, cu_seqlens
  kFeaturePaged = 1u << 5,    // K and V in pages, a page table
};
inline constexpr unsigned kAllFeatures = 0x3f;
// "sliding window, softcap" for a set of bits.
std::string feature_names(unsigned features);

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

  // Format version 2 (docs/format/v2.md). Defaults: absent.
  Align align = Align::bottom_right;  // the diagonal when causal is none (window, ALiBi)
  std::int64_t window_left = -1;      // keys at most this far left of the diagonal; -1: unbounded
  std::int64_t window_right = -1;     // keys at most this far right of it; -1: unbounded
  double softcap = 0;                 // > 0: scores s become softcap * tanh(s / softcap) before bias
  bool alibi = false;                 // float [heads_q] slopes: adds -slope * |diag(i) - j|
  bool sinks = false;                 // float [heads_q] logits that join each row's denominator
  // Packed sequences: batch entries; q, out [1, heads_q, seq_q, .] and k, v
  // [1, heads_kv, seq_k, .] hold them end to end (seq_q, seq_k: the packed
  // capacities); cu_seqlens_q, cu_seqlens_k int64 [batch + 1] say where each starts.
  bool ragged = false;
  // Paged KV: page_size > 0. k, v are [num_pages, heads_kv, page_size, .]
  // pages; page_table int64 [batch, seq_k / page_size] names the page of each
  // entry's keys in order; seq_lens int64 [batch] the keys each entry holds.
  std::int64_t page_size = 0;
  std::int64_t num_pages = 0;
  // Format version 4 (docs/format/v4.md): q, k and v each stored as codes of
  // an encoding with what dequantises them; absent (Encoding::none): in dtype.
  // dtype stays the precision of the output and of the computation.
  QuantSpec q_quant, k_quant, v_quant;

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
  bool paged() const { return page_size > 0; }
  // The batch axis of q and out (1 for packed sequences), and of k and v
  // (their number of pages when paged), and the seq axis of k and v.
  std::int64_t q_batch() const { return ragged ? 1 : batch; }
  std::int64_t kv_batch() const { return paged() ? num_pages : q_batch(); }
  std::int64_t kv_seq() const { return paged() ? page_size : seq_k; }
  std::int64_t pages_per_entry() const { return paged() ? seq_k / page_size : 0; }
  std::int64_t q_elements() const { return q_batch() * heads_q * seq_q * head_dim; }
  std::int64_t k_elements() const { return kv_batch() * heads_kv * kv_seq() * head_dim; }
  std::int64_t v_elements() const { return kv_batch() * heads_kv * kv_seq() * head_dim_v; }
  std::int64_t out_elements() const { return q_batch() * heads_q * seq_q * head_dim_v; }
  std::int64_t rows() const { return q_batch() * heads_q * seq_q; }
  // The version 2 additions this problem uses (Feature bits).
  unsigned features() const;
  // Format version 4: whether any of q, k, v is quantised, and their encodings (encoding_bit).
  bool quantised() const { return q_quant.quantised() || k_quant.quantised() || v_quant.quantised(); }
  unsigned encodings() const;
  // The stored shape of q, k or v ('q', 'k', 'v'): [batch, heads, seq, width]
  // of the tensor as held (pages for batch when paged).
  std::array<std::int64_t, 4> stored_shape(char tensor) const;
  const QuantSpec& quant(char tensor) const { return tensor == 'q' ? q_quant : tensor == 'k' ? k_quant : v_quant; }
  // After the sizes changed (a smaller problem of the same kind): each scale
  // axis that is not broadcast takes its tensor's new size, and groups that no
  // longer divide the row become one per row.
  void fit_quant_scales();
  bool has_window() const { return window_left >= 0 || window_right >= 0; }
  // The alignment of the causal rule, or of the window and ALiBi without one.
  Align alignment() const {
    if (causal == Causal::top_left) return Align::top_left;
    if (causal == Causal::bottom_right) return Align::bottom_right;
    return align;
  }
  // Key position of query i's diagonal in an entry of q_len queries and k_len keys.
  std::int64_t diagonal(std::int64_t i, std::int64_t q_len, std::int64_t k_len) const {
    return alignment() == Align::top_left ? i : i + k_len - q_len;
  }
  // Keys [lo, hi) of an entry that the position rules leave to query i: the
  // causal rule and the window from the diagonal (measured from k_len), and
  // key_limit (kv_len, or k_len). Masks and bias may hide more inside.
  // 0 <= lo <= hi <= min(k_len, key_limit) always.
  struct KeyRange {
    std::int64_t lo = 0, hi = 0;
    bool empty() const { return hi <= lo; }
  };
  KeyRange key_range(std::int64_t i, std::int64_t q_len, std::int64_t k_len, std::int64_t key_limit) const {
    const std::int64_t diag = diagonal(i, q_len, k_len);
    std::int64_t lo = 0, hi = key_limit < k_len ? key_limit : k_len;
    if (causal != Causal::none && diag + 1 < hi) hi = diag + 1;
    // Compared as distances from the diagonal, so that any window up to
    // INT64_MAX (valid: it hides nothing) cannot overflow.
    if (window_right >= 0 && window_right < hi - 1 - diag) hi = diag + window_right + 1;
    if (window_left >= 0 && window_left < diag - lo) lo = diag - window_left;
    if (hi < 0) hi = 0;
    if (lo > hi) lo = hi;  // empty; both within [0, k_len]
    return {lo, hi};
  }
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
  // and bias may hide more inside that range, never beyond it. Version 1
  // problems only (key_range covers the window and per-entry lengths).
  std::int64_t key_end(std::int64_t i, std::int64_t kv_len_b) const {
    std::int64_t end = kv_len_b < seq_k ? kv_len_b : seq_k;
    if (causal == Causal::top_left && i + 1 < end) end = i + 1;
    if (causal == Causal::bottom_right && i + seq_k - seq_q + 1 < end) end = i + seq_k - seq_q + 1;
    return end > 0 ? end : 0;
  }
  // Number of (query, key) pairs the causal rule and the window leave visible
  // per head (of the full seq_q x seq_k rectangle; per-entry lengths aside).
  std::int64_t causal_visible_pairs() const;
};

double default_scale(std::int64_t head_dim);

}  // namespace attn
