// Where each batch entry's queries and keys are, for every arrangement of the
// format (docs/format/v2.md): dense [batch, heads, seq, dim] tensors,
// packed (ragged) sequences with cumulative offsets, and paged K and V with a
// page table. The backends' shared helper (blocked, streaming, openblas,
// onednn and the benchmarks use it); the reference writes the same rules out
// on its own, so a slip here cannot hide from the verifier.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "attnbench/problem.hpp"

namespace attn {

struct SequenceMap {
  const Problem* problem = nullptr;
  const std::int64_t* kv_len = nullptr;       // [batch] or nullptr
  const std::int64_t* cu_seqlens_q = nullptr; // [batch + 1] when ragged
  const std::int64_t* cu_seqlens_k = nullptr; // [batch + 1] when ragged
  const std::int64_t* page_table = nullptr;   // [batch, pages_per_entry] when paged
  const std::int64_t* seq_lens = nullptr;     // [batch] when paged

  std::int64_t q_len(std::int64_t entry) const {
    return problem->ragged ? cu_seqlens_q[entry + 1] - cu_seqlens_q[entry] : problem->seq_q;
  }
  // The keys the entry holds (its diagonal is measured from this): seq_k for
  // dense tensors (kv_len, version 1, hides keys without moving the diagonal),
  // the packed length, or the paged entry's seq_lens.
  std::int64_t k_len(std::int64_t entry) const {
    if (problem->ragged) return cu_seqlens_k[entry + 1] - cu_seqlens_k[entry];
    if (problem->paged()) return seq_lens[entry];
    return problem->seq_k;
  }
  std::int64_t key_limit(std::int64_t entry) const {
    return kv_len ? std::min(kv_len[entry], problem->seq_k) : k_len(entry);
  }

  // Query i of an entry: its lengths, diagonal and the keys the position rules leave.
  struct Row {
    std::int64_t entry = -1;
    std::int64_t i = 0;       // position within the entry
    std::int64_t q_len = 0, k_len = 0;
    std::int64_t diag = 0;    // key position of the row's diagonal
    Problem::KeyRange keys;   // keys the position rules leave visible
  };
  Row entry_row(std::int64_t entry, std::int64_t i) const {
    Row r;
    r.entry = entry;
    r.i = i;
    r.q_len = q_len(entry);
    r.k_len = k_len(entry);
    r.diag = problem->diagonal(i, r.q_len, r.k_len);
    r.keys = problem->key_range(i, r.q_len, r.k_len, key_limit(entry));
    return r;
  }

  // Where key j of an entry is in the k and v tensors: (tensor batch, seq).
  struct Key {
    std::int64_t b = 0, s = 0;
  };
  Key key(std::int64_t entry, std::int64_t j) const {
    const Problem& p = *problem;
    if (p.ragged) return {0, cu_seqlens_k[entry] + j};
    if (p.paged()) return {page_table[entry * p.pages_per_entry() + j / p.page_size], j % p.page_size};
    return {entry, j};
  }
};

// The per-score additions of version 2, in the format's order: the scaled
// product capped (cap * tanh(s / cap)), then ALiBi (-slope * |diag - j|), then
// the bias; T is the backend's arithmetic type.
template <typename T> inline T softcapped(T scaled, T cap) { return cap * std::tanh(scaled / cap); }
template <typename T> inline T alibi_term(T slope, std::int64_t diag, std::int64_t j) {
  const std::int64_t distance = diag >= j ? diag - j : j - diag;
  return -slope * static_cast<T>(distance);
}

// A sink joining a row's denominator, for kernels that keep the row's sum in
// the log2 domain: total2 = log2 of the sum of exp2 of its scores (-inf for a
// row with no visible key), sink2 = the sink times log2(e). The keys keep
// `keep` of their normalised weight, and lse2 is log2 of the whole sum.
struct SinkShare {
  double keep = 1, lse2 = 0;
};
inline SinkShare with_sink(double total2, double sink2) {
  if (std::isinf(total2)) return {0.0, sink2};  // nothing visible: the sink is the denominator
  const double top = total2 > sink2 ? total2 : sink2;
  return {1.0 / (1.0 + std::exp2(sink2 - total2)), top + std::log2(std::exp2(total2 - top) + std::exp2(sink2 - top))};
}

}  // namespace attn
