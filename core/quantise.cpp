#include "core/quantise.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace attn {

namespace {

// The largest value a code of the encoding holds (before its scales).
double largest_code(Encoding e) {
  switch (e) {
    case Encoding::e4m3: return 448.0;
    case Encoding::e5m2: return 57344.0;
    case Encoding::q8_0: return 127.0;
    case Encoding::q4_0: return 8.0;
    default: return static_cast<double>(std::max(code_max(e), -code_min(e)));
  }
}

// The descale slot of stored row (b, h, s): entry * heads_kv + kv head, or
// 0 for one per tensor. Paged K and V share one descale per kv head across
// entries (a page's codes have one value, whoever reads it).
std::int64_t descale_slot(const CaseData& data, char t, std::int64_t b, std::int64_t h, std::int64_t s) {
  const Problem& p = data.problem;
  const QuantSpec& spec = p.quant(t);
  if (spec.descale != Descale::entry_head) return 0;
  const std::int64_t g = t == 'q' ? h / p.group_size() : h;
  std::int64_t entry = b;
  if (p.ragged) {
    const auto& cu = t == 'q' ? data.cu_seqlens_q : data.cu_seqlens_k;
    entry = std::upper_bound(cu.begin(), cu.end(), s) - cu.begin() - 1;
    if (entry >= p.batch) entry = -1;  // past the last sequence: no entry's
  } else if (p.paged() && t != 'q') {
    entry = -1;
  }
  return entry < 0 ? -1 - g : entry * p.heads_kv + g;  // negative: every entry's descale of kv head g
}

void pack_codes(Encoding e, const std::vector<double>& y, std::uint8_t* row) {
  const std::int64_t dim = static_cast<std::int64_t>(y.size());
  switch (e) {
    case Encoding::e4m3:
      for (std::int64_t d = 0; d < dim; ++d) row[d] = float_to_e4m3(y[static_cast<std::size_t>(d)], true);
      return;
    case Encoding::e5m2:
      for (std::int64_t d = 0; d < dim; ++d) row[d] = float_to_e5m2(y[static_cast<std::size_t>(d)], true);
      return;
    case Encoding::s8:
    case Encoding::u8:
      for (std::int64_t d = 0; d < dim; ++d) row[d] = static_cast<std::uint8_t>(static_cast<std::int64_t>(y[static_cast<std::size_t>(d)]) & 0xFF);
      return;
    case Encoding::s4:
    case Encoding::u4:
      std::fill_n(row, (dim + 1) / 2, std::uint8_t{0});
      for (std::int64_t d = 0; d < dim; ++d) {
        const auto nibble = static_cast<std::uint8_t>(static_cast<std::int64_t>(y[static_cast<std::size_t>(d)]) & 0xF);
        row[d / 2] = static_cast<std::uint8_t>(row[d / 2] | (nibble << ((d & 1) * 4)));
      }
      return;
    case Encoding::q8_0:
    case Encoding::q4_0: ggml_quantise_row(e, y.data(), dim, row); return;
    case Encoding::none: return;
  }
}

// A scale or descale as float32: finite, and normal (the codes carry what is
// smaller: factors in float32's subnormal range lose their own precision in
// every kernel that multiplies by them).
float to_scale(double x) {
  const auto f = static_cast<float>(x);
  if (!(std::isfinite(f) && f > 0)) return 1.0f;
  return std::max(f, std::numeric_limits<float>::min());
}

void quantise_tensor(CaseData& data, char t, const QuantiseOptions& options) {
  const Problem& p = data.problem;
  const QuantSpec& spec = p.quant(t);
  const Encoding e = spec.encoding;
  const auto shape = p.stored_shape(t);
  const std::int64_t width = shape[3], row_bytes = encoded_row_bytes(e, width);
  std::vector<double> x = data.values(t);
  // A draw rounded to the dtype may have overflowed; a quarter of the range
  // leaves room for the scales' rounding, so every dequantised value stays
  // finite in the dtype (the format requires it).
  const double limit = largest_finite(p.dtype) / 4;
  for (double& value : x) value = std::clamp(value, -limit, limit);
  QuantData& quant = data.quant(t);
  quant = QuantData{};
  quant.original = x;
  const std::vector<char> read = data.read_rows(t);
  auto is_read = [&](std::int64_t b, std::int64_t s) { return read[static_cast<std::size_t>(b * shape[2] + s)] != 0; };
  auto at = [&](std::int64_t b, std::int64_t h, std::int64_t s) { return ((b * shape[1] + h) * shape[2] + s) * width; };
  if (options.poison_unread) {  // 10^4 (or the largest the dtype allows), saturating codes whose scales the read rows set
    const double huge = std::min(1e4, limit);
    for (std::int64_t b = 0; b < shape[0]; ++b)
      for (std::int64_t s = 0; s < shape[2]; ++s) {
        if (is_read(b, s)) continue;
        for (std::int64_t h = 0; h < shape[1]; ++h) std::fill_n(x.begin() + at(b, h, s), width, huge);
      }
  }
  const double top = largest_code(e) * options.headroom;

  // Descales: the amax of the read values each covers.
  std::vector<double> descale_amax(spec.descale == Descale::entry_head ? static_cast<std::size_t>(p.batch * p.heads_kv) : 1, 0.0);
  std::vector<double> head_amax(static_cast<std::size_t>(p.heads_kv), 0.0);  // slots shared by every entry
  if (spec.descale != Descale::none) {
    for (std::int64_t b = 0; b < shape[0]; ++b)
      for (std::int64_t h = 0; h < shape[1]; ++h)
        for (std::int64_t s = 0; s < shape[2]; ++s) {
          if (!is_read(b, s)) continue;
          const std::int64_t slot = descale_slot(data, t, b, h, s);
          double& amax = slot >= 0 ? descale_amax[static_cast<std::size_t>(slot)] : head_amax[static_cast<std::size_t>(-1 - slot)];
          for (std::int64_t d = 0; d < width; ++d) amax = std::max(amax, std::fabs(x[static_cast<std::size_t>(at(b, h, s) + d)]));
        }
    if (spec.descale == Descale::entry_head) {
      for (std::int64_t entry = 0; entry < p.batch; ++entry)
        for (std::int64_t g = 0; g < p.heads_kv; ++g) {
          double& amax = descale_amax[static_cast<std::size_t>(entry * p.heads_kv + g)];
          amax = std::max(amax, head_amax[static_cast<std::size_t>(g)]);
        }
    }
    for (double amax : descale_amax) quant.descale.push_back(to_scale(amax / top));
  }
  auto descale_of = [&](std::int64_t b, std::int64_t h, std::int64_t s) -> double {
    if (spec.descale == Descale::none) return 1.0;
    const std::int64_t slot = descale_slot(data, t, b, h, s);
    if (slot >= 0) return quant.descale[static_cast<std::size_t>(slot)];
    // A row no entry reads has a descale of 1 (CaseData::dequantise); a read
    // page slot, its kv head's, the same for every entry (entry 0's).
    if (!is_read(b, s) || !(p.paged() && t != 'q')) return 1.0;
    return quant.descale[static_cast<std::size_t>(-1 - slot)];
  };

  // Scales (and zero points): over what each covers, after the descale.
  const std::int64_t group = spec.has_scale() ? width / spec.scale[3] : width;
  auto scale_index = [&](std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) {
    return static_cast<std::size_t>((((spec.scale[0] == 1 ? 0 : b) * spec.scale[1] + (spec.scale[1] == 1 ? 0 : h)) * spec.scale[2] +
                                     (spec.scale[2] == 1 ? 0 : s)) * spec.scale[3] + d / group);
  };
  if (spec.has_scale()) {
    const std::size_t count = static_cast<std::size_t>(spec.scale[0] * spec.scale[1] * spec.scale[2] * spec.scale[3]);
    std::vector<double> lo(count, std::numeric_limits<double>::infinity()), hi(count, -std::numeric_limits<double>::infinity());
    for (std::int64_t b = 0; b < shape[0]; ++b)
      for (std::int64_t h = 0; h < shape[1]; ++h)
        for (std::int64_t s = 0; s < shape[2]; ++s) {
          if (!is_read(b, s) && spec.scale[2] == 1) continue;  // a per-token scale covers its own row only
          const double desc = descale_of(b, h, s);
          for (std::int64_t d = 0; d < width; ++d) {
            const double y = x[static_cast<std::size_t>(at(b, h, s) + d)] / desc;
            const std::size_t g = scale_index(b, h, s, d);
            lo[g] = std::min(lo[g], y), hi[g] = std::max(hi[g], y);
          }
        }
    const double cmin = static_cast<double>(code_min(e)), cmax = static_cast<double>(code_max(e));
    for (std::size_t g = 0; g < count; ++g) {
      if (!(lo[g] <= hi[g])) lo[g] = hi[g] = 0;
      if (spec.zero_point) {
        const float scale = to_scale((hi[g] - lo[g]) / ((cmax - cmin) * options.headroom));
        quant.scale.push_back(scale);
        quant.zero_point.push_back(static_cast<std::int32_t>(std::clamp(std::nearbyint(cmin - lo[g] / scale), cmin, cmax)));
      } else {
        quant.scale.push_back(to_scale(std::max(std::fabs(lo[g]), std::fabs(hi[g])) / top));
      }
    }
  }

  quant.codes.assign(static_cast<std::size_t>(shape[0] * shape[1] * shape[2] * row_bytes), 0);
  std::vector<double> y(static_cast<std::size_t>(width));
  for (std::int64_t b = 0; b < shape[0]; ++b)
    for (std::int64_t h = 0; h < shape[1]; ++h)
      for (std::int64_t s = 0; s < shape[2]; ++s) {
        std::uint8_t* row = &quant.codes[static_cast<std::size_t>(((b * shape[1] + h) * shape[2] + s) * row_bytes)];
        const double desc = descale_of(b, h, s);
        for (std::int64_t d = 0; d < width; ++d) {
          double v = x[static_cast<std::size_t>(at(b, h, s) + d)] / desc;
          if (spec.has_scale()) v /= static_cast<double>(quant.scale[scale_index(b, h, s, d)]);
          // A block's d is a float16: values beyond 65504 codes of it saturate.
          if (is_ggml(e)) v = std::clamp(v, -65504.0 * largest_code(e), 65504.0 * largest_code(e));
          if (is_integer(e)) {
            const double zero = spec.zero_point ? static_cast<double>(quant.zero_point[scale_index(b, h, s, d)]) : 0.0;
            v = std::clamp(std::nearbyint(v) + zero, static_cast<double>(code_min(e)), static_cast<double>(code_max(e)));
          }
          y[static_cast<std::size_t>(d)] = v;
        }
        const std::int64_t index = (b * shape[1] + h) * shape[2] + s;
        if (is_ggml(e) && options.zero_block_every > 0 && index % options.zero_block_every == 0) {
          std::fill_n(y.begin(), 32, 0.0);
          std::fill_n(quant.original.begin() + at(b, h, s), 32, 0.0);
        }
        pack_codes(e, y, row);
      }
}

}  // namespace

void quantise_case(CaseData& data, const QuantiseOptions& options) {
  for (char t : {'q', 'k', 'v'}) {
    if (data.problem.quant(t).quantised()) quantise_tensor(data, t, options);
  }
  data.dequantise();
}

}  // namespace attn
