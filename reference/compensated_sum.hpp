// Error-free accumulation for the reference: Neumaier's compensated sum, and
// products split exactly with fma (Dot2). Internal to reference/.
#pragma once

#include <cmath>

namespace attn {

// Neumaier's compensated sum.
struct CompensatedSum {
  double sum = 0, carry = 0;
  void add(double x) {
    double t = sum + x;
    if (std::fabs(sum) >= std::fabs(x)) carry += (sum - t) + x;
    else carry += (x - t) + sum;
    sum = t;
  }
  // Adds a * b exactly split into its rounded product and the error (fma is
  // correctly rounded by IEEE 754, so this is deterministic).
  void add_product(double a, double b) {
    double p = a * b;
    double e = std::fma(a, b, -p);
    add(p);
    carry += e;
  }
  double value() const { return sum + carry; }
};

}  // namespace attn
