// The rounding-bias test. Correct rounding (to nearest) leaves errors whose
// signs balance; truncation, rounding toward zero or downward, and biased
// exponentials do not. The test counts signs per row (the elements of one row
// share the row's denominator, so their errors are not independent; rows are),
// and asks whether the rows' mean sign differs from that of the plain
// implementation (verify/baseline.hpp) on the same rows beyond chance (a
// paired t statistic over rows) and beyond a size that matters. The pairing
// matters: some data make every correct implementation lean one way (huge
// scores whose float32 rounding moves weight between near-tied keys).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attn {

struct SignStatistic {
  std::int64_t rows = 0;  // rows where the backend or the baseline has an inexact element
  double mean = 0;        // mean over rows of the row's mean sign less the baseline's, in [-2, 2]
  double t = 0;           // mean / (sd / sqrt(rows)); +-inf when every row agrees
};

struct BiasTest {
  SignStatistic toward_zero;  // sign(got - truth) * sign(truth): < 0 is toward zero
  SignStatistic upward;       // sign(got - truth): < 0 is downward
  bool biased = false;        // one of them is significant and large (verify/tolerance.hpp)
  std::string finding;        // what was found, when biased
};

// `truth`, `got` and `baseline` are [rows, width]; rows whose `counts[row]`
// is false are left out (rows with no visible key, held to exactly 0
// elsewhere). Errors no larger than `exact_within` count as exact (no sign).
// Rows are evidence only when independent: a row whose `identity` row (the
// truth's by default) is bitwise that of an earlier row is the same
// computation again (uniform weights, repeated heads) and counts once.
// Elements whose truth is below `below` (the dtype's smallest normal: the
// subnormals' grid, where underflow decides the direction) carry no sign.
BiasTest rounding_bias(const std::vector<double>& truth, const std::vector<double>& got,
                       const std::vector<double>& baseline, std::int64_t width, const std::vector<char>& counts,
                       double exact_within = 0, const std::vector<double>* identity = nullptr, double below = 0);

}  // namespace attn
