// One judge for every tensor. Each tensor a run returns (out, lse, the
// normalisation probe's out, a layer's y, every gradient of the backward
// pass) is scored by the same function against its float64 truth, its
// a-priori bound per element and, where measured, the plain same-precision
// implementations' errors (docs/verification/tolerance.md). A score holds
// that tensor's own figures and the coordinates of its worst element; a
// run's verdict is what its scores add up to (verify/compare.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnbench/dtype.hpp"
#include "attnbench/tensor.hpp"
#include "verify/bias.hpp"
#include "verify/tolerance.hpp"

namespace attn {

// What one tensor is judged against, built once per fixture and shared by
// every backend and run configuration. The pointers outlive the scoring.
struct TensorTruth {
  std::string name;  // as the JSON and the table name it: out, lse, probe, y, dq, dk, dv, dbias, dsinks
  std::string what;  // how a failure names its elements ("normalisation probe (V = 1): out"); name when empty
  DType dtype = DType::f32;
  Dims4 shape{};     // its logical row-major shape [.., .., .., width]: the coordinates of a flat index
  const std::vector<double>* value = nullptr;  // the truth; a non-finite truth must be matched exactly
  const std::vector<double>* bound = nullptr;  // the a-priori bound of each element
  // Per row of shape[3] elements: 0 where the row has no visible key. Such a
  // row must be exactly 0 and is left out of the measured norms and the bias
  // test. nullptr: every row counts.
  const std::vector<std::int64_t>* visible = nullptr;
  const Bounds* hull = nullptr;  // out: no weighted mean of the visible values leaves their range
  // The measured bound: max and RMS error within k times the plain
  // formulations' (`measured_of` names them in a failure).
  const MeasuredLimit* measured = nullptr;
  std::string_view measured_of = "plain implementation's";
  // The rounding-bias test, for 16-bit dtypes only: the plain formulations'
  // results; errors within `exact_within` carry no sign; rows whose
  // `identity` row repeats an earlier one count once (the truth's by default).
  const std::vector<std::vector<double>>* baselines = nullptr;
  double exact_within = 0;
  const std::vector<double>* identity = nullptr;
  // The fixture's own rule: its stored values and atol + rtol |x| per element.
  const std::vector<double>* fixture_values = nullptr;
  const std::vector<double>* fixture_tolerance = nullptr;
  // Whether its informative share decides MISTRUSTED. Not for lse (a
  // logarithm: a value near 0 is a weight near 1, not a result near zero) nor
  // for the probe (its truth is 1 by construction).
  bool decides_trust = true;
};

// The measured bound's figures: each error over the plain formulations' (floored).
struct MeasuredScore {
  double budget = 0;    // max(over_max / baseline_max_share, over_rms): 1 = at the limit
  double over_max = 0, over_rms = 0;
};

struct TensorScore {
  std::string name;
  std::int64_t elements = 0;
  // Non-finite values where the truth is finite (or a different non-finite value).
  std::int64_t nan_elements = 0, infinite_elements = 0;
  std::int64_t nonfinite_rows = 0;    // distinct rows holding one
  std::vector<Dims4> nonfinite_at;    // the first few, element coordinates
  double max_abs_error = 0;           // over the elements where both are finite
  double max_rel_error = 0;           // of those, over elements whose truth is not zero
  double rms_error = 0;               // over the rows that count (rows with a visible key)
  // The a-priori check: max |error| / bound (inf for a non-finite value, a
  // hidden row not exactly 0, or a value outside the visible values' range),
  // and where: the first element that reaches it.
  double worst_ratio = 0;
  std::int64_t worst_index = -1;      // flat index; -1 when the tensor is empty
  Dims4 worst_at{};
  double got_at_worst = 0, truth_at_worst = 0, bound_at_worst = 0;
  // Share of elements that tell something, where a zero would fail: |truth|
  // above its a-priori bound and above the largest error the measured bound
  // allows one element (baseline_max_share k times the plain formulations'),
  // or held to exactly their value (a hidden row, a bound of 0, a non-finite truth).
  double informative_fraction = 0;
  bool decides_trust = true;
  std::optional<MeasuredScore> measured;  // when measured and every value is finite
  std::optional<BiasTest> bias;           // when the bias test ran
  // Direction against the truth: cosine and ||got|| / ||truth|| (1 and 1 when
  // both are zero; NaN when a value is not finite).
  double cosine = 1, norm_ratio = 1;
  std::optional<double> fixture_ratio;    // max |got - stored| / (atol + rtol |stored|)
  std::vector<std::string> failures;      // every failed check, in words naming the tensor
  bool failed() const { return !failures.empty(); }
};

TensorScore score_tensor(const TensorTruth& truth, const std::vector<double>& got);

// The coordinates of a flat row-major index in `shape` (extents of 0 count as 1).
Dims4 element_coordinates(const Dims4& shape, std::size_t flat);

// The bias test against each baseline; the least biased result (biased only
// when biased against all).
BiasTest least_biased(const std::vector<double>& truth, const std::vector<double>& got,
                      const std::vector<std::vector<double>>& baselines, std::int64_t width,
                      const std::vector<char>& counts, double exact_within, const std::vector<double>* identity,
                      double below = 0);

// A result proves little when fewer than this share of its elements could be
// told apart from zero within their bound.
inline constexpr double kMinInformativeFraction = 0.10;

}  // namespace attn
