// The verdict of one run (a backend, a fixture, a run configuration and a
// direction) and the judgement of the forward pass. A run's tensors are each
// scored by verify/score.hpp; the verdict is PASS, FAIL, SKIP (with the
// backend's reason), MISTRUSTED (matched, but a tensor proved little: most
// of its truth is within the bound of zero) or DIFFERS (docs/verification/
// tolerance.md#differs: matched, except what a convention the backend
// declared for its framework explains).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnbench/problem.hpp"
#include "core/case_data.hpp"
#include "fixtures/fixture.hpp"
#include "reference/reference.hpp"
#include "verify/conventions.hpp"
#include "verify/score.hpp"
#include "verify/tolerance.hpp"

namespace attn {

enum class Verdict { pass, fail, skip, mistrusted, differs };
std::string_view verdict_name(Verdict verdict);
inline std::string_view format_as(Verdict verdict) { return verdict_name(verdict); }
// The verdicts from the one that outranks every other to the least: the
// verdict of a case over several runs is the first of these that any run has.
inline constexpr std::array<Verdict, 5> kVerdictSeverity = {Verdict::fail, Verdict::mistrusted, Verdict::differs,
                                                            Verdict::pass, Verdict::skip};

struct Comparison {
  Verdict verdict = Verdict::pass;
  std::string reason;  // why FAIL, SKIP, MISTRUSTED or DIFFERS (every failed check, "; " between)
  bool compared = false;  // something was scored (false when the backend threw, or it was skipped)
  std::vector<TensorScore> tensors;  // one per tensor scored, each with its own figures

  void fail(std::string why);  // marks FAIL and appends the reason
  // Adds a tensor's score; each of its failures fails the comparison.
  void add(TensorScore score);
  // After every check: a PASS with a tensor that proved little becomes
  // MISTRUSTED; a convention's failure is a FAIL; a PASS whose empty rows
  // followed a declared convention becomes DIFFERS.
  void conclude(const ConventionOutcome& conventions = {});
  // A comparison against the truth a declared convention gives: its PASS is
  // DIFFERS (why it differs from the format); a MISTRUSTED keeps its verdict
  // with `why` appended.
  void as_declared(const std::string& why);
  // The tensor with the largest error/bound (the first of equals); nullptr when none was scored.
  const TensorScore* worst() const;
  const TensorScore* tensor(std::string_view name) const;
};

// Everything the forward checks of one SDPA fixture need, computed once for
// every backend and run configuration (canonical layout).
struct ForwardTruth {
  Problem problem;
  ReferenceResult truth;  // out and lse in float64
  ReferenceStats stats;
  Bounds bounds;          // the a-priori bounds of out and lse
  // The rest only when some backend runs the case (measure_forward):
  MeasuredLimit measured;  // of out
  std::vector<std::vector<double>> baselines;  // the plain formulations' outs (verify/baseline.hpp)
  std::vector<double> golden, tolerance;       // the fixture's out and its own atol + rtol |out|, when it has them
  std::string warning;                          // about the fixture's own tolerance; empty when none
  CaseData probe;                               // the case with V replaced by ones
  std::vector<double> probe_value, probe_bound;  // per element of out: what V = 1 gives and how far it may be
  std::vector<std::vector<double>> probe_baselines;

  TensorTruth out() const;
  TensorTruth lse() const;
  TensorTruth probe_out() const;
};

// The truth and the a-priori bounds (enough to check the fixture's golden).
ForwardTruth forward_truth(const CaseData& data, int threads);
// The measured bound, the plain formulations, the normalisation probe and the
// fixture's own tolerance (`fixture` may be null: no golden to hold to).
void measure_forward(ForwardTruth& truth, const CaseData& data, const Fixture* fixture, int threads);

// What one forward run gave (canonical [b, h, i, d]); for results another
// tool recorded, no probe.
struct ForwardResult {
  std::vector<double> out;
  std::optional<std::vector<double>> lse;
  std::optional<std::vector<double>> probe;  // the output with V = 1
  std::string guard_damage, probe_guard_damage;  // writes outside the output
  ConventionOutcome conventions;            // rows that followed a declared convention
  std::string probe_conventions_failure;
};

// out (and lse when returned) against their truth; the probe against 1 (less
// a sink's share) on every visible row and exactly 0 on the others.
Comparison judge_forward(const ForwardTruth& truth, const ForwardResult& result);

}  // namespace attn
