// A backend's declared framework conventions (attnbench/backend.hpp, Convention)
// on rows with no visible key, checked rather than trusted: such a row must
// hold either the format's value (0) or exactly what a declared convention
// gives, and everything else is judged as for any backend.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnbench/backend.hpp"
#include "core/extensions.hpp"
#include "core/case_data.hpp"

namespace attn {

struct ConventionOutcome {
  std::int64_t empty_rows = 0;     // rows with no visible key
  std::int64_t rows_followed = 0;  // of those, rows that follow a convention instead of the format
  std::string followed;            // the convention they follow, in words
  std::string failure;             // rows that follow neither, in words; empty when none
};

// Checks every row of `data` with no visible key in `out` (canonical
// [b, h, i, d]); a row that follows a declared convention is overwritten with
// the format's value (0, and -inf in lse) so the rest of the judgement sees
// the format; a row that follows neither is left as it is (the judgement then
// fails it) and named in `failure`.
ConventionOutcome apply_conventions(const std::vector<Convention>& conventions, const CaseData& data,
                                    std::vector<double>& out, std::vector<double>* lse);

// The same for a whole layer run by the backend's own layer (Backend::
// runs_layers): a query (b, i) with a fully hidden row in any head must give
// the format's y row, or the y that the declared convention's attention rows
// give through the output projection (within twice `bound`, the layer's
// a-priori bound per element of y). Rows that follow it are replaced by the
// truth `reference_y`.
struct LayerReference;
struct LayerData;
ConventionOutcome apply_layer_conventions(const std::vector<Convention>& conventions, const LayerData& layer,
                                          const LayerReference& reference, const std::vector<double>& bound,
                                          std::vector<double>& y);

// What DIFFERS says about an outcome that followed a convention.
std::string differs_reason(const ConventionOutcome& outcome);

}  // namespace attn
