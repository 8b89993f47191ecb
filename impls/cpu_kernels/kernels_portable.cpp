// Portable C++ versions of the micro-kernels: correct for any CPU, written so
// the compiler can vectorise the inner loops.
#include <cmath>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "attnbench/error.hpp"

#include "core/cpu.hpp"
#include "impls/cpu_kernels/kernels.hpp"

namespace attn::cpu {

namespace {

void qk_f32(const float* q, std::int64_t rows, std::int64_t head_dim, const float* kp, float* s, float* row_max,
            std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float acc[kKeyBlock] = {};
    for (std::int64_t d = 0; d < head_dim; ++d) {
      const float qv = q[r * head_dim + d];
      const float* k = kp + d * kKeyBlock;
      for (std::int64_t j = 0; j < cols; ++j) acc[j] += qv * k[j];
    }
    std::memcpy(s + r * kKeyBlock, acc, static_cast<std::size_t>(cols) * sizeof(float));
    row_max[r] = *std::max_element(acc, acc + cols);
  }
}

void qk_bf16(const bf16* q, std::int64_t rows, std::int64_t pairs, const bf16* kp, float* s, float* row_max,
             std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float acc[kKeyBlock] = {};
    for (std::int64_t dp = 0; dp < pairs; ++dp) {
      const float q0 = bf16_to_float(q[r * pairs * 2 + 2 * dp]), q1 = bf16_to_float(q[r * pairs * 2 + 2 * dp + 1]);
      const bf16* k = kp + dp * kKeyBlock * 2;
      for (std::int64_t j = 0; j < cols; ++j) {
        acc[j] += q0 * bf16_to_float(k[2 * j]) + q1 * bf16_to_float(k[2 * j + 1]);
      }
    }
    std::memcpy(s + r * kKeyBlock, acc, static_cast<std::size_t>(cols) * sizeof(float));
    if (row_max) row_max[r] = *std::max_element(acc, acc + cols);
  }
}

void pv_f32(const float* p, std::int64_t rows, std::int64_t keys, const float* v, std::int64_t ldv, std::int64_t dv_pad,
            float* o) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* out = o + r * dv_pad;
    for (std::int64_t j = 0; j < keys; ++j) {
      const float w = p[r * kKeyBlock + j];
      const float* vj = v + j * ldv;
      for (std::int64_t c = 0; c < dv_pad; ++c) out[c] += w * vj[c];
    }
  }
}

void pv_bf16(const bf16* p, std::int64_t rows, std::int64_t keys, const bf16* vp, std::int64_t dv_pad, float* o) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* out = o + r * dv_pad;
    for (std::int64_t jp = 0; jp < keys / 2; ++jp) {
      const float w0 = bf16_to_float(p[r * kKeyBlock + 2 * jp]), w1 = bf16_to_float(p[r * kKeyBlock + 2 * jp + 1]);
      const bf16* v = vp + jp * dv_pad * 2;
      for (std::int64_t c = 0; c < dv_pad; ++c) out[c] += w0 * bf16_to_float(v[2 * c]) + w1 * bf16_to_float(v[2 * c + 1]);
    }
  }
}

float weight(float x, float scale, float m, int shift) {
  return std::isinf(x) && x < 0 ? 0.0f : std::ldexp(std::exp2(std::fma(scale, x, -m)), -shift);
}

float exp2_sum(float* x, std::int64_t n, float scale, float m, int shift) {
  float sum = 0;
  for (std::int64_t j = 0; j < n; ++j) {
    x[j] = weight(x[j], scale, m, shift);
    sum += x[j];
  }
  return sum;
}

void exp2_rows(float* x, std::int64_t rows, std::int64_t n, float scale, const float* m, int shift, float* sums) {
  for (std::int64_t r = 0; r < rows; ++r) sums[r] = exp2_sum(x + r * n, n, scale, m[r], shift);
}

void exp2_rows_bf16(const float* x, std::int64_t rows, std::int64_t n, float scale, const float* m, int shift, bf16* out,
                    float* sums) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float sum = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      const float w = weight(x[r * n + j], scale, m[r], shift);
      out[r * n + j] = float_to_bf16(w);
      sum += w;
    }
    sums[r] = sum;
  }
}

float max_of(const float* x, std::int64_t n) { return *std::max_element(x, x + n); }

// Element e of a row of K or V in place, widened or decoded to float.
float element(const void* x, RowFormat format, std::int64_t e) {
  const auto* bytes = static_cast<const std::uint8_t*>(x);
  switch (format.encoding) {
    case Encoding::none: break;
    case Encoding::e4m3: return e4m3_to_float(bytes[e]);
    case Encoding::e5m2: return e5m2_to_float(bytes[e]);
    case Encoding::q8_0: {
      const std::uint8_t* block = bytes + e / 32 * 34;
      return ggml_block_d(block) * static_cast<float>(static_cast<std::int8_t>(block[2 + e % 32]));
    }
    case Encoding::q4_0: {
      const std::uint8_t* block = bytes + e / 32 * 18;
      const std::uint8_t byte = block[2 + e % 16];
      return ggml_block_d(block) * static_cast<float>((e % 32 < 16 ? byte & 15 : byte >> 4) - 8);
    }
    default: throw std::logic_error("the in-place kernels decode fp8 and ggml codes only");
  }
  switch (format.dtype) {
    case DType::f32: return static_cast<const float*>(x)[e];
    case DType::bf16: return bf16_to_float(static_cast<const bf16*>(x)[e]);
    case DType::f16: return f16_to_float(static_cast<const f16*>(x)[e]);
    default: throw std::logic_error("the in-place kernels read float32, bfloat16 or float16 rows");
  }
}

void qk_direct(const float* q, std::int64_t rows, std::int64_t head_dim, KeyRows k, RowFormat format, std::int64_t keys,
               float* s, const Ahead& ahead) {
  prefetch_rows(ahead, 0, ahead.n);
  for (std::int64_t j = 0; j < keys; ++j)
    for (std::int64_t r = 0; r < rows; ++r) {
      float acc = 0;
      for (std::int64_t d = 0; d < head_dim; ++d) acc += q[r * head_dim + d] * element(k[j], format, d);
      s[r * kKeyBlock + j] = acc;
    }
}

void pv_direct(const float* p, std::int64_t rows, std::int64_t keys, KeyRows v, RowFormat format, std::int64_t dv,
               std::int64_t dv_pad, float* o, const Ahead& ahead) {
  prefetch_rows(ahead, 0, ahead.n);
  for (std::int64_t r = 0; r < rows; ++r) {
    float* out = o + r * dv_pad;
    for (std::int64_t j = 0; j < keys; ++j) {
      const float w = p[r * kKeyBlock + j];
      for (std::int64_t c = 0; c < dv; ++c) out[c] += w * element(v[j], format, c);
    }
  }
}

// Element e of a row in place as the bfloat16 kernels read it: bfloat16 as
// it is, codes decoded and rounded to bfloat16 (exact for fp8).
float bf16_element(const void* x, RowFormat format, std::int64_t e) {
  if (format.encoding == Encoding::none) return bf16_to_float(static_cast<const bf16*>(x)[e]);
  return bf16_to_float(float_to_bf16(element(x, format, e)));
}

void qk_bf16_direct(const bf16* q, std::int64_t rows, std::int64_t head_dim, std::int64_t ldq, KeyRows k, RowFormat format,
                    std::int64_t keys, float* s, const Ahead& ahead) {
  prefetch_rows(ahead, 0, ahead.n);
  for (std::int64_t j = 0; j < keys; ++j)
    for (std::int64_t r = 0; r < rows; ++r) {
      float acc = 0;
      for (std::int64_t d = 0; d < head_dim; d += 2) {  // a pair of exact products, then the sum
        float pair = bf16_to_float(q[r * ldq + d]) * bf16_element(k[j], format, d);
        if (d + 1 < head_dim) pair += bf16_to_float(q[r * ldq + d + 1]) * bf16_element(k[j], format, d + 1);
        acc += pair;
      }
      s[r * kKeyBlock + j] = acc;
    }
}

void pv_bf16_direct(const bf16* p, std::int64_t rows, std::int64_t keys, KeyRows v, RowFormat format, std::int64_t dv,
                    std::int64_t dv_pad, float* o, const Ahead& ahead) {
  prefetch_rows(ahead, 0, ahead.n);
  for (std::int64_t r = 0; r < rows; ++r) {
    float* out = o + r * dv_pad;
    for (std::int64_t j = 0; j < keys; j += 2) {
      const float w0 = bf16_to_float(p[r * kKeyBlock + j]);
      const float w1 = j + 1 < keys ? bf16_to_float(p[r * kKeyBlock + j + 1]) : 0.0f;
      for (std::int64_t c = 0; c < dv; ++c) {
        const float v1 = j + 1 < keys ? bf16_element(v[j + 1], format, c) : 0.0f;
        out[c] += w0 * bf16_element(v[j], format, c) + w1 * v1;
      }
    }
  }
}

float scale_row(float* x, float scale, std::int64_t begin, std::int64_t end) {
  float m = -std::numeric_limits<float>::infinity();
  for (std::int64_t j = 0; j < kKeyBlock; ++j) {
    x[j] = j >= begin && j < end ? x[j] * scale : -std::numeric_limits<float>::infinity();
    m = std::max(m, x[j]);
  }
  return m;
}

void scale(float* o, float a, std::int64_t n) {
  for (std::int64_t j = 0; j < n; ++j) o[j] *= a;
}

void add_scaled(float* o, const float* x, float w, std::int64_t n) {
  for (std::int64_t j = 0; j < n; ++j) {
    const float product = w * x[j];
    o[j] += product;
  }
}

void to_bf16(const float* x, std::int64_t n, bf16* out) {
  for (std::int64_t j = 0; j < n; ++j) out[j] = float_to_bf16(x[j]);
}

void scaled_to_bf16(const float* x, float a, std::int64_t n, bf16* out) {
  for (std::int64_t j = 0; j < n; ++j) out[j] = float_to_bf16(x[j] * a);
}

void dequantise_bytes(const std::uint8_t* codes, bool is_signed, std::int64_t dim, const float* scale, const std::int32_t* zero,
                      std::int64_t group, float* out) {
  for (std::int64_t d = 0; d < dim; ++d) {
    const float q = is_signed ? static_cast<float>(static_cast<std::int8_t>(codes[d])) : static_cast<float>(codes[d]);
    const std::int64_t g = d / group;
    out[d] = (q - (zero ? static_cast<float>(zero[g]) : 0.0f)) * (scale ? scale[g] : 1.0f);
  }
}

void widen_f16(const f16* x, std::int64_t n, float* out) {
  for (std::int64_t j = 0; j < n; ++j) out[j] = f16_to_float(x[j]);
}

void transpose32(const void* const* rows, std::int64_t n, std::int64_t words, void* out, std::int64_t ld) {
  auto* o = static_cast<unsigned char*>(out);
  for (std::int64_t r = 0; r < n; ++r) {
    const auto* row = static_cast<const unsigned char*>(rows[r]);
    for (std::int64_t w = 0; w < words; ++w) std::memcpy(o + (w * ld + r) * 4, row + w * 4, 4);
  }
}

const Kernels kPortable{"portable", qk_f32, qk_bf16, pv_f32, pv_bf16, exp2_sum, exp2_rows, exp2_rows_bf16,
                        max_of, qk_direct, pv_direct, qk_bf16_direct, pv_bf16_direct, scale_row, scale, add_scaled,
                        to_bf16, scaled_to_bf16, dequantise_bytes, widen_f16, transpose32};

}  // namespace

const Kernels& portable_kernels() { return kPortable; }

const Kernels& best_kernels() {
  // core/cpu.cpp decides which set (the CPU, the OS and ATTN_CPU_ISA); here, its tables.
  static const Kernels* chosen = []() -> const Kernels* {
    const std::string_view set = cpu_kernel_set();
    if (set == "amx_bf16" && amx_kernels()) return amx_kernels();
    if (set == "avx512_vbmi" && avx512_vbmi_kernels()) return avx512_vbmi_kernels();
    if (set == "avx512_bf16" && avx512_kernels()) return avx512_kernels();
    return &kPortable;
  }();
  return *chosen;
}

}  // namespace attn::cpu
