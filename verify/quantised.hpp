// Format version 4 in the verifier (docs/verification/tolerance.md,
// "Quantised inputs"): the truth is the attention of the exactly dequantised
// values; what a plain implementation computes from them; the quantisation's
// own error, reported beside the verdict and never in it; and the
// scale-plumbing probe, which runs every quantised case again with each
// descale or scale multiplied by powers of two (the codes unchanged), so that
// a scale dropped, applied twice or read for the wrong head fails, naming it,
// even where the case's own scales are 1.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/case_data.hpp"
#include "verify/compare.hpp"

namespace attn {

// The case as a plain implementation in its dtype computes it: each
// quantised tensor's values dequantised and rounded to the dtype (the
// measured bound's formulations read these). With `descale_apart`, as one
// that rounds (code - zero point) * scale to the dtype and multiplies the
// descale in afterwards, rounding again: a second, independent draw of the
// inputs' rounding, so that a backend that applies its descale elsewhere is
// not held to one lucky draw (the measured bound takes the least accurate).
// With `through_float32`, as one that dequantises in float32 arithmetic
// ((code - zero point) * scale, then * descale, each a float32 rounding) and
// casts the float to the dtype: PyTorch's `(codes.float() - zp) * scale` then
// `.to(bfloat16)`, and the CPU kernels' path. Its second rounding is no
// independent draw: a min/max quantiser puts a group's extreme codes a
// float32 ulp from a 16-bit midpoint, and each then rounds away from zero
// (fuzz seed 10 case 212: 72 of 3840 K elements a 16-bit ulp from the
// direct rounding, all outward).
CaseData in_compute_dtype(const CaseData& data, bool descale_apart = false, bool through_float32 = false);

// The attention of the dequantised values against that of the original
// ones, where the fixture stores the originals (of every quantised tensor
// that has them): the error the quantisation itself makes.
struct QuantisationError {
  double max = 0;       // max |out(dequantised) - out(original)|
  double relative = 0;  // max over max |out(original)| (0 when that is 0)
  std::string text() const;  // "quantisation error 0.031 (4.2% of max |out|)"
};
std::optional<QuantisationError> quantisation_error(const CaseData& data, const ReferenceResult& truth, int threads);

// One run of the scale-plumbing probe: the case with one tensor's descale
// (or scale) multiplied element by element by 2^(1 + index % 3), its own
// truth and bounds.
struct ScaleProbe {
  std::string what;  // "k_descale x2^(1 + i % 3)"
  CaseData data;
  ForwardTruth truth;
};
// Every probe of a quantised case (none for another), with truth measured.
std::vector<ScaleProbe> scale_probes(const CaseData& data, int threads);

// A probe's out scored, under the name "out (<what>)"; added to `comparison`.
void judge_scale_probe(Comparison& comparison, const ScaleProbe& probe, const std::vector<double>& out);

}  // namespace attn
