#include "core/case_data.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "core/error.hpp"

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
  r.io.q = convert(r.q, data.q, p.dtype, {p.batch, p.heads_q, p.seq_q, p.head_dim}, p.layout);
  r.io.k = convert(r.k, data.k, p.dtype, {p.batch, p.heads_kv, p.seq_k, p.head_dim}, p.layout);
  r.io.v = convert(r.v, data.v, p.dtype, {p.batch, p.heads_kv, p.seq_k, p.head_dim_v}, p.layout);
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
  return r;
}

}  // namespace attn
