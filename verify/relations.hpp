// Metamorphic relations (docs/verification/relations.md): exact properties of
// attention that need no golden. A case is transformed (V scaled by 2^k, Q by
// 2^k with the softmax scale divided by it, heads or keys permuted, a
// constant added to every score of a row, the other layout, dO scaled by
// 2^k) and the backend's results on it must be its own results on the case,
// mapped by what the transformation does to them: bit for bit where the
// backend declares the relation bitwise (Capabilities::bitwise_relations),
// within the relation's bound otherwise. Each tensor is scored by the one
// judge (verify/score.hpp) with the backend's own mapped results as the
// truth, so a relation judges a kernel at any size, where the float64
// reference is out of reach.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "attnbench/backend.hpp"
#include "core/case_data.hpp"
#include "reference/backward.hpp"
#include "verify/backward.hpp"
#include "verify/compare.hpp"
#include "verify/run_case.hpp"
#include "verify/tolerance.hpp"

namespace attn {

// What a transformation does to one result tensor: transformed[e] =
// factor * own[from[e]] + shift (from empty: the identity).
struct TensorMap {
  std::vector<std::int64_t> from;
  double factor = 1, shift = 0;
  std::vector<double> apply(const std::vector<double>& own) const;
};

struct RelationRun {
  unsigned relation = 0;
  std::string what;  // "V x 8", "kv heads and their query groups reversed", ...
  CaseData data;     // the transformed case
  TensorMap out, lse;
  // How far the transformation itself may move a score (the rounding of
  // bias + c to the dtype; 0 when exact).
  double score_error = 0;
  // Elements whose expected |value| is below this are judged within the
  // bound only, never bitwise (a result that lands among the dtype's
  // subnormals rounds on another grid once scaled).
  double exact_above = 0;
  // The backward (a version 3 case): the transformed dO (empty: the case's),
  // and what the transformation does to each gradient (by gradient_parts name).
  bool forward = true, backward = false;
  std::vector<double> dout;
  TensorMap dq, dk, dv, dbias, dsinks;
  const TensorMap& gradient(std::string_view name) const;
};

// The relations that hold for a case, each with the transformed case; the
// backward ones only when `dout` is given. A relation whose conditions the
// case breaks (a causal case for the key permutation, values that 2^k would
// overflow, ...) is left out, its reason in `left_out`. A quantised tensor
// is scaled through its descale (else its scale); quantised cases get no
// permutation yet. Runs whose q, k or v exceed `element_budget` elements (0: no
// limit) are left out. `which`: the relations to build (one at a time keeps
// one transformed copy of a long case in memory).
std::vector<RelationRun> relation_runs(const CaseData& data, const std::vector<double>* dout, std::int64_t element_budget,
                                       std::vector<std::string>* left_out = nullptr, unsigned which = kAllRelations);

// The bound of each element of out and lse within which two correct runs of
// the case (in any key order, any split, any layout) agree, from the inputs
// and one run's out and lse alone, without the reference: twice a plain
// implementation's first-order error bound, times the safety factor
// (docs/verification/relations.md derives it). `score_error`: what the case's
// own transformation adds to every score's error.
Bounds relation_bounds(const CaseData& data, const std::vector<double>& out, const std::vector<double>* lse,
                       double score_error = 0);

// Runs the backend on the transformed case and judges its out and lse
// against its own (`own`, from `data`) mapped: PASS ("EXACT: ..." or "HOLDS
// within the bound: ..."), FAIL beyond the bound, or not bitwise where the
// backend declares the relation bitwise.
Comparison judge_relation(const Backend& backend, const CaseData& data, const BackendRun& own, const RelationRun& run,
                          const RunOptions& options);

// The same for the gradients of a version 3 case: `own` from `data` and
// `dout`; the bound of each gradient is twice its a-priori bound (each run
// within its own bound of the same truth), mapped.
Comparison judge_relation_backward(const Backend& backend, const CaseData& data, const std::vector<double>& dout,
                                   bool bias_gradient, const BackwardRun& own, const GradientTruth& truth,
                                   const RelationRun& run, const RunOptions& options);

}  // namespace attn
