// The backward pass of a backend on a version 3 case (docs/format/v3.md):
// its own forward first (the backward reads its out and lse), then its
// backward plan, with every gradient buffer pre-filled with NaN; and the
// judgement of its gradients, each scored as a tensor (verify/score.hpp)
// against the float64 backward under the gradient bounds
// (docs/verification/tolerance.md, "Gradients").
#pragma once

#include <map>
#include <string>
#include <utility>
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
// (docs/verification/tolerance.md, "Gradients").
struct GradientTruth {
  ReferenceGradients value;
  ReferenceGradients bound;      // the same shapes
  ReferenceGradients magnitude;  // per element: the sum of |terms| summed into it
  // The measured bound of each gradient, in the order of gradient_parts
  // (empty until measured; then one per part, unused for absent parts).
  std::vector<MeasuredLimit> measured;
  // One TensorTruth per gradient the case has, in the order of gradient_parts.
  std::vector<TensorTruth> tensors(const Problem& problem) const;
};

// The gradients of one fixture, computed once: the truth and its a-priori
// bounds, and the measured bounds once per distinct forward output that a
// backward started from (D = rowsum(dO o O) starts there, so a forward's
// error, judged on its own, is not charged to its backward twice).
class BackwardTruth {
 public:
  BackwardTruth(const CaseData& data, const FixtureGradients& gradients, const ForwardTruth& forward);
  const GradientTruth& a_priori() const { return truth_; }
  // Non-empty when a true gradient is not a finite number of the dtype (a
  // case whose values are near the dtype's largest): no backend can return
  // it, so its backward is SKIP with this reason.
  const std::string& beyond() const { return beyond_; }
  // The plain backwards' errors (verify/backward_baseline.hpp) from `out`,
  // floored at one rounding of the result plus one of the accumulation at
  // the summed magnitude. A plain backward whose gradient is not finite
  // (scores beyond float32) measures nothing: that gradient keeps only its
  // a-priori bound.
  const GradientTruth& measured_from(const std::vector<double>& out);
  const CaseData& data() const { return data_; }
  const FixtureGradients& gradients() const { return gradients_; }

 private:
  const CaseData& data_;
  const FixtureGradients& gradients_;
  GradientTruth truth_;
  std::string beyond_;
  std::vector<std::pair<std::vector<double>, GradientTruth>> measured_;
};

struct BackwardRun {
  ReferenceGradients got;  // canonical row-major, widened from the dtype; dbias and dsinks empty when not asked
  std::vector<double> out;  // the backend's own forward output the backward started from (canonical)
  std::vector<std::uint8_t> kept;  // with dropout: the mask its forward reported (verify/run_case.hpp)
  double seconds = 0;      // forward and backward, prepare and run
};

// Throws whatever the backend throws (attn::Unsupported: SKIP). With
// `dropout` active, the forward gets it with a mask buffer and the backward
// the same p, seed and offset (no mask: it replays its forward's).
BackwardRun run_backward(const Backend& backend, const CaseData& data, const std::vector<double>& dout, bool bias_gradient,
                         const RunOptions& options, const DropoutView& dropout = {});

// Every gradient scored against `truth` (a NaN or infinity fails, naming the
// gradient and the element).
Comparison judge_backward(const Problem& problem, const GradientTruth& truth, const ReferenceGradients& got);

// judge_backward, and when it fails, against the gradients a declared
// convention gives on rows with no visible key (DIFFERS when they are its).
// empty_rows_mean_v weighs every key of a row with no visible key 1/seq_k,
// so that row's dO / seq_k reaches the dV of each of them; two ways, as
// frameworks hide keys: by a fill (np.where(mask, s, -1e9): the scores are a
// constant, dQ and dK receive nothing) or additively (s - 1e9: the uniform
// weights still differentiate the scores, so dS_j = (dP_j - mean dP) /
// seq_k reaches dQ and dK too). Each is the truth so changed, with bounds
// and measured floors widened by the added terms' rounding. Dense K and V
// only (Python backends, the ones that declare conventions, get no packed
// or paged case).
Comparison judge_backward(const Problem& problem, const GradientTruth& truth, const ReferenceGradients& got,
                          const std::vector<Convention>& conventions, const CaseData& data, const std::vector<double>& dout);

// What empty_rows_mean_v adds to the gradients dq, dk and dv of `data`
// under `dout` (either way above): per element the sum of the added terms,
// the sum of their magnitudes and how many; `rows` is how many rows have no
// visible key (0: nothing is added). The layers' judge carries them through
// the projections (verify/layer_backward.hpp).
struct MeanVTerms {
  std::int64_t rows = 0;
  ReferenceGradients value, abs, count;
};
MeanVTerms mean_v_terms(const CaseData& data, const std::vector<double>& dout, bool additive);

// truth's a-priori bounds, widened where a declared convention adds terms to
// the gradients (empty_rows_mean_v, either way): what two runs of a backend
// that follows it may differ by beside their own rounding (the relations).
ReferenceGradients convention_widened_bounds(const std::vector<Convention>& conventions, const CaseData& data,
                                             const std::vector<double>& dout, const GradientTruth& truth);

// "" when two runs' gradients are identical bit for bit (dq aside when it
// may vary), else which gradient differs first and where.
std::string backward_differences(const Problem& problem, const BackwardRun& a, const BackwardRun& b, bool dq_may_vary);

// Each backend's first backward per layout, which every later run (another
// thread count) must match bit for bit.
using FirstBackwards = std::map<std::pair<const Backend*, Layout>, BackwardRun>;

// A backend's backward on `data` (the fixture in the run's layout): its
// gradients judged, then determinism, a verdict of its own: the same run
// again, and the first run of this layout at another thread count, bit for
// bit (unless the backend declares what may differ).
Comparison judge_backend_backward(const Backend& backend, const CaseData& data, BackwardTruth& truth,
                                  const RunOptions& options, FirstBackwards& first);

}  // namespace attn
