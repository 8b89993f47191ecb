#include "core/case_data.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attnbench/error.hpp"

namespace attn {

namespace {

void check_size(std::size_t got, std::int64_t expected, std::string_view what) {
  if (static_cast<std::int64_t>(got) != expected) {
    throw InputError(fmt::format("{} has {} elements, expected {}", what, got, expected));
  }
}

void check_values(const std::vector<double>& values, DType dtype, std::string_view what, bool allow_neg_inf) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    double x = values[i];
    bool ok_inf = allow_neg_inf && std::isinf(x) && x < 0;
    if (!std::isfinite(x) && !ok_inf) {
      throw InputError(fmt::format("{}[{}] is {}, expected a finite value{}", what, i, x,
                                   allow_neg_inf ? " or -inf" : ""));
    }
    if (!ok_inf && !is_representable(x, dtype)) {
      throw InputError(fmt::format("{}[{}] = {} is not exactly representable in {}", what, i, x, dtype_name(dtype)));
    }
  }
}

void check_quant_sizes(const CaseData& data, char t);

}  // namespace

void CaseData::validate_shapes() const {
  const Problem& p = problem;
  p.validate();
  // A quantised tensor's values come from its codes (dequantise): none yet, or all.
  auto values_size = [&](const std::vector<double>& x, std::int64_t count, char t) {
    if (!(p.quant(t).quantised() && x.empty())) check_size(x.size(), count, std::string(1, t));
  };
  values_size(q, p.q_elements(), 'q');
  values_size(k, p.k_elements(), 'k');
  values_size(v, p.v_elements(), 'v');
  check_size(mask.size(), p.mask.present ? p.broadcast_elements(p.mask) : 0, "mask");
  check_size(bias.size(), p.bias.present ? p.broadcast_elements(p.bias) : 0, "bias");
  check_size(kv_len.size(), p.kv_len ? p.batch : 0, "kv_len");
  for (std::size_t b = 0; b < kv_len.size(); ++b) {
    if (kv_len[b] < 0 || kv_len[b] > p.seq_k) {
      throw InputError(fmt::format("kv_len[{}] = {}, expected 0 <= kv_len <= seq_k = {}", b, kv_len[b], p.seq_k));
    }
  }
  auto per_head = [&](const std::vector<double>& values, bool present, const char* what) {
    check_size(values.size(), present ? p.heads_q : 0, what);
    for (std::size_t h = 0; h < values.size(); ++h) {
      if (!std::isfinite(values[h]) || !is_representable(values[h], DType::f32)) {
        throw InputError(fmt::format("{}[{}] = {}, expected a finite value exactly representable in float32", what, h,
                                     values[h]));
      }
    }
  };
  per_head(alibi_slopes, p.alibi, "alibi_slopes");
  per_head(sinks, p.sinks, "sinks");
  auto offsets = [&](const std::vector<std::int64_t>& cu, const char* what, std::int64_t capacity, const char* axis) {
    check_size(cu.size(), p.ragged ? p.batch + 1 : 0, what);
    if (cu.empty()) return;
    if (cu[0] != 0) throw InputError(fmt::format("{}[0] = {}, expected 0", what, cu[0]));
    for (std::size_t b = 1; b < cu.size(); ++b) {
      if (cu[b] < cu[b - 1]) {
        throw InputError(fmt::format("{}[{}] = {} is below {}[{}] = {}: offsets must not decrease", what, b, cu[b], what,
                                     b - 1, cu[b - 1]));
      }
    }
    if (cu.back() > capacity) {
      throw InputError(fmt::format("{}[{}] = {}, more than {} = {} (the packed length)", what, cu.size() - 1, cu.back(),
                                   axis, capacity));
    }
  };
  for (char t : {'q', 'k', 'v'}) check_quant_sizes(*this, t);
  offsets(cu_seqlens_q, "cu_seqlens_q", p.seq_q, "seq_q");
  offsets(cu_seqlens_k, "cu_seqlens_k", p.seq_k, "seq_k");
  check_size(seq_lens.size(), p.paged() ? p.batch : 0, "seq_lens");
  check_size(page_table.size(), p.paged() ? p.batch * p.pages_per_entry() : 0, "page_table");
  for (std::size_t b = 0; b < seq_lens.size(); ++b) {
    const std::int64_t len = seq_lens[b];
    if (len < 0 || len > p.seq_k) {
      throw InputError(fmt::format("seq_lens[{}] = {}, expected 0 <= seq_lens <= seq_k = {} (pages per entry times "
                                   "page_size)", b, len, p.seq_k));
    }
    const std::int64_t used = (len + p.page_size - 1) / p.page_size;
    for (std::int64_t n = 0; n < used; ++n) {
      const std::int64_t page = page_table[b * static_cast<std::size_t>(p.pages_per_entry()) + static_cast<std::size_t>(n)];
      if (page < 0 || page >= p.num_pages) {
        throw InputError(fmt::format("page_table[{}][{}] = {}: entry {} holds {} keys, so this page is read and must "
                                     "be in [0, num_pages = {})", b, n, page, b, len, p.num_pages));
      }
    }
  }
}

namespace {

void check_quant_sizes(const CaseData& data, char t) {
  const Problem& p = data.problem;
  const QuantSpec& spec = p.quant(t);
  const QuantData& quant = data.quant(t);
  const std::string name(1, t);
  if (!spec.quantised()) {
    if (!(quant == QuantData{})) throw InputError(fmt::format("{} has codes but no encoding", name));
    return;
  }
  const auto shape = p.stored_shape(t);
  check_size(quant.codes.size(), shape[0] * shape[1] * shape[2] * encoded_row_bytes(spec.encoding, shape[3]),
             name + " (codes, in bytes)");
  const std::int64_t scales = spec.has_scale() ? spec.scale[0] * spec.scale[1] * spec.scale[2] * spec.scale[3] : 0;
  check_size(quant.scale.size(), scales, name + "_scale");
  check_size(quant.zero_point.size(), spec.zero_point ? scales : 0, name + "_zero_point");
  const std::int64_t descales = spec.descale == Descale::tensor ? 1 : spec.descale == Descale::entry_head ? p.batch * p.heads_kv : 0;
  check_size(quant.descale.size(), descales, name + "_descale");
  if (!quant.original.empty()) check_size(quant.original.size(), shape[0] * shape[1] * shape[2] * shape[3], name + "_original");
  for (std::size_t i = 0; i < quant.scale.size(); ++i) {
    if (!std::isfinite(quant.scale[i])) throw InputError(fmt::format("{}_scale[{}] is {}, expected a finite value", name, i, quant.scale[i]));
  }
  for (std::size_t i = 0; i < quant.descale.size(); ++i) {
    if (!std::isfinite(quant.descale[i])) {
      throw InputError(fmt::format("{}_descale[{}] is {}, expected a finite value", name, i, quant.descale[i]));
    }
  }
  for (std::size_t i = 0; i < quant.zero_point.size(); ++i) {
    const std::int32_t z = quant.zero_point[i];
    if (z < code_min(spec.encoding) || z > code_max(spec.encoding)) {
      throw InputError(fmt::format("{}_zero_point[{}] = {}, outside the codes' range [{}, {}] of {}", name, i, z,
                                   code_min(spec.encoding), code_max(spec.encoding), encoding_name(spec.encoding)));
    }
  }
  for (std::size_t i = 0; i < quant.original.size(); ++i) {
    if (!std::isfinite(quant.original[i])) {
      throw InputError(fmt::format("{}_original[{}] is {}, expected a finite value", name, i, quant.original[i]));
    }
  }
}

// The batch entry that reads each stored (batch, seq) position of q, k or v,
// for its descale, at [b * seq + s]; -1 where none does (a packed row past the
// last sequence, a free page slot). Throws when entries whose descales differ
// read one page.
std::vector<std::int64_t> reading_entries(const CaseData& data, char t) {
  const Problem& p = data.problem;
  const auto shape = p.stored_shape(t);
  std::vector<std::int64_t> entry(static_cast<std::size_t>(shape[0] * shape[2]), -1);
  if (p.ragged) {
    const auto& cu = t == 'q' ? data.cu_seqlens_q : data.cu_seqlens_k;
    for (std::int64_t e = 0; e < p.batch; ++e) {
      for (std::int64_t s = cu[static_cast<std::size_t>(e)]; s < cu[static_cast<std::size_t>(e + 1)]; ++s) {
        entry[static_cast<std::size_t>(s)] = e;
      }
    }
  } else if (p.paged() && t != 'q') {
    const std::vector<float>& descale = data.quant(t).descale;
    for (std::int64_t e = 0; e < p.batch; ++e) {
      const std::int64_t len = data.seq_lens[static_cast<std::size_t>(e)];
      for (std::int64_t j = 0; j < len; ++j) {
        const std::int64_t page = data.page_table[static_cast<std::size_t>(e * p.pages_per_entry() + j / p.page_size)];
        std::int64_t& reader = entry[static_cast<std::size_t>(page * p.page_size + j % p.page_size)];
        if (reader >= 0 && reader != e) {
          for (std::int64_t g = 0; g < p.heads_kv; ++g) {
            const float mine = descale[static_cast<std::size_t>(reader * p.heads_kv + g)];
            const float theirs = descale[static_cast<std::size_t>(e * p.heads_kv + g)];
            if (mine != theirs) {
              throw InputError(fmt::format("{}_descale: page {} is read by entries {} and {}, whose descales of kv head "
                                           "{} differ ({} and {}): a page's codes have one value", t, page, reader, e, g,
                                           mine, theirs));
            }
          }
        }
        reader = e;
      }
    }
  } else {
    for (std::int64_t b = 0; b < shape[0]; ++b) {
      std::fill_n(entry.begin() + b * shape[2], shape[2], b);
    }
  }
  return entry;
}

}  // namespace

void CaseData::dequantise() {
  validate_shapes();
  const Problem& p = problem;
  for (char t : {'q', 'k', 'v'}) {
    const QuantSpec& spec = p.quant(t);
    if (!spec.quantised()) continue;
    const QuantData& quant = this->quant(t);
    const auto shape = p.stored_shape(t);
    const std::int64_t width = shape[3], row_bytes = encoded_row_bytes(spec.encoding, width);
    const std::int64_t group = spec.has_scale() ? width / spec.scale[3] : width;
    const std::int64_t group_of_heads = t == 'q' ? p.group_size() : 1;
    std::vector<double>& out = values(t);
    out.assign(static_cast<std::size_t>(shape[0] * shape[1] * shape[2] * width), 0.0);
    std::vector<float> decoded(static_cast<std::size_t>(width));
    const bool per_entry = spec.descale == Descale::entry_head;
    const std::vector<std::int64_t> entries = per_entry ? reading_entries(*this, t) : std::vector<std::int64_t>{};
    for (std::int64_t b = 0; b < shape[0]; ++b)
      for (std::int64_t s = 0; s < shape[2]; ++s) {
        for (std::int64_t h = 0; h < shape[1]; ++h) {
          const std::int64_t row = (b * shape[1] + h) * shape[2] + s;
          decode_row(spec.encoding, &quant.codes[static_cast<std::size_t>(row * row_bytes)], width, decoded.data());
          double descale = 1;
          if (spec.descale == Descale::tensor) descale = quant.descale[0];
          if (per_entry) {
            const std::int64_t e = entries[static_cast<std::size_t>(b * shape[2] + s)];
            if (e >= 0) descale = quant.descale[static_cast<std::size_t>(e * p.heads_kv + h / group_of_heads)];
          }
          const std::int64_t scale_at = spec.has_scale() ? ((spec.scale[0] == 1 ? 0 : b) * spec.scale[1] + (spec.scale[1] == 1 ? 0 : h)) *
                                                                   spec.scale[2] + (spec.scale[2] == 1 ? 0 : s)
                                                         : 0;
          for (std::int64_t d = 0; d < width; ++d) {
            const double code = decoded[static_cast<std::size_t>(d)];
            if (!std::isfinite(code)) {
              throw InputError(fmt::format("{}[{}][{}][{}][{}]: its {} code is {}, expected a finite value", t, b, h, s, d,
                                           encoding_name(spec.encoding), code));
            }
            double x = code;
            if (spec.has_scale()) {
              const auto g = static_cast<std::size_t>(scale_at * spec.scale[3] + d / group);
              if (spec.zero_point) x -= quant.zero_point[g];
              x *= static_cast<double>(quant.scale[g]);
            }
            // Exact: at most 4 + 24 + 24 significant bits (fp8 with both), or
            // 9 + 24 (integers), or 11 + 8 + 24 (ggml with a descale).
            out[static_cast<std::size_t>(row * width + d)] = x * descale;
          }
        }
      }
  }
}

void CaseData::fill_ones(char t) {
  std::vector<double>& x = values(t);
  std::fill(x.begin(), x.end(), 1.0);
  const QuantSpec& spec = problem.quant(t);
  if (!spec.quantised()) return;
  QuantData& quant = this->quant(t);
  std::fill(quant.scale.begin(), quant.scale.end(), 1.0f);
  std::fill(quant.zero_point.begin(), quant.zero_point.end(), 0);
  std::fill(quant.descale.begin(), quant.descale.end(), 1.0f);
  quant.original.clear();
  const auto shape = problem.stored_shape(t);
  const std::int64_t row_bytes = encoded_row_bytes(spec.encoding, shape[3]);
  std::vector<std::uint8_t> row(static_cast<std::size_t>(row_bytes));
  switch (spec.encoding) {
    case Encoding::e4m3: std::fill(row.begin(), row.end(), float_to_e4m3(1.0)); break;
    case Encoding::e5m2: std::fill(row.begin(), row.end(), float_to_e5m2(1.0)); break;
    case Encoding::s4:
    case Encoding::u4: std::fill(row.begin(), row.end(), std::uint8_t{0x11}); break;
    case Encoding::q8_0:
    case Encoding::q4_0: {
      const std::int64_t block = spec.encoding == Encoding::q8_0 ? 34 : 18;
      for (std::int64_t b = 0; b < row_bytes; b += block) {  // d = 1.0 (float16 0x3C00), q = 1 (q4_0: 9 - 8)
        row[static_cast<std::size_t>(b)] = 0x00, row[static_cast<std::size_t>(b + 1)] = 0x3C;
        std::fill_n(row.begin() + b + 2, block - 2, spec.encoding == Encoding::q8_0 ? std::uint8_t{1} : std::uint8_t{0x99});
      }
      break;
    }
    default: std::fill(row.begin(), row.end(), std::uint8_t{1}); break;  // int8, uint8: the integer 1
  }
  for (std::int64_t r = 0; r < shape[0] * shape[1] * shape[2]; ++r) {
    std::copy(row.begin(), row.end(), quant.codes.begin() + r * row_bytes);
  }
}

std::vector<char> CaseData::read_rows(char t) const {
  const Problem& p = problem;
  const auto shape = p.stored_shape(t);
  std::vector<char> read(static_cast<std::size_t>(shape[0] * shape[2]), 1);
  if (t == 'q') return read;
  if (p.ragged) {
    for (std::int64_t s = cu_seqlens_k.back(); s < shape[2]; ++s) read[static_cast<std::size_t>(s)] = 0;
  } else if (p.paged()) {
    std::fill(read.begin(), read.end(), 0);
    for (std::int64_t e = 0; e < p.batch; ++e) {
      for (std::int64_t j = 0; j < seq_lens[static_cast<std::size_t>(e)]; ++j) {
        const std::int64_t page = page_table[static_cast<std::size_t>(e * p.pages_per_entry() + j / p.page_size)];
        read[static_cast<std::size_t>(page * p.page_size + j % p.page_size)] = 1;
      }
    }
  }
  return read;
}

void CaseData::validate() const {
  validate_shapes();
  for (char t : {'q', 'k', 'v'}) {
    const std::string name(1, t);
    const auto shape = problem.stored_shape(t);
    check_size(values(t).size(), shape[0] * shape[1] * shape[2] * shape[3], name);
    if (problem.quant(t).quantised()) {
      check_values(values(t), DType::f64, name + " (dequantised)", false);
      // Rows that some entry reads must hold values the dtype holds; free
      // slots of a cache (never read) may hold any finite code, however large.
      const double limit = largest_finite(problem.dtype);
      const std::vector<char> read = read_rows(t);
      for (std::size_t i = 0; i < values(t).size(); ++i) {
        const auto row = static_cast<std::int64_t>(i) / shape[3], b = row / (shape[1] * shape[2]);
        if (std::fabs(values(t)[i]) > limit && read[static_cast<std::size_t>(b * shape[2] + row % shape[2])] != 0) {
          throw InputError(fmt::format("{}[{}] dequantises to {}, beyond {}'s largest finite value", name, i,
                                       values(t)[i], dtype_name(problem.dtype)));
        }
      }
    } else {
      check_values(values(t), problem.dtype, name, false);
    }
  }
  check_values(bias, problem.dtype, "bias", true);
}

namespace {

TensorView convert(Buffer& buffer, const std::vector<double>& values, DType dtype, const Dims4& shape, Layout layout) {
  buffer = Buffer(static_cast<std::size_t>(values.size()) * dtype_size(dtype));
  Dims4 canonical = contiguous_strides(shape);
  Dims4 strides = layout_strides(shape, layout);
  for (std::int64_t b = 0; b < shape[0]; ++b)
    for (std::int64_t h = 0; h < shape[1]; ++h)
      for (std::int64_t s = 0; s < shape[2]; ++s)
        for (std::int64_t d = 0; d < shape[3]; ++d) {
          std::int64_t src = b * canonical[0] + h * canonical[1] + s * canonical[2] + d;
          std::int64_t dst = b * strides[0] + h * strides[1] + s * strides[2] + d * strides[3];
          store_from_double(buffer.data(), dst, dtype, values[src]);
        }
  return TensorView{buffer.data(), dtype, shape, strides};
}

// A quantised tensor's codes, rows placed as the layout places a dtype
// tensor's; its scales as stored. The TensorView keeps shape and strides,
// without data.
void quantised_input(DeviceReadyInputs& r, const CaseData& data, char t) {
  const Problem& p = data.problem;
  const QuantSpec& spec = p.quant(t);
  const QuantData& quant = data.quant(t);
  const auto shape = p.stored_shape(t);
  const std::int64_t row_bytes = encoded_row_bytes(spec.encoding, shape[3]);
  Buffer& codes = t == 'q' ? r.q_codes : t == 'k' ? r.k_codes : r.v_codes;
  codes = Buffer(quant.codes.size());
  const Dims4 strides = layout_strides({shape[0], shape[1], shape[2], row_bytes}, p.layout);
  auto* to = static_cast<std::uint8_t*>(codes.data());
  for (std::int64_t b = 0; b < shape[0]; ++b)
    for (std::int64_t h = 0; h < shape[1]; ++h)
      for (std::int64_t s = 0; s < shape[2]; ++s) {
        const std::int64_t from = ((b * shape[1] + h) * shape[2] + s) * row_bytes;
        if (row_bytes > 0) {
          std::memcpy(to + b * strides[0] + h * strides[1] + s * strides[2], &quant.codes[static_cast<std::size_t>(from)],
                      static_cast<std::size_t>(row_bytes));
        }
      }
  QuantView view;
  view.encoding = spec.encoding;
  view.codes = to;
  view.strides = {strides[0], strides[1], strides[2]};
  view.dim = shape[3];
  auto& scale = t == 'q' ? r.q_scale : t == 'k' ? r.k_scale : r.v_scale;
  auto& zero_point = t == 'q' ? r.q_zero_point : t == 'k' ? r.k_zero_point : r.v_zero_point;
  auto& descale = t == 'q' ? r.q_descale : t == 'k' ? r.k_descale : r.v_descale;
  if (spec.has_scale()) {
    scale = quant.scale;
    zero_point = quant.zero_point;
    view.scale = scale.data();
    if (spec.zero_point) view.zero_point = zero_point.data();
    const Dims4 canonical = contiguous_strides({spec.scale[0], spec.scale[1], spec.scale[2], spec.scale[3]});
    for (int a = 0; a < 3; ++a) view.scale_strides[static_cast<std::size_t>(a)] = spec.scale[static_cast<std::size_t>(a)] == 1 ? 0 : canonical[static_cast<std::size_t>(a)];
    view.group = shape[3] / spec.scale[3];
  }
  if (spec.descale != Descale::none) {
    descale = quant.descale;
    view.descale = descale.data();
    if (spec.descale == Descale::entry_head) view.descale_batch_stride = p.heads_kv, view.descale_head_stride = 1;
    view.descale_group = t == 'q' ? p.group_size() : 1;
  }
  (t == 'q' ? r.io.q_codes : t == 'k' ? r.io.k_codes : r.io.v_codes) = view;
  TensorView& plain = t == 'q' ? r.io.q : t == 'k' ? r.io.k : r.io.v;
  plain.data = nullptr;
  (t == 'q' ? r.q : t == 'k' ? r.k : r.v) = Buffer();
}

}  // namespace

DeviceReadyInputs make_backend_inputs(const CaseData& data) {
  const Problem& p = data.problem;
  DeviceReadyInputs r;
  r.io.q = convert(r.q, data.q, p.dtype, {p.q_batch(), p.heads_q, p.seq_q, p.head_dim}, p.layout);
  r.io.k = convert(r.k, data.k, p.dtype, {p.kv_batch(), p.heads_kv, p.kv_seq(), p.head_dim}, p.layout);
  r.io.v = convert(r.v, data.v, p.dtype, {p.kv_batch(), p.heads_kv, p.kv_seq(), p.head_dim_v}, p.layout);
  Dims4 score_shape{p.batch, p.heads_q, p.seq_q, p.seq_k};
  if (p.mask.present) {
    r.mask = Buffer(data.mask.size());
    if (!data.mask.empty()) std::memcpy(r.mask.data(), data.mask.data(), data.mask.size());
    r.io.mask = MaskView{static_cast<const std::uint8_t*>(r.mask.data()), broadcast_strides(p.mask, p.seq_k)};
  }
  if (p.bias.present) {
    Dims4 stored{p.bias.batch, p.bias.heads, p.bias.rows, p.seq_k};
    convert(r.bias, data.bias, p.dtype, stored, Layout::bhsd);
    r.io.bias = TensorView{r.bias.data(), p.dtype, score_shape, broadcast_strides(p.bias, p.seq_k)};
  }
  if (p.kv_len) {
    r.kv_len = data.kv_len;
    r.io.kv_len = r.kv_len.data();
  }
  auto floats = [](std::vector<float>& to, const std::vector<double>& from) -> const float* {
    to.assign(from.begin(), from.end());  // exact: the values are float32 (validate)
    return to.empty() ? nullptr : to.data();
  };
  auto integers = [](std::vector<std::int64_t>& to, const std::vector<std::int64_t>& from) -> const std::int64_t* {
    to = from;
    return to.empty() ? nullptr : to.data();
  };
  for (char t : {'q', 'k', 'v'}) {
    const QuantSpec& spec = p.quant(t);
    if (!spec.quantised()) continue;
    quantised_input(r, data, t);
  }
  r.io.alibi_slopes = floats(r.alibi_slopes, data.alibi_slopes);
  r.io.sinks = floats(r.sinks, data.sinks);
  r.io.cu_seqlens_q = integers(r.cu_seqlens_q, data.cu_seqlens_q);
  r.io.cu_seqlens_k = integers(r.cu_seqlens_k, data.cu_seqlens_k);
  r.io.page_table = integers(r.page_table, data.page_table);
  r.io.seq_lens = integers(r.seq_lens, data.seq_lens);
  return r;
}

}  // namespace attn
