// Dropout on the attention weights, judged without the backend's random
// generator (docs/verification/dropout.md). A backend that declares dropout
// runs the case with a probability p and a seed and reports its mask; then:
// - the mask: every visible pair written 0 or 1; the kept share against
//   1 - p, and the agreement of neighbouring weights (keys, queries, heads,
//   batch entries) against an independent draw's, each a two-sided binomial
//   test, together at a stated false-alarm rate;
// - the same seed gives the same bits (out and mask), another seed another mask;
// - out against the float64 attention under that mask (kept weights times
//   1 / (1 - p), the denominator without dropout);
// - the backward, from the same seed, against the float64 gradients under
//   the mask its forward reported: a backward that draws another mask fails.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnbench/backend.hpp"
#include "core/case_data.hpp"
#include "verify/backward.hpp"
#include "verify/compare.hpp"

namespace attn {

struct DropoutConstants {
  // The mask's tests together wrongly fail a correct dropout with at most
  // this probability (Bonferroni over the tests of a run): one case in a
  // million. Measured over 1,000 seeds on the results page.
  static constexpr double significance = 1e-6;
  // The seeds the verifier runs with; the second must draw another mask.
  static constexpr std::uint64_t seed = 0x5eed0001, other_seed = 0x5eed0002, offset = 0;
  // A mask of more elements than this ([batch, heads_q, seq_q, seq_k] bytes)
  // is not drawn: the check is SKIP, naming its size.
  static constexpr std::int64_t max_mask_elements = std::int64_t{1} << 28;
};

// The two-sided binomial p-value of k successes in n trials of probability
// q: twice the smaller tail, at most 1.
double binomial_two_sided(std::int64_t n, std::int64_t k, double q);

// One test of a mask: `successes` of `trials` where each succeeds with
// probability `expected` under a correct dropout.
struct MaskStatistic {
  std::string name;  // "kept", "keys j, j+1 agree", ...
  std::int64_t trials = 0, successes = 0;
  double expected = 0;
  double p_value = 1;
};
struct MaskVerdict {
  std::vector<MaskStatistic> statistics;  // the tests that had a trial
  double threshold = 0;                   // significance / tests: each p-value must reach it
  std::string failure;                    // empty when the mask passes
};

// Per element of the mask ([batch, heads_q, seq_q, seq_k]): 1 where the pair
// is visible (the only elements a backend must write).
std::vector<std::uint8_t> dropout_visible(const CaseData& data);

// The mask's tests at `significance` (its first failure: unwritten or not
// 0/1 elements, then the statistics).
MaskVerdict test_dropout_mask(const Problem& problem, double p, const std::vector<std::uint8_t>& visible,
                              const std::vector<std::uint8_t>& kept, double significance = DropoutConstants::significance);

// The mask's tests over many seeds (attn dropout): the backend runs the
// case's forward with dropout `run_p` and seeds first_seed, first_seed + 1,
// ...; each mask is tested against `p` at `significance`. With run_p = p the
// failures are false alarms (their rate should not exceed the
// significance); with run_p != p they measure the tests' power.
struct DropoutCalibration {
  std::int64_t runs = 0, failed = 0;  // runs, and runs whose mask failed a test
  std::int64_t visible = 0;           // visible weights a run
  std::vector<std::string> tests;     // each test's name
  std::vector<std::int64_t> failed_by_test;  // runs it failed, in the order of `tests`
};
DropoutCalibration calibrate_dropout(const Backend& backend, const CaseData& data, double p, double run_p,
                                     std::uint64_t first_seed, std::int64_t runs, double significance,
                                     const RunOptions& options);

// SKIP reason for a case whose dropout is not judged here ("" when it is).
std::string dropout_out_of_reach(const Problem& problem);

// The forward: the mask, determinism, out under the mask. `visible` is
// dropout_visible(data), computed once for every backend.
Comparison judge_dropout(const Backend& backend, const CaseData& data, double p, const std::vector<std::uint8_t>& visible,
                         const ForwardTruth& truth, const RunOptions& options);
// The backward: the gradients under the mask its own forward reported,
// bounds from the case's a-priori gradient bounds (`a_priori`).
Comparison judge_dropout_backward(const Backend& backend, const CaseData& data, double p,
                                  const std::vector<std::uint8_t>& visible, const std::vector<double>& dout,
                                  bool bias_gradient, const ForwardTruth& truth, const GradientTruth& a_priori,
                                  const RunOptions& options);

}  // namespace attn
