#include "core/case_data.hpp"

#include <fmt/format.h>

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

}  // namespace

void CaseData::validate_shapes() const {
  const Problem& p = problem;
  p.validate();
  check_size(q.size(), p.q_elements(), "q");
  check_size(k.size(), p.k_elements(), "k");
  check_size(v.size(), p.v_elements(), "v");
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

void CaseData::validate() const {
  validate_shapes();
  check_values(q, problem.dtype, "q", false);
  check_values(k, problem.dtype, "k", false);
  check_values(v, problem.dtype, "v", false);
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
  r.io.alibi_slopes = floats(r.alibi_slopes, data.alibi_slopes);
  r.io.sinks = floats(r.sinks, data.sinks);
  r.io.cu_seqlens_q = integers(r.cu_seqlens_q, data.cu_seqlens_q);
  r.io.cu_seqlens_k = integers(r.cu_seqlens_k, data.cu_seqlens_k);
  r.io.page_table = integers(r.page_table, data.page_table);
  r.io.seq_lens = integers(r.seq_lens, data.seq_lens);
  return r;
}

}  // namespace attn
