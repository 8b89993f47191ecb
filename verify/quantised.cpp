#include "verify/quantised.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace attn {

CaseData in_compute_dtype(const CaseData& data, bool descale_apart, bool through_float32) {
  CaseData plain = data;
  const DType dtype = data.problem.dtype;
  for (char t : {'q', 'k', 'v'}) {
    const QuantSpec& spec = data.problem.quant(t);
    if (!spec.quantised()) continue;
    std::vector<double>& x = plain.values(t);
    if (through_float32) {
      // (code - zero point) is exact in float32 and one product is one
      // rounding: the float32 result is the exact value rounded to float32.
      std::vector<double> base = x;
      if (spec.descale != Descale::none) {
        CaseData undescaled = data;
        std::fill(undescaled.quant(t).descale.begin(), undescaled.quant(t).descale.end(), 1.0f);
        undescaled.dequantise();
        base = undescaled.values(t);
      }
      for (std::size_t i = 0; i < x.size(); ++i) {
        double f = round_to_dtype(base[i], DType::f32);
        if (spec.descale != Descale::none && base[i] != 0) f = round_to_dtype(f * (x[i] / base[i]), DType::f32);
        x[i] = round_to_dtype(f, dtype);
      }
      continue;
    }
    if (!descale_apart || spec.descale == Descale::none) {
      for (double& value : x) value = round_to_dtype(value, dtype);
      continue;
    }
    CaseData undescaled = data;  // the same codes with every descale 1
    std::fill(undescaled.quant(t).descale.begin(), undescaled.quant(t).descale.end(), 1.0f);
    undescaled.dequantise();
    const std::vector<double>& base = undescaled.values(t);
    for (std::size_t i = 0; i < x.size(); ++i) {
      // value = base * descale exactly, so value / base is the element's descale exactly
      const double descale = base[i] != 0 ? x[i] / base[i] : 0.0;
      x[i] = round_to_dtype(round_to_dtype(base[i], dtype) * descale, dtype);
    }
  }
  return plain;
}

std::string QuantisationError::text() const {
  return fmt::format("quantisation error {:.3g} ({:.2g}% of max |out|)", max, 100.0 * relative);
}

std::optional<QuantisationError> quantisation_error(const CaseData& data, const ReferenceResult& truth, int threads) {
  CaseData original = data;
  bool any = false;
  for (char t : {'q', 'k', 'v'}) {
    const QuantData& quant = data.quant(t);
    if (!data.problem.quant(t).quantised() || quant.original.empty()) continue;
    original.values(t) = quant.original;
    any = true;
  }
  if (!any) return std::nullopt;
  const ReferenceResult reference = reference_attention(original, nullptr, threads);
  QuantisationError e;
  double largest = 0;
  for (std::size_t i = 0; i < truth.out.size(); ++i) {
    e.max = std::max(e.max, std::fabs(truth.out[i] - reference.out[i]));
    largest = std::max(largest, std::fabs(reference.out[i]));
  }
  e.relative = largest > 0 ? e.max / largest : 0.0;
  return e;
}

namespace {

// Multiplies each factor by 2^(sign (1 + i % 3)): different for neighbouring
// heads and batch entries, so a descale read for the wrong head or entry is
// caught too; downwards (sign -1) when upwards would take the tensor's values
// past the dtype's range (the changed case must be as valid as the case).
// Each factor stays a normal float32, so every value stays exact.
void powers_of_two(std::vector<float>& values, int sign) {
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = std::ldexp(values[i], sign * (1 + static_cast<int>(i % 3)));
}

}  // namespace

std::vector<ScaleProbe> scale_probes(const CaseData& data, int threads) {
  std::vector<ScaleProbe> probes;
  for (char t : {'q', 'k', 'v'}) {
    const QuantSpec& spec = data.problem.quant(t);
    if (!spec.quantised()) continue;
    for (const bool descale : {true, false}) {
      if (descale ? spec.descale == Descale::none : !spec.has_scale()) continue;
      ScaleProbe probe;
      probe.what = fmt::format("{}_{} x2^(1 + i % 3)", t, descale ? "descale" : "scale");
      probe.data = data;
      QuantData& quant = probe.data.quant(t);
      double largest = 0;
      for (double x : data.values(t)) largest = std::max(largest, std::fabs(x));
      const int sign = largest * 8 > largest_finite(data.problem.dtype) / 4 ? -1 : 1;
      powers_of_two(descale ? quant.descale : quant.scale, sign);
      if (sign < 0) probe.what = fmt::format("{}_{} x2^-(1 + i % 3)", t, descale ? "descale" : "scale");
      quant.original.clear();
      probe.data.dequantise();
      probe.truth = forward_truth(probe.data, threads);
      measure_forward(probe.truth, probe.data, nullptr, threads);
      probes.push_back(std::move(probe));
    }
  }
  return probes;
}

void judge_scale_probe(Comparison& comparison, const ScaleProbe& probe, const std::vector<double>& out) {
  TensorTruth truth = probe.truth.out();
  truth.name = fmt::format("out ({})", probe.what);
  truth.what = fmt::format("scale probe, the same codes with {}: out", probe.what);
  truth.decides_trust = false;
  comparison.add(score_tensor(truth, out));
}

}  // namespace attn
