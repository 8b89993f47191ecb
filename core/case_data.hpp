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

// Format version 4 (docs/format/v4.md): one quantised tensor as stored, its
// spec in Problem::q_quant (k_quant, v_quant).
struct QuantData {
  std::vector<std::uint8_t> codes;        // [batch, heads, seq, encoded_row_bytes] of the stored shape
  std::vector<float> scale;               // the spec's scale shape, when it has one
  std::vector<std::int32_t> zero_point;   // the same shape, when it has one
  std::vector<float> descale;             // [1] or [batch, heads_kv], when it has one
  std::vector<double> original;           // optional: the values before quantisation, stored shape
  bool operator==(const QuantData&) const = default;
};

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
  // Format version 4: the codes of each quantised tensor; q, k and v above
  // then hold their exact dequantised values (dequantise()).
  QuantData q_quant, k_quant, v_quant;
  QuantData& quant(char tensor) { return tensor == 'q' ? q_quant : tensor == 'k' ? k_quant : v_quant; }
  const QuantData& quant(char tensor) const { return tensor == 'q' ? q_quant : tensor == 'k' ? k_quant : v_quant; }
  std::vector<double>& values(char tensor) { return tensor == 'q' ? q : tensor == 'k' ? k : v; }
  const std::vector<double>& values(char tensor) const { return tensor == 'q' ? q : tensor == 'k' ? k : v; }

  // Throws InputError if any array's size disagrees with the problem, or a
  // value breaks the format's rules (non-finite q/k/v, NaN or +inf bias, a
  // value not representable in dtype, kv_len outside [0, seq_k], offsets out
  // of order, a page index outside the pool, a slope or sink not exact in float32).
  void validate() const;
  // Only the sizes and kv_len's range: for exact intermediates that need not be
  // representable in dtype (the projections inside a layer).
  void validate_shapes() const;
  // Format version 4: sets q, k and v of each quantised tensor to the exact
  // value of its codes ((decode - zero point) * scale * descale, float64);
  // throws InputError naming the tensor and element of a code that is NaN or
  // infinite, or of a scale, descale or zero point outside the format's rules.
  // Checks every size first.
  void dequantise();
  // Sets every element of q, k or v to 1; a quantised tensor keeps its
  // encoding and the shapes of its scales, with codes of 1, scales and
  // descales of 1, zero points of 0 (the normalisation probe's V = 1).
  void fill_ones(char tensor);
  // Whether stored row (b, s) of q, k or v, at [b * seq + s] of the stored
  // shape, is read by some batch entry: every row of q and of a dense K or V;
  // a packed K or V's rows up to the last sequence's end; a paged pool's
  // slots that some entry's page table reaches below its length. The others
  // (free pages and slots, a packed tail) are never read.
  std::vector<char> read_rows(char tensor) const;
};

// The inputs of a case converted to the problem's dtype and layout, owned, with
// views ready to hand to a backend. The output buffer is not included.
struct DeviceReadyInputs {
  Buffer q, k, v, mask, bias;
  Buffer q_codes, k_codes, v_codes;  // version 4, in the problem's layout
  std::vector<float> q_scale, k_scale, v_scale, q_descale, k_descale, v_descale;
  std::vector<std::int32_t> q_zero_point, k_zero_point, v_zero_point;
  std::vector<std::int64_t> kv_len, cu_seqlens_q, cu_seqlens_k, page_table, seq_lens;
  std::vector<float> alibi_slopes, sinks;
  AttentionIO io;  // out and lse left empty for the caller to fill in
};
DeviceReadyInputs make_backend_inputs(const CaseData& data);

}  // namespace attn
