// One attention case's inputs as exact values: the problem plus q, k, v, mask,
// bias and kv_len in canonical row-major [batch, heads, seq, dim] order, held
// as doubles (every value is exactly representable in problem.dtype). This is
// what fixtures load into, what the reference reads and what the verifier
// converts into a backend's dtype and layout.
#pragma once

#include <cstdint>
#include <vector>

#include "attnbench/backend.hpp"
#include "attnbench/problem.hpp"
#include "attnbench/tensor.hpp"

namespace attn {

struct CaseData {
  Problem problem;
  std::vector<double> q, k, v;
  std::vector<std::uint8_t> mask;   // [mb, mh, mq, seq_k] when problem.mask.present
  std::vector<double> bias;         // [bb, bh, bq, seq_k] when problem.bias.present
  std::vector<std::int64_t> kv_len; // [batch] when problem.kv_len
  // Format version 2 (docs/format/v2.md), each present iff the problem says so.
  std::vector<double> alibi_slopes;        // [heads_q], exact in float32
  std::vector<double> sinks;               // [heads_q], exact in float32
  std::vector<std::int64_t> cu_seqlens_q;  // [batch + 1] when ragged
  std::vector<std::int64_t> cu_seqlens_k;  // [batch + 1] when ragged
  std::vector<std::int64_t> page_table;    // [batch, pages_per_entry] when paged
  std::vector<std::int64_t> seq_lens;      // [batch] when paged

  // Throws InputError if any array's size disagrees with the problem, or a
  // value breaks the format's rules (non-finite q/k/v, NaN or +inf bias, a
  // value not representable in dtype, kv_len outside [0, seq_k], offsets out
  // of order, a page index outside the pool, a slope or sink not exact in float32).
  void validate() const;
  // Only the sizes and kv_len's range: for exact intermediates that need not be
  // representable in dtype (the projections inside a layer).
  void validate_shapes() const;
};

// The inputs of a case converted to the problem's dtype and layout, owned, with
// views ready to hand to a backend. The output buffer is not included.
struct DeviceReadyInputs {
  Buffer q, k, v, mask, bias;
  std::vector<std::int64_t> kv_len, cu_seqlens_q, cu_seqlens_k, page_table, seq_lens;
  std::vector<float> alibi_slopes, sinks;
  AttentionIO io;  // out and lse left empty for the caller to fill in
};
DeviceReadyInputs make_backend_inputs(const CaseData& data);

}  // namespace attn
