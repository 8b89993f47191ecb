// A quantiser for generated cases (the standard suite, the fuzzer, the
// benchmarks): turns a case's float values into the codes, scales and
// descales its problem declares (format version 4), the way serving stacks
// compute them (amax over what one scale covers), keeps the originals, and
// sets the values to the exact dequantised ones. Not a contract: fixtures
// written by other tools carry their own codes, which attnbench only reads.
#pragma once

#include "core/case_data.hpp"

namespace attn {

struct QuantiseOptions {
  // The largest |value| one scale covers maps to `headroom` times the
  // encoding's largest code: 1 uses the whole range, 2 saturates the values
  // above half of it, 2^-12 puts most fp8 codes among the subnormals.
  double headroom = 1;
  // Rows of K and V that no batch entry reads (free page slots and spare
  // pages, packed tails past the last sequence) are quantised from 10^4
  // (or a quarter of the dtype's range): codes saturated at the largest,
  // valid, huge, and never to be read.
  bool poison_unread = true;
  // Every Nth row of a ggml tensor starts with a block of zeros (d = 0); 0: none.
  std::int64_t zero_block_every = 0;
};

// Quantises each of q, k and v that data.problem quantises (q_quant ...),
// from data.q, data.k, data.v, which become the exact dequantised values;
// the values before are kept as the originals.
void quantise_case(CaseData& data, const QuantiseOptions& options = {});

}  // namespace attn
