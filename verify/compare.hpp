// Comparison of one backend's output with the golden, and the verdict:
// PASS, FAIL, SKIP (with the backend's reason), MISTRUSTED (matched, but the
// case proved little: most of the golden is within the bound of zero) or
// DIFFERS (matched, except rows with no visible key, which follow a convention
// the backend declared for its framework: verify/conventions.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnbench/problem.hpp"
#include "attnbench/tensor.hpp"
#include "verify/bias.hpp"
#include "verify/conventions.hpp"
#include "verify/tolerance.hpp"

namespace attn {

enum class Verdict { pass, fail, skip, mistrusted, differs };
std::string_view verdict_name(Verdict verdict);
inline std::string_view format_as(Verdict verdict) { return verdict_name(verdict); }

// One gradient's figures in a backward outcome (docs/verification/tolerance.md, "Gradients").
struct GradientScore {
  std::string name;                    // dq, dk, dv, dbias or dsinks
  double max_abs_error = 0, rms_error = 0;  // over its finite elements
  double worst_ratio = 0;              // max |error| / a-priori bound (inf for a non-finite element)
  std::optional<double> baseline_ratio;  // the measured budget: 1 = at the limit
  double baseline_max_ratio = 0, baseline_rms_ratio = 0;  // max and RMS error over the plain backwards'
  // Direction against the truth: cosine of the angle and ||got|| / ||truth||
  // (both 1 when both are zero; NaN when undefined: a non-finite result).
  double cosine = 1, norm_ratio = 1;
  std::int64_t nan_elements = 0, infinite_elements = 0;
  std::int64_t nonfinite_rows = 0;     // distinct [b, h, i] holding a NaN or an infinity
  std::vector<Dims4> nonfinite_at;     // the first few of them, element coordinates
};

struct Comparison {
  Verdict verdict = Verdict::pass;
  std::string reason;             // why FAIL, SKIP, MISTRUSTED or DIFFERS (every failed check, "; " between)
  bool compared = false;          // an output was compared (false when the backend threw, or it was skipped)
  std::int64_t nan_elements = 0, infinite_elements = 0;  // of the output
  // The a-priori bound, element by element, against the float64 truth.
  double max_abs_error = 0;       // over out
  double max_rel_error = 0;       // over out elements whose truth is non-zero
  double worst_ratio = 0;         // max over out of |error| / bound (inf for a non-finite output)
  double bound_at_worst = 0;
  std::int64_t worst_index = -1;  // flat index into out of the worst element
  Dims4 worst_coords{};           // [b, h, i, d] of that element
  std::optional<double> lse_worst_ratio;  // when the backend returned lse
  double informative_fraction = 0;  // share of out elements with |truth| > bound or held to exactly 0
  // The measured bound: errors against the plain implementation's (floored).
  double rms_error = 0;
  std::optional<double> baseline_ratio;  // max(max error / baseline max, RMS / baseline RMS); limit k
  double baseline_max_ratio = 0, baseline_rms_ratio = 0;  // the two parts
  // The rounding-bias test over the output.
  BiasTest bias;
  // The normalisation probe (V = ones), when it ran.
  std::optional<double> probe_ratio;  // max over visible rows of |got - 1| / probe bound
  BiasTest probe_bias;
  // The fixture's own atol/rtol against its stored out, when it has them.
  std::optional<double> fixture_ratio;  // max of |got - out| / (atol + rtol |out|)
  // A backward outcome's gradients, each on its own (the fields above hold the worst of them).
  std::vector<GradientScore> gradients;

  void fail(std::string why);  // marks FAIL and appends the reason
  // After every check: a PASS whose empty rows followed a declared convention
  // becomes DIFFERS; a convention's failure is a FAIL.
  void conclude(const ConventionOutcome& conventions);
};

// A result proves little when fewer than this share of its elements could be
// told apart from zero within their bound.
inline constexpr double kMinInformativeFraction = 0.10;

struct CompareInputs {
  const Problem& problem;
  const std::vector<double>& truth_out;      // the float64 reference of the fixture's inputs
  const std::vector<double>& truth_lse;
  const Bounds& bounds;                      // a-priori, per element and per row
  const std::vector<std::int64_t>& visible;  // per row: visible keys (0 = fully masked row)
  const std::vector<double>& got_out;        // canonical [b, h, i, d]
  const std::vector<double>* got_lse;        // nullptr when the backend has none
  const MeasuredLimit* measured = nullptr;   // nullptr: no measured bound (unit tests of the a-priori one)
  // The plain formulations' outs (verify/baseline.hpp), for the bias test:
  // biased means leaning beyond every one of them.
  const std::vector<std::vector<double>>* baselines = nullptr;
  const std::vector<double>* golden_out = nullptr;         // the fixture's out, when it has a tolerance
  const std::vector<double>* fixture_tolerance = nullptr;  // atol + rtol |out| per element
};

Comparison compare_output(const CompareInputs& in);

// Adds the normalisation probe: `got` is the backend's output with V replaced
// by ones; every visible row must be 1 within `bounds[row]`, every hidden row
// exactly 0, and (16-bit types) the errors must not lean one way; `baselines`
// are the plain formulations' probe outputs (a row may also be as far from 1
// as k times the farthest of them on that row, for sums whose rounding errors
// add up, such as many equal weights), `truth` the case's own truth (which
// rows are independent).
void check_probe(Comparison& comparison, const Problem& problem, const std::vector<std::int64_t>& visible,
                 const std::vector<double>& bounds, const std::vector<double>& got,
                 const std::vector<std::vector<double>>& baselines, const std::vector<double>& truth,
                 const std::vector<double>& wanted = {});

// The bias test against each baseline; the least biased result (biased only
// when biased against all).
BiasTest least_biased(const std::vector<double>& truth, const std::vector<double>& got,
                      const std::vector<std::vector<double>>& baselines, std::int64_t width,
                      const std::vector<char>& counts, double exact_within, const std::vector<double>* identity);

}  // namespace attn
