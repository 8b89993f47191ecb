// Test-side broken backends for the oracle's own tests: a FlashAttention-style
// implementation (float32, key blocks of 64, online softmax, P rounded to the
// case's dtype before P V, output rounded to nearest even) with one planted
// flaw each, of the kinds that ship in real kernels and that only a tight
// oracle sees. None of them returns lse, as oneDNN does not, so the checks of
// out and of the softmax denominator must catch them on their own.
// With no flaw set it is a correct backend, and the tests hold it to PASS.
#pragma once

#include <memory>
#include <string>

#include "attnbench/backend.hpp"

namespace attn::testing {

enum class Rounding { nearest, toward_zero, downward };

struct FlashFlaws {
  Rounding out_rounding = Rounding::nearest;  // how the result is rounded to dtype
  Rounding p_rounding = Rounding::nearest;    // how P is rounded to dtype before P V
  bool o_in_bf16 = false;             // the O accumulator is kept in bfloat16 between key blocks
  bool rescale_in_bf16 = false;       // the rescale factor exp(m_old - m_new) is rounded to bfloat16
  double exp_error = 0;               // relative error of exp, oscillating like a polynomial's (shipped: 7.4e-8)
  int reciprocal_bits = 0;            // 1/l from an approximate reciprocal with this many bits (0: exact division)
  bool l_in_bf16 = false;             // the denominator accumulated in bfloat16
  bool l_not_rescaled = false;        // the denominator keeps its old scale when the row maximum grows
  bool flush_subnormals = false;      // inputs and results below the smallest normal float become 0 (DAZ/FTZ)
  bool odd_tail_dropped_16bit = false;  // 16-bit dot products stop at an even length (a dropped odd tail)
  bool dense_v_strides = false;       // V read as contiguous [b, h, s, d] whatever its strides (BSHD breaks)
};

std::unique_ptr<Backend> make_flash_mutant(std::string name, const FlashFlaws& flaws);

}  // namespace attn::testing
