// The truth: attention in float64 with error-free transformations (Dot2 and
// Neumaier sums), implementing every rule of the fixture format. Deterministic
// to the bit on every machine (see core/detmath.hpp). No dependency beyond core.
#pragma once

#include <cstdint>
#include <vector>

#include "core/case_data.hpp"

namespace attn {

struct ReferenceResult {
  std::vector<double> out;  // [batch, heads_q, seq_q, head_dim_v]
  std::vector<double> lse;  // [batch, heads_q, seq_q]; -inf (or the sink) for rows with no visible key
};

// What the tolerance policy needs to know about a case, element by element.
struct ReferenceStats {
  std::vector<double> weighted_abs_v;  // per out element: sum_j p_ij |v_jd|
  std::vector<double> weighted_dev_v;  // per out element: sum_j p_ij |v_jd - out_id|
  std::vector<double> score_magnitude; // per row: max over visible j of |scale| sum_k |q_ik k_jk| + |bias_ij|
  std::vector<std::int64_t> visible;   // per row: number of visible keys
  std::vector<double> weight_norm;     // per row: sqrt(sum_j p_ij^2), 0 for a row with no visible key
  // Per out element: the convex hull of the visible values, [min_j v_jd,
  // max_j v_jd] (with 0 when the row has a sink, whose weight carries no
  // value): no correct output leaves it, whatever its scores. [0, 0] for a
  // row with no visible key.
  std::vector<double> hull_lo, hull_hi;
  // Per out element: sum_j p_ij |v_jd| over the weights below the dtype's
  // smallest normal (smallest_kept_weight): those its kernels may underflow.
  // (A weight above it keeps its relative precision, so counting it here
  // would let every weight near e^-80 beside a sink lose 2^-126 |v|.)
  std::vector<double> tiny_weighted_v;
  std::vector<double> added_magnitude; // per row: max over visible j of |ALiBi_ij| + |bias_ij| (what is added to scale q.k)
  // Per row: sqrt(sum over the distinct weights of their count^2), weights
  // compared as the arithmetic type holds them (float32; float64 for float64
  // cases): n when every weight is equal, sqrt(n) when none are.
  std::vector<double> weight_repeats;
};

// Whether key j is visible to query row (b, h, i) under the format's rules.
// b and i index the q tensor (for packed sequences b is 0 and i the packed
// row); j is the key's position within the row's batch entry.
bool reference_visible(const CaseData& data, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j);
// The keys of that row's entry are j in [0, keys); ALiBi and the window are
// measured from key position diag.
struct ReferenceRowKeys {
  std::int64_t keys = 0, diag = 0;
};
ReferenceRowKeys reference_row_keys(const CaseData& data, std::int64_t b, std::int64_t h, std::int64_t i);
// The batch entry of that row and the query's position within it (what a
// dropout mask is indexed by); entry -1 for a packed row past the last sequence.
struct ReferenceRowEntry {
  std::int64_t entry = 0, i = 0;
};
ReferenceRowEntry reference_row_entry(const CaseData& data, std::int64_t b, std::int64_t i);
// Index in data.k (width head_dim) or data.v (width head_dim_v) of key j's row
// for that query row: through the packed offsets or the page table.
std::int64_t reference_key_offset(const CaseData& data, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j,
                                  std::int64_t width);
// One query row's visible keys, found once (for code that visits them many
// times): their positions j in ascending order and their rows in data.k
// (width head_dim) and data.v (width head_dim_v).
struct ReferenceRowView {
  std::int64_t keys = 0, diag = 0;  // as ReferenceRowKeys
  std::vector<std::int64_t> visible;
  std::vector<const double*> k_rows, v_rows;
};
void reference_row_view(const CaseData& data, std::int64_t b, std::int64_t h, std::int64_t i, ReferenceRowView& view);
// The score of that pair (scale, softcap, ALiBi and bias applied), exact to
// about one rounding; meaningful where the key is visible.
double reference_score(const CaseData& data, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j);
// |ALiBi| + |bias| of that score: the terms added to scale * q.k, which every
// float formulation rounds the score at (a bias of -1000 puts it there).
double reference_added_magnitude(const CaseData& data, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j);

// The attention weights p[i][j] of one (batch, query head) as a row-major
// [seq_q, seq_k] matrix; hidden keys hold 0 (use reference_visible to tell them
// from weights that underflowed).
std::vector<double> reference_weights(const CaseData& data, std::int64_t b, std::int64_t h);

// Computes out and lse; fills `stats` when given. Uses up to `threads` threads
// (0: all cores); the result does not depend on the thread count.
ReferenceResult reference_attention(const CaseData& data, ReferenceStats* stats = nullptr, int threads = 0);

// The smallest normal of the dtype's weights (float16's 2^-14; float32's and
// bfloat16's 2^-126; float64's 2^-1022): a weight below it may underflow.
double smallest_kept_weight(DType dtype);

}  // namespace attn
