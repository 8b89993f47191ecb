// The onednn backend: oneDNN 2.6 matmul and softmax primitives over blocks of
// query rows: S = scale * Q K^T (the scale as an output-scale attribute),
// hidden keys set to -inf, softmax along the keys, O = P V. bfloat16 runs the
// matmuls in bfloat16 (avx512_core_bf16 here); float16 is widened to float32.
// Engine, stream and primitives are made in prepare and reused. Its backward
// (OneDnnBackwardPlan) is the textbook formulation on matmul and
// softmax_backward primitives.
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
#include "impls/cpu_kernels/gradients.hpp"

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


// One row of scale * q.k made into scores: softcap on the scaled score, then
// ALiBi, then mask and bias, -inf at every hidden key (the position rules
// too); tanh(s / cap) into th where given (the softcap's slope, for the
// backward). Whether any key is visible.
bool hide_row(const Problem& p, const AttentionIO& io, std::int64_t b, std::int64_t h, std::int64_t i, float* row, float* th) {
  const SequenceMap::Row place = io.sequences(p).entry_row(b, i);  // causal, window, kv_len
  const std::int64_t begin = place.keys.lo, end = place.keys.hi;
  std::fill(row, row + begin, kNegInf);
  std::fill(row + end, row + p.seq_k, kNegInf);
  bool any = false;
  for (std::int64_t j = begin; j < end; ++j) {
    if (p.softcap != 0) {
      if (th) th[j] = std::tanh(row[j] / static_cast<float>(p.softcap));
      row[j] = softcapped(row[j], static_cast<float>(p.softcap));
    }
    if (io.alibi_slopes) row[j] += alibi_term(io.alibi_slopes[h], place.diag, j);
    if (!io.mask.empty() && io.mask.at(b, h, i, j) == 0) row[j] = kNegInf;
    if (!io.bias.empty() && row[j] != kNegInf) {
      const float bias = load_float(io.bias, io.bias.offset(b, h, i, j));
      row[j] = std::isinf(bias) && bias < 0 ? kNegInf : row[j] + bias;
    }
    any = any || row[j] != kNegInf;
  }
  return any;
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
      hidden_rows[static_cast<std::size_t>(r)] = !hide_row(p_, io_, b, h, i0 + r, s_.data() + r * p_.seq_k, nullptr);
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

// The backward pass as oneDNN's primitives give it, the textbook formulation:
// per row block, P recomputed by the forward's own matmul and softmax
// primitives (oneDNN has no lse), dP = dO V^T by matmul, dS = P (dP -
// rowsum(P dP)) by the softmax_backward primitive, then dV += P^T dO,
// dK += dS^T Q (matmuls accumulating through a sum post-op) and dQ = dS K.
// Everything is widened to float32 per head (the backward multiplies in
// float32 whatever the dtype); GQA sums dK and dV over the group's heads in
// order. A pass whose sums overflowed is redone with dO scaled down.
struct BackwardPrimitives {
  dnnl::matmul scores, dp, dv, dk, dq;
  dnnl::softmax_forward softmax;
  dnnl::softmax_backward softmax_grad;
  memory::desc q_md, kt_md, s_md, dout_md, vt_md, pt_md, dv_md, k_md, dk_md, dq_md;
};

class OneDnnBackwardPlan final : public BackwardPlan {
 public:
  OneDnnBackwardPlan(const Problem& p, const BackwardIO& io, const RunOptions& options)
      : p_(p), io_(io), engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
    threads_ = resolve_threads(options.threads);
    const std::int64_t rows = std::min(kRowBlock, std::max<std::int64_t>(p.seq_q, 1));
    auto d = [](std::int64_t x) { return static_cast<double>(x); };
    const double n = d(std::max<std::int64_t>(p.seq_k, 1));
    require_workspace(4.0 * (d(p.seq_q) * d(2 * p.head_dim + 2 * p.head_dim_v) + 2.0 * n * d(p.head_dim + p.head_dim_v) +
                             d(rows) * (5.0 * n + d(p.head_dim))) +
                          8.0 * (io.dbias.empty() ? 0.0 : d(p.broadcast_elements(p.bias))),
                      "onednn's float32 copies of a head, its gradients and a row block's P and dS");
    auto sized = [](std::vector<float>& v, double count) { v.assign(static_cast<std::size_t>(count), 0.0f); };
    sized(q_, d(p.seq_q) * d(p.head_dim));
    sized(dout_, d(p.seq_q) * d(p.head_dim_v));
    sized(k_, n * d(p.head_dim));
    sized(v_, n * d(p.head_dim_v));
    sized(dk_, n * d(p.head_dim));
    sized(dv_, n * d(p.head_dim_v));
    sized(prob_, d(rows) * n);
    sized(dp_, d(rows) * n);
    sized(ds_, d(rows) * n);
    sized(saved_, d(rows) * n);
    sized(tanh_, p.softcap != 0 ? d(rows) * n : 0.0);
    sized(dq_, d(rows) * d(p.head_dim));
    dbias_.assign(io.dbias.empty() ? 0 : static_cast<std::size_t>(p.broadcast_elements(p.bias)), 0.0);
    hidden_.assign(static_cast<std::size_t>(rows), 0);
    tiny_.assign(static_cast<std::size_t>(rows), 0);
    if (p.seq_k > 0 && p.seq_q > 0) {
      full_ = make_primitives(rows);
      if (p.seq_q % rows != 0) tail_ = make_primitives(p.seq_q % rows);
    }
  }

  // dO scaled down and the pass redone where it overflowed (impls/cpu_kernels/gradients.hpp).
  // Softmax's backward primitive sums D from the P it is given, so only dV's
  // P is lifted: dV keeps its true size, dS and what is summed from it are
  // scaled back.
  void run() override {
    omp_set_num_threads(threads_);
    cpu::run_gradient_passes(p_, io_, [&](const cpu::GradientPass& pass) {
      pass_ = pass;
      overflowed_ = false;
      this->pass();
      return overflowed_;
    });
  }

 private:
  BackwardPrimitives make_primitives(std::int64_t rows) {
    return checked("backward primitive creation", [&] {
      using tag = memory::format_tag;
      const auto f32 = memory::data_type::f32;
      const std::int64_t n = p_.seq_k, d = p_.head_dim, dv = p_.head_dim_v;
      BackwardPrimitives pr;
      pr.q_md = memory::desc({rows, d}, f32, tag::ab);
      pr.kt_md = memory::desc({d, n}, f32, {1, d});  // K^T as a strided view of K [n, d]
      pr.s_md = memory::desc({rows, n}, f32, tag::ab);
      pr.dout_md = memory::desc({rows, dv}, f32, tag::ab);
      pr.vt_md = memory::desc({dv, n}, f32, {1, dv});
      pr.pt_md = memory::desc({n, rows}, f32, {1, n});  // P^T and dS^T as strided views
      pr.dv_md = memory::desc({n, dv}, f32, tag::ab);
      pr.k_md = memory::desc({n, d}, f32, tag::ab);
      pr.dk_md = memory::desc({n, d}, f32, tag::ab);
      pr.dq_md = memory::desc({rows, d}, f32, tag::ab);
      dnnl::primitive_attr scale;
      scale.set_output_scales(0, {static_cast<float>(p_.scale)});
      pr.scores = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(pr.q_md, pr.kt_md, pr.s_md), scale, engine_));
      const auto softmax_pd = dnnl::softmax_forward::primitive_desc(
          dnnl::softmax_forward::desc(dnnl::prop_kind::forward_training, pr.s_md, 1), engine_);
      pr.softmax = dnnl::softmax_forward(softmax_pd);
      pr.softmax_grad = dnnl::softmax_backward(dnnl::softmax_backward::primitive_desc(
          dnnl::softmax_backward::desc(pr.s_md, pr.s_md, 1), engine_, softmax_pd));
      pr.dp = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(pr.dout_md, pr.vt_md, pr.s_md), engine_));
      dnnl::post_ops accumulate;
      accumulate.append_sum(1.0f);
      dnnl::primitive_attr sum;
      sum.set_post_ops(accumulate);
      pr.dv = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(pr.pt_md, pr.dout_md, pr.dv_md), sum, engine_));
      pr.dk = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(pr.pt_md, pr.q_md, pr.dk_md), sum, engine_));
      pr.dq = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(pr.s_md, pr.k_md, pr.dq_md), engine_));
      return pr;
    });
  }

  static void widen_rows(const TensorView& v, std::int64_t b, std::int64_t h, std::int64_t rows, std::int64_t cols, float* out) {
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) out[r * cols + c] = load_float(v, v.offset(b, h, r, c));
  }

  void pass() {
    std::fill(dbias_.begin(), dbias_.end(), 0.0);
    for (std::int64_t b = 0; b < p_.batch; ++b) {
      for (std::int64_t g = 0; g < p_.heads_kv; ++g) {
        widen_rows(io_.forward.k, b, g, p_.seq_k, p_.head_dim, k_.data());
        widen_rows(io_.forward.v, b, g, p_.seq_k, p_.head_dim_v, v_.data());
        std::fill(dk_.begin(), dk_.end(), 0.0f);
        std::fill(dv_.begin(), dv_.end(), 0.0f);
        for (std::int64_t h = g * p_.group_size(); h < (g + 1) * p_.group_size(); ++h) head(b, h);
        if (!cpu::store_rows(io_.dk, b, g, 0, dk_.data(), p_.seq_k, p_.head_dim, p_.head_dim, pass_.dout_shift)) overflowed_ = true;
        if (!cpu::store_rows(io_.dv, b, g, 0, dv_.data(), p_.seq_k, p_.head_dim_v, p_.head_dim_v, pass_.result_shift())) {
          overflowed_ = true;
        }
      }
    }
    if (!dbias_.empty() && !cpu::store_dbias(p_, io_.dbias, dbias_, pass_.dout_shift)) overflowed_ = true;
  }

  void head(std::int64_t b, std::int64_t h) {
    widen_rows(io_.forward.q, b, h, p_.seq_q, p_.head_dim, q_.data());
    widen_rows(io_.dout, b, h, p_.seq_q, p_.head_dim_v, dout_.data());
    if (pass_.dout_shift > 0) {
      std::transform(dout_.begin(), dout_.end(), dout_.begin(), [&](float x) { return std::ldexp(x, -pass_.dout_shift); });
    }
    for (std::int64_t i0 = 0; i0 < p_.seq_q; i0 += kRowBlock) {
      const std::int64_t rows = std::min(kRowBlock, p_.seq_q - i0);
      if (p_.seq_k == 0) {
        std::fill(dq_.begin(), dq_.end(), 0.0f);
      } else {
        block(b, h, i0, rows);
      }
      if (!cpu::store_rows(io_.dq, b, h, i0, dq_.data(), rows, p_.head_dim, p_.head_dim, pass_.dout_shift)) overflowed_ = true;
    }
  }

  void block(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows) {
    BackwardPrimitives& pr = rows == std::min(kRowBlock, p_.seq_q) ? full_ : tail_;
    const std::int64_t n = p_.seq_k;
    float* q = q_.data() + i0 * p_.head_dim;
    float* dout = dout_.data() + i0 * p_.head_dim_v;
    memory q_mem(pr.q_md, engine_, q), kt_mem(pr.kt_md, engine_, k_.data()), k_mem(pr.k_md, engine_, k_.data());
    memory p_mem(pr.s_md, engine_, prob_.data()), dp_mem(pr.s_md, engine_, dp_.data()), ds_mem(pr.s_md, engine_, ds_.data());
    memory dout_mem(pr.dout_md, engine_, dout), vt_mem(pr.vt_md, engine_, v_.data());
    memory pt_mem(pr.pt_md, engine_, prob_.data()), dst_mem(pr.pt_md, engine_, ds_.data());
    memory dv_mem(pr.dv_md, engine_, dv_.data()), dk_mem(pr.dk_md, engine_, dk_.data()), dq_mem(pr.dq_md, engine_, dq_.data());
    checked("backward matmul Q K^T", [&] {
      pr.scores.execute(stream_, {{DNNL_ARG_SRC, q_mem}, {DNNL_ARG_WEIGHTS, kt_mem}, {DNNL_ARG_DST, p_mem}});
      stream_.wait();
    });
    std::vector<char>&hidden = hidden_, &tiny = tiny_;
    std::fill(hidden.begin(), hidden.end(), 0);
    std::fill(tiny.begin(), tiny.end(), 0);
    for (std::int64_t r = 0; r < rows; ++r) {
      float* row = prob_.data() + r * n;
      float* th = tanh_.empty() ? nullptr : tanh_.data() + r * n;
      hidden[static_cast<std::size_t>(r)] = !hide_row(p_, io_.forward, b, h, i0 + r, row, th);
      // A weight below float32's smallest normal is a gradient term of its own
      // (a key nearly hidden by a bias or ALiBi), which the softmax primitive
      // flushes: such rows keep their scores and are redone exactly below.
      const float top = *std::max_element(row, row + n);
      for (std::int64_t j = 0; j < n && !hidden[static_cast<std::size_t>(r)]; ++j) {
        if (row[j] - top < -87.0f && row[j] - top > -105.0f) {
          tiny[static_cast<std::size_t>(r)] = 1;
          std::copy_n(row, n, saved_.data() + r * n);
          break;
        }
      }
    }
    checked("backward softmax", [&] {
      pr.softmax.execute(stream_, {{DNNL_ARG_SRC, p_mem}, {DNNL_ARG_DST, p_mem}});
      pr.dp.execute(stream_, {{DNNL_ARG_SRC, dout_mem}, {DNNL_ARG_WEIGHTS, vt_mem}, {DNNL_ARG_DST, dp_mem}});
      stream_.wait();
    });
    for (std::int64_t r = 0; r < rows; ++r) {  // a row with no visible key: P = 0, not softmax's NaN
      float* row = prob_.data() + r * n;
      if (hidden[static_cast<std::size_t>(r)]) std::fill_n(row, n, 0.0f);
      if (!tiny[static_cast<std::size_t>(r)]) continue;
      const float* scores = saved_.data() + r * n;
      const double top = *std::max_element(scores, scores + n);
      double sum = 0;
      for (std::int64_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(scores[j]) - top);
      for (std::int64_t j = 0; j < n; ++j) row[j] = static_cast<float>(std::exp(static_cast<double>(scores[j]) - top) / sum);
    }
    checked("softmax backward", [&] {
      pr.softmax_grad.execute(stream_, {{DNNL_ARG_DST, p_mem}, {DNNL_ARG_DIFF_DST, dp_mem}, {DNNL_ARG_DIFF_SRC, ds_mem}});
      stream_.wait();
    });
    const float scale = static_cast<float>(p_.scale);
    if (pass_.weight_lift > 0) {  // exact: weights at most 1 times a power of two
      const float lift = std::ldexp(1.0f, pass_.weight_lift);
      for (std::int64_t e = 0; e < rows * n; ++e) prob_[static_cast<std::size_t>(e)] *= lift;
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      float* ds = ds_.data() + r * n;
      if (hidden[static_cast<std::size_t>(r)]) std::fill_n(ds, n, 0.0f);
      if (!dbias_.empty()) {
        double* sums = dbias_.data() + cpu::dbias_row(p_, b, h, i0 + r);
        for (std::int64_t j = 0; j < n; ++j) sums[j] += static_cast<double>(ds[j]);
      }
      const float* th = tanh_.empty() ? nullptr : tanh_.data() + r * n;
      for (std::int64_t j = 0; j < n; ++j) ds[j] *= th ? scale * (1.0f - th[j] * th[j]) : scale;
    }
    checked("backward matmuls dV, dK, dQ", [&] {
      pr.dv.execute(stream_, {{DNNL_ARG_SRC, pt_mem}, {DNNL_ARG_WEIGHTS, dout_mem}, {DNNL_ARG_DST, dv_mem}});
      pr.dk.execute(stream_, {{DNNL_ARG_SRC, dst_mem}, {DNNL_ARG_WEIGHTS, q_mem}, {DNNL_ARG_DST, dk_mem}});
      pr.dq.execute(stream_, {{DNNL_ARG_SRC, ds_mem}, {DNNL_ARG_WEIGHTS, k_mem}, {DNNL_ARG_DST, dq_mem}});
      stream_.wait();
    });
  }

  Problem p_;
  BackwardIO io_;
  dnnl::engine engine_;
  dnnl::stream stream_;
  int threads_ = 1;
  cpu::GradientPass pass_;  // this pass's scaling of dO and P (dV's alone)
  bool overflowed_ = false;
  BackwardPrimitives full_, tail_;
  std::vector<float> q_, dout_, k_, v_, dk_, dv_, prob_, dp_, ds_, saved_, tanh_, dq_;
  std::vector<double> dbias_;
  std::vector<char> hidden_, tiny_;  // per row of a block: no visible key; weights the softmax primitive flushes
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
    return {.dtypes = dtypes, .features = kFeatureWindow | kFeatureSoftcap | kFeatureAlibi | kFeatureRagged, .backward = true};
  }
  Status supports(const Problem&) const override { return Status::yes(); }
  std::unique_ptr<Plan> prepare(const Problem& p, const AttentionIO& io, const RunOptions& options) const override {
    // Scores in float32: values beyond its range are computed as an equivalent case that fits, or refused.
    return prepare_in_float32_range(p, io, [&](const Problem& fit, const AttentionIO& fit_io) -> std::unique_ptr<Plan> {
      if (fit.ragged) return plan_per_entry(fit, fit_io, options, *this);  // each entry a dense problem, in place
      return std::make_unique<OneDnnPlan>(fit, fit_io, options);
    });
  }
  std::unique_ptr<BackwardPlan> prepare_backward(const Problem& p, const BackwardIO& io, const RunOptions& options) const override {
    return prepare_backward_in_float32_range(p, io, [&](const Problem& fit, const BackwardIO& fit_io) -> std::unique_ptr<BackwardPlan> {
      if (fit.ragged) return plan_backward_per_entry(fit, fit_io, options, *this);
      return std::make_unique<OneDnnBackwardPlan>(fit, fit_io, options);
    });
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
