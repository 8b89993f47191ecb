// The backward pass of a backend on a version 3 case (docs/format/v3.md):
// its own forward first (the backward reads its out and lse), then its
// backward plan, with every gradient buffer pre-filled with NaN; and the
// judgement of its gradients against the float64 backward under the
// a-priori gradient bounds (docs/verification/tolerance.md, "Gradients").
#pragma once

#include <string>
#include <vector>

#include "attnbench/backend.hpp"
#include "core/extensions.hpp"
#include "core/case_data.hpp"
#include "fixtures/fixture.hpp"
#include "reference/backward.hpp"
#include "verify/compare.hpp"
#include "verify/tolerance.hpp"

namespace attn {

// The five gradients by name, with their shapes: every place that walks
// them (the golden check, the judgement, determinism) walks this list.
struct GradientPart {
  const char* name;
  Dims4 shape;
  std::vector<double> ReferenceGradients::*values;
  std::vector<double> FixtureGradients::*stored;  // the fixture's golden of it
};
std::vector<GradientPart> gradient_parts(const Problem& problem);

// The float64 gradients of a case and the a-priori bound of each element
// (docs/verification/tolerance.md, "Gradients"), computed once per fixture.
struct GradientTruth {
  ReferenceGradients value;
  ReferenceGradients bound;      // the same shapes
  ReferenceGradients magnitude;  // per element: the sum of |terms| summed into it
  // The measured bound of each gradient, in the order of gradient_parts (empty
  // until measure_gradients ran; then one per part, unused for absent parts).
  std::vector<MeasuredLimit> measured;
};
GradientTruth gradient_truth(const CaseData& data, const std::vector<double>& dout, bool bias_gradient,
                             const ReferenceResult& forward, const ReferenceStats& stats);

// The measured bound (verify/backward_baseline.hpp): the plain backwards'
// max and RMS errors per gradient, floored at one rounding of the result
// plus one of the accumulation at the summed magnitude. `out` is a plain
// forward's output in the dtype. A plain backward whose gradient is not
// finite (scores beyond float32) measures nothing: that gradient keeps only
// its a-priori bound.
void measure_gradients(GradientTruth& truth, const CaseData& data, const std::vector<double>& dout,
                       const std::vector<double>& out, bool bias_gradient);

struct BackwardRun {
  ReferenceGradients got;  // canonical row-major, widened from the dtype; dbias and dsinks empty when not asked
  std::vector<double> out;  // the backend's own forward output the backward started from (canonical)
  double seconds = 0;      // forward and backward, prepare and run
};

// Throws whatever the backend throws (attn::Unsupported: SKIP).
BackwardRun run_backward(const Backend& backend, const CaseData& data, const std::vector<double>& dout, bool bias_gradient,
                         const RunOptions& options);

// Non-empty when a true gradient is not a finite number of the dtype (a case
// whose values are near the dtype's largest): no backend can return it, so
// its backward is SKIP with this reason.
std::string gradients_beyond(const Problem& problem, const ReferenceGradients& truth);

// "" when two runs' gradients are identical bit for bit (dq aside when it
// may vary), else which gradient differs first and where.
std::string backward_differences(const Problem& problem, const BackwardRun& a, const BackwardRun& b, bool dq_may_vary);

// The gradients a declared convention gives (verify/conventions.hpp) where
// it has a backward. empty_rows_mean_v weighs every key of a row with no
// visible key 1/seq_k, so that row's dO / seq_k reaches the dV of each of
// them; two ways, as frameworks hide keys: by a fill (np.where(mask, s,
// -1e9): the scores are a constant, dQ and dK receive nothing) or additively
// (s - 1e9: the uniform weights still differentiate the scores, so
// dS_j = (dP_j - mean dP) / seq_k reaches dQ and dK too). Each is the truth so
// changed, with bounds and measured floors widened by the added terms'
// rounding; `rows` 0 when no convention applies or no row has no visible key.
// Dense K and V only (Python backends, the ones that declare conventions,
// get no packed or paged case).
struct ConventionalGradients {
  GradientTruth truth;
  std::int64_t rows = 0;
  bool additive = false;
  std::string why;  // the declaration's own words
};
ConventionalGradients conventional_gradients(const std::vector<Convention>& conventions, const CaseData& data,
                                             const std::vector<double>& dout, const GradientTruth& truth, bool additive);

// Every element of every gradient within its bound, and (when measured) each
// gradient's max and RMS error within k times the plain backwards'; a NaN or
// infinity fails, naming the gradient and the element. Fills the per-gradient
// scores: errors, budgets, direction and where the non-finite values are.
Comparison compare_gradients(const Problem& problem, const GradientTruth& truth, const BackwardRun& run);

}  // namespace attn
