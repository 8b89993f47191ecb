// The onednn backend: oneDNN 2.6 matmul and softmax primitives over blocks of
// query rows: S = scale * Q K^T (the scale as an output-scale attribute),
// hidden keys set to -inf, softmax along the keys, O = P V. bfloat16 runs the
// matmuls in bfloat16 (avx512_core_bf16 here); float16 is widened to float32.
// Engine, stream and primitives are made in prepare and reused.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "attnbench/backend.hpp"
#include "attnbench/error.hpp"
#include "attnbench/per_entry.hpp"
#include "attnbench/value_range.hpp"
#include "core/thread_pool.hpp"

namespace attn {

namespace {

using dnnl::memory;
constexpr std::int64_t kRowBlock = 512;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Every oneDNN call that can fail goes through here: its exceptions become
// attn::Error naming the step.
template <typename Fn> auto checked(const char* what, Fn&& fn) {
  try {
    return fn();
  } catch (const dnnl::error& e) {
    throw Error(fmt::format("oneDNN {}: {} (status {})", what, e.what(), static_cast<int>(e.status)));
  }
}


// The two matmuls and the softmax for one block height.
struct Primitives {
  dnnl::matmul scores, values;
  dnnl::softmax_forward softmax;
  dnnl::reorder to_compute_type;  // P from float32 to bf16 (bfloat16 cases only)
  memory::desc q_md, k_md, s_md, p_md, v_md, o_md;
};

class OneDnnPlan final : public Plan {
 public:
  OneDnnPlan(const Problem& p, const AttentionIO& io, const RunOptions& options)
      : p_(p), io_(io), engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
    threads_ = resolve_threads(options.threads);
    compute_type_ = p.dtype == DType::bf16 ? memory::data_type::bf16 : memory::data_type::f32;
    // float16 is widened into these; float32 and bfloat16 are read in place.
    if (p.dtype == DType::f16) {
      q32_.resize(static_cast<std::size_t>(p.q_elements()));
      k32_.resize(static_cast<std::size_t>(p.k_elements()));
      v32_.resize(static_cast<std::size_t>(p.v_elements()));
    }
    const std::int64_t rows = std::min(kRowBlock, p.seq_q);
    require_workspace(6.0 * static_cast<double>(rows) * static_cast<double>(p.seq_k) +
                          (p.dtype == DType::f16 ? 4.0 * static_cast<double>(p.q_elements() + p.k_elements() + p.v_elements()) : 0.0),
                      "onednn's scores of a row block (and float16 widened)");
    s_.assign(static_cast<std::size_t>(rows * p.seq_k), 0.0f);
    if (compute_type_ == memory::data_type::bf16) p16_.assign(static_cast<std::size_t>(rows * p.seq_k), bf16{});
    o_.assign(static_cast<std::size_t>(rows * p.head_dim_v), 0.0f);
    if (p.seq_k > 0) {
      full_ = make_primitives(rows);
      if (p.seq_q % rows != 0) tail_ = make_primitives(p.seq_q % rows);
    }
  }

  void run() override {
    omp_set_num_threads(threads_);
    if (p_.dtype == DType::f16) widen_inputs();
    for (std::int64_t b = 0; b < p_.batch; ++b)
      for (std::int64_t h = 0; h < p_.heads_q; ++h)
        for (std::int64_t i0 = 0; i0 < p_.seq_q; i0 += kRowBlock) block(b, h, i0, std::min(kRowBlock, p_.seq_q - i0));
    stream_.wait();
  }
  std::size_t workspace_bytes() const override {
    return (q32_.size() + k32_.size() + v32_.size() + s_.size() + o_.size()) * sizeof(float) + p16_.size() * sizeof(bf16);
  }

 private:
  // Strides of q/k/v in the buffers the matmuls read.
  Dims4 strides_of(const TensorView& v) const { return p_.dtype == DType::f16 ? contiguous_strides(v.shape) : v.strides; }

  Primitives make_primitives(std::int64_t rows) {
    return checked("primitive creation", [&] {
      Primitives pr;
      const Dims4 qs = strides_of(io_.q), ks = strides_of(io_.k), vs = strides_of(io_.v);
      pr.q_md = memory::desc({rows, p_.head_dim}, compute_type_, {qs[2], qs[3]});
      pr.k_md = memory::desc({p_.head_dim, p_.seq_k}, compute_type_, {ks[3], ks[2]});  // K^T as a strided view
      pr.s_md = memory::desc({rows, p_.seq_k}, memory::data_type::f32, memory::format_tag::ab);
      pr.p_md = memory::desc({rows, p_.seq_k}, compute_type_, memory::format_tag::ab);
      pr.v_md = memory::desc({p_.seq_k, p_.head_dim_v}, compute_type_, {vs[2], vs[3]});
      pr.o_md = memory::desc({rows, p_.head_dim_v}, memory::data_type::f32, memory::format_tag::ab);
      dnnl::primitive_attr scale;
      scale.set_output_scales(0, {static_cast<float>(p_.scale)});
      pr.scores = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(pr.q_md, pr.k_md, pr.s_md), scale, engine_));
      pr.softmax = dnnl::softmax_forward(dnnl::softmax_forward::primitive_desc(
          dnnl::softmax_forward::desc(dnnl::prop_kind::forward_inference, pr.s_md, 1), engine_));
      pr.values = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(pr.p_md, pr.v_md, pr.o_md), engine_));
      if (compute_type_ == memory::data_type::bf16) {
        pr.to_compute_type = dnnl::reorder(dnnl::reorder::primitive_desc(engine_, pr.s_md, engine_, pr.p_md));
      }
      return pr;
    });
  }

  void widen_inputs() {
    auto widen = [](const TensorView& v, std::vector<float>& out) {
      const Dims4 c = contiguous_strides(v.shape);
      for (std::int64_t b = 0; b < v.shape[0]; ++b)
        for (std::int64_t h = 0; h < v.shape[1]; ++h)
          for (std::int64_t s = 0; s < v.shape[2]; ++s)
            for (std::int64_t d = 0; d < v.shape[3]; ++d)
              out[static_cast<std::size_t>(b * c[0] + h * c[1] + s * c[2] + d)] = load_float(v, v.offset(b, h, s, d));
    };
    widen(io_.q, q32_);
    widen(io_.k, k32_);
    widen(io_.v, v32_);
  }

  // Pointer to element (b, h, 0, 0) of q, k or v as the matmuls see them.
  void* base(const TensorView& v, const std::vector<float>& widened, std::int64_t b, std::int64_t h) const {
    if (p_.dtype == DType::f16) {
      const Dims4 c = contiguous_strides(v.shape);
      return const_cast<float*>(widened.data()) + b * c[0] + h * c[1];
    }
    const auto* bytes = static_cast<const char*>(v.data);
    return const_cast<char*>(bytes + v.offset(b, h, 0, 0) * static_cast<std::int64_t>(dtype_size(v.dtype)));
  }

  void block(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows) {
    if (p_.seq_k == 0) {
      write(b, h, i0, rows, nullptr);
      return;
    }
    Primitives& pr = rows == std::min(kRowBlock, p_.seq_q) ? full_ : tail_;
    const std::int64_t g = h / p_.group_size();
    const Dims4 qs = strides_of(io_.q);
    char* q = static_cast<char*>(base(io_.q, q32_, b, h)) +
              i0 * qs[2] * static_cast<std::int64_t>(p_.dtype == DType::bf16 ? 2 : 4);
    memory q_mem(pr.q_md, engine_, q), k_mem(pr.k_md, engine_, base(io_.k, k32_, b, g));
    memory s_mem(pr.s_md, engine_, s_.data()), v_mem(pr.v_md, engine_, base(io_.v, v32_, b, g));
    memory o_mem(pr.o_md, engine_, o_.data());
    checked("matmul Q K^T", [&] {
      pr.scores.execute(stream_, {{DNNL_ARG_SRC, q_mem}, {DNNL_ARG_WEIGHTS, k_mem}, {DNNL_ARG_DST, s_mem}});
      stream_.wait();
    });
    std::vector<char>& hidden_rows = hidden_rows_;
    hidden_rows.assign(static_cast<std::size_t>(rows), 0);
    hide_keys(b, h, i0, rows, hidden_rows);
    checked("softmax", [&] {
      pr.softmax.execute(stream_, {{DNNL_ARG_SRC, s_mem}, {DNNL_ARG_DST, s_mem}});
      stream_.wait();
    });
    // A row with no visible key is all -inf, which softmax turns into NaN.
    for (std::int64_t r = 0; r < rows; ++r) {
      if (hidden_rows[static_cast<std::size_t>(r)]) std::fill_n(s_.data() + r * p_.seq_k, p_.seq_k, 0.0f);
    }
    memory p_mem = s_mem;
    if (compute_type_ == memory::data_type::bf16) {
      p_mem = memory(pr.p_md, engine_, p16_.data());
      checked("reorder P to bf16", [&] {
        pr.to_compute_type.execute(stream_, s_mem, p_mem);
        stream_.wait();
      });
    }
    checked("matmul P V", [&] {
      pr.values.execute(stream_, {{DNNL_ARG_SRC, p_mem}, {DNNL_ARG_WEIGHTS, v_mem}, {DNNL_ARG_DST, o_mem}});
      stream_.wait();
    });
    write(b, h, i0, rows, &hidden_rows);
  }

  // -inf at every hidden key; bias added. Marks rows with nothing visible.
  void hide_keys(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows, std::vector<char>& hidden_rows) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t i = i0 + r;
      const SequenceMap::Row place = io_.sequences(p_).entry_row(b, i);  // causal, window, kv_len
      const std::int64_t begin = place.keys.lo, end = place.keys.hi;
      float* row = s_.data() + r * p_.seq_k;
      std::fill(row, row + begin, kNegInf);
      std::fill(row + end, row + p_.seq_k, kNegInf);
      bool any = false;
      for (std::int64_t j = begin; j < end; ++j) {
        // Softcap on the scaled score, then ALiBi, then mask and bias.
        if (p_.softcap != 0) row[j] = softcapped(row[j], static_cast<float>(p_.softcap));
        if (io_.alibi_slopes) row[j] += alibi_term(io_.alibi_slopes[h], place.diag, j);
        if (!io_.mask.empty() && io_.mask.at(b, h, i, j) == 0) row[j] = kNegInf;
        if (!io_.bias.empty() && row[j] != kNegInf) {
          const float bias = load_float(io_.bias, io_.bias.offset(b, h, i, j));
          row[j] = std::isinf(bias) && bias < 0 ? kNegInf : row[j] + bias;
        }
        any = any || row[j] != kNegInf;
      }
      hidden_rows[static_cast<std::size_t>(r)] = !any;
    }
  }

  void write(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows, const std::vector<char>* hidden_rows) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const bool hidden = !hidden_rows || (*hidden_rows)[static_cast<std::size_t>(r)];
      for (std::int64_t c = 0; c < p_.head_dim_v; ++c) {
        const float value = hidden ? 0.0f : o_[static_cast<std::size_t>(r * p_.head_dim_v + c)];
        store_float(io_.out, io_.out.offset(b, h, i0 + r, c), value);
      }
    }
  }

  Problem p_;
  AttentionIO io_;
  dnnl::engine engine_;
  dnnl::stream stream_;
  memory::data_type compute_type_;
  int threads_ = 1;
  Primitives full_, tail_;
  std::vector<float> q32_, k32_, v32_, s_, o_;
  std::vector<bf16> p16_;
  std::vector<char> hidden_rows_;
};

class OneDnnBackend final : public Backend {
 public:
  OneDnnBackend() {
    const dnnl_version_t* v = dnnl_version();
    const std::string isa = isa_name(dnnl::get_effective_cpu_isa());
    bf16_refusal_ = bf16_matmul_refusal(isa);
    description_ = fmt::format("oneDNN {}.{}.{} matmul + softmax primitives (ISA {}), {}", v->major, v->minor, v->patch,
                               isa, bf16_refusal_.empty() ? "bf16 matmuls for bfloat16" : bf16_refusal_);
  }
  std::string_view name() const override { return "onednn"; }
  std::string_view description() const override { return description_; }
  // Not float64: oneDNN's CPU matmul has none. bfloat16 only where oneDNN
  // has a bf16 matmul for this CPU (the description says why not); float16
  // is widened to float32. Not sinks: the softmax primitive normalises over
  // the keys alone, with no place for a logit that carries no value. Not
  // paged KV: the matmul reads each head's K and V as one matrix.
  Capabilities capabilities() const override {
    unsigned dtypes = dtype_bit(DType::f32) | dtype_bit(DType::f16);
    if (bf16_refusal_.empty()) dtypes |= dtype_bit(DType::bf16);
    return {dtypes, kFeatureWindow | kFeatureSoftcap | kFeatureAlibi | kFeatureRagged, false};
  }
  Status supports(const Problem&) const override { return Status::yes(); }
  std::unique_ptr<Plan> prepare(const Problem& p, const AttentionIO& io, const RunOptions& options) const override {
    require_float32_scores(p, io);  // scores in float32: values beyond its range are refused, not computed wrong
    if (p.ragged) return plan_per_entry(p, io, options, *this);
    return std::make_unique<OneDnnPlan>(p, io, options);
  }

 private:
  // The instruction set oneDNN dispatches to on this CPU.
  static std::string isa_name(dnnl::cpu_isa isa) {
    switch (isa) {
      case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
      case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
      case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
      case dnnl::cpu_isa::avx512_core: return "avx512_core";
      case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
      case dnnl::cpu_isa::avx2: return "avx2";
      default: return fmt::format("code {}", static_cast<int>(isa));
    }
  }
  // oneDNN implements bfloat16 matmuls only on some CPUs (2.6: AVX-512 and
  // up); elsewhere creating the primitive fails as "unimplemented". Asked once,
  // by creating the same kinds of primitive a bfloat16 plan makes, so the
  // answer is oneDNN's own rather than a guess from the ISA name. Empty: yes.
  static std::string bf16_matmul_refusal(const std::string& isa) {
    try {
      const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      const memory::desc a({16, 16}, memory::data_type::bf16, memory::format_tag::ab);
      const memory::desc c({16, 16}, memory::data_type::f32, memory::format_tag::ab);
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, a, c), engine);
      dnnl::reorder::primitive_desc(engine, c, engine, a);
      return {};
    } catch (const dnnl::error& e) {
      return fmt::format("no bfloat16: oneDNN has no bf16 matmul for ISA {} ({}, status {})", isa, e.what(),
                         static_cast<int>(e.status));
    }
  }
  std::string description_;
  std::string bf16_refusal_;
};

}  // namespace

std::unique_ptr<Backend> make_onednn_backend() { return std::make_unique<OneDnnBackend>(); }

}  // namespace attn
