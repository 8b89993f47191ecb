// Rounding a double into a narrower binary floating-point format: shared by
// the dtype conversions (core/dtype.cpp) and the fp8 encoders (core/quant.cpp).
#pragma once

namespace attn::detail {

// Rounds a finite double to a format with `mantissa_bits` explicit significand
// bits, minimum normal exponent `min_exp` and largest finite value
// `max_finite`, ties to even; at or beyond max + half an ulp: infinity.
double round_to_format(double x, int mantissa_bits, int min_exp, double max_finite);

}  // namespace attn::detail
