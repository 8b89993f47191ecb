// Deterministic exp and log for double: the same bits on every machine and C
// library, because they use only IEEE-754 +, -, *, / (correctly rounded) and
// exact power-of-two scaling. The reference and the fixture generator use them
// so that golden files are bit-identical everywhere. Accurate to about 1 ulp.
// Translation units using them must be compiled with -ffp-contract=off.
#pragma once

#include <cstddef>
#include <cstdint>

namespace attn::detmath {

double exp(double x);
// y[i] = exp(x[i]) for i < n, bit for bit; x and y may be the same array.
// Four at a time with AVX2 where the CPU has it: the same IEEE operations in
// the same order, so the same bits (the reference spends most of its time here).
void exp_n(const double* x, double* y, std::size_t n);
double log(double x);  // x > 0; log(0) = -inf
double tanh(double x); // from exp, and a Taylor series below |x| = 1/4

}  // namespace attn::detmath
