#include "verify/layer_backward.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/extensions.hpp"
#include "verify/backward.hpp"
#include "verify/backward_baseline.hpp"
#include "verify/baseline.hpp"
#include "verify/layer.hpp"

namespace attn {

namespace {

std::size_t at(std::int64_t i) { return static_cast<std::size_t>(i); }

// |a| @ |b|: what each element of a @ b is summed from.
std::vector<double> abs_matmul(const std::vector<double>& a, std::int64_t rows, std::int64_t inner,
                               const std::vector<double>& b, std::int64_t cols) {
  std::vector<double> out(at(rows * cols), 0.0);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t k = 0; k < inner; ++k) {
      const double x = std::fabs(a[at(r * inner + k)]);
      if (x == 0) continue;
      double* row = &out[at(r * cols)];
      const double* w = &b[at(k * cols)];
      for (std::int64_t c = 0; c < cols; ++c) row[c] += x * std::fabs(w[c]);
    }
  return out;
}

std::vector<double> rounding_of(const std::vector<double>& x, DType dtype) {
  std::vector<double> e(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) e[i] = std::fabs(round_to_dtype(x[i], dtype) - x[i]);
  return e;
}

std::vector<double> plus(std::vector<double> a, const std::vector<double>& b) {
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) a[i] += b[i];
  return a;
}

// One operand of a product of the chain: its exact values and the bound of
// the error the computed one carries (its rounding to the dtype, for an input).
struct Operand {
  std::vector<double> value, error;
  Operand transposed_(std::int64_t rows, std::int64_t cols) const {
    return {transposed(value, rows, cols), transposed(error, rows, cols)};
  }
};

// The bound of C = A @ B computed in the dtype, and the magnitude |A| @ |B|.
struct ProductBound {
  std::vector<double> bound, magnitude;
};
ProductBound product_bound(const Operand& a, std::int64_t rows, std::int64_t inner, const Operand& b, std::int64_t cols,
                           const std::vector<double>& exact, DType dtype) {
  const double c = ToleranceConstants::safety_factor;
  const double u = unit_roundoff(dtype), ua = accumulation_roundoff(dtype);
  const double floor = underflow_floor(dtype) + subnormal_allowance(dtype, static_cast<double>(inner));
  ProductBound out;
  out.magnitude = abs_matmul(a.value, rows, inner, b.value, cols);
  const std::vector<double> carried =
      plus(abs_matmul(a.error, rows, inner, b.value, cols), abs_matmul(a.value, rows, inner, b.error, cols));
  const double grow = std::sqrt(static_cast<double>(inner)) * ua;
  out.bound.resize(exact.size());
  for (std::size_t e = 0; e < exact.size(); ++e) {
    out.bound[e] = carried[e] + c * (u * std::fabs(exact[e]) + grow * out.magnitude[e]) + floor;
  }
  return out;
}

// What the projections' errors (of Q, K, V and of the attention's dout) move
// in the attention's gradients, to first order, per element and without the
// safety factor (see layer_backward.hpp).
class InputErrorPropagation final : public BackwardObserver {
 public:
  InputErrorPropagation(const CaseData& data, const LayerProjectionErrors& e, const std::vector<double>& e_dout,
                        bool bias_gradient)
      : data_(data), e_(e), e_dout_(e_dout), p_(data.problem) {
    dq.assign(data.q.size(), 0.0), dk.assign(data.k.size(), 0.0), dv.assign(data.v.size(), 0.0);
    if (bias_gradient && p_.bias.present) dbias.assign(data.bias.size(), 0.0);
    if (p_.sinks) dsinks.assign(at(p_.heads_q), 0.0);
  }

  void row(const BackwardRow& r) override {
    const std::int64_t d_qk = p_.head_dim, d_v = p_.head_dim_v;
    const double scale = std::fabs(p_.scale);
    const std::vector<BackwardKey>& keys = *r.keys;
    const double* eq = &e_.q[at(r.row * d_qk)];
    const double* e_do = &e_dout_[at(r.row * d_v)];
    // How far each score moves, and the weights with them.
    shift_.assign(keys.size(), 0.0);
    double mean_shift = 0;
    for (std::size_t n = 0; n < keys.size(); ++n) {
      const BackwardKey& key = keys[n];
      double s = 0;
      for (std::int64_t d = 0; d < d_qk; ++d) s += eq[d] * std::fabs(key.k[d]) + std::fabs(r.q[d]) * e_.k[key.k_at + at(d)];
      shift_[n] = scale * s;
      mean_shift += key.p * shift_[n];
    }
    // O and D = dO . O.
    e_o_.assign(at(d_v), 0.0);
    for (std::size_t n = 0; n < keys.size(); ++n) {
      const BackwardKey& key = keys[n];
      const double e_p = key.p * (shift_[n] + mean_shift);
      for (std::int64_t d = 0; d < d_v; ++d) {
        e_o_[at(d)] += e_p * std::fabs(data_.v[key.v_at + at(d)]) + key.p * e_.v[key.v_at + at(d)];
      }
    }
    double e_delta = 0;
    for (std::int64_t d = 0; d < d_v; ++d) e_delta += e_do[d] * std::fabs(r.o[d]) + std::fabs(r.dout[d]) * e_o_[at(d)];
    for (std::size_t n = 0; n < keys.size(); ++n) {
      const BackwardKey& key = keys[n];
      const double e_p = key.p * (shift_[n] + mean_shift);
      double e_dp = 0;
      for (std::int64_t d = 0; d < d_v; ++d) {
        e_dp += e_do[d] * std::fabs(data_.v[key.v_at + at(d)]) + std::fabs(r.dout[d]) * e_.v[key.v_at + at(d)];
      }
      const double e_ds = e_p * std::fabs(key.gap) + key.p * (e_dp + e_delta);
      const double slope = p_.softcap != 0 ? 1.0 - key.tanh * key.tanh : 1.0;
      double e_x = e_ds * slope;
      if (p_.softcap != 0) e_x += std::fabs(key.ds) * 2.0 * std::fabs(key.tanh) * slope * shift_[n] / p_.softcap;
      const double x = std::fabs(key.ds) * slope;
      for (std::int64_t d = 0; d < d_qk; ++d) {
        dq[at(r.row * d_qk + d)] += scale * (e_x * std::fabs(key.k[d]) + x * e_.k[key.k_at + at(d)]);
        dk[key.k_at + at(d)] += scale * (e_x * std::fabs(r.q[d]) + x * eq[d]);
      }
      for (std::int64_t d = 0; d < d_v; ++d) dv[key.v_at + at(d)] += e_p * std::fabs(r.dout[d]) + key.p * e_do[d];
      if (!dbias.empty()) dbias[key.bias_at] += e_ds;
    }
    if (!dsinks.empty()) dsinks[at(r.h)] += r.p_sink * (mean_shift * std::fabs(r.D) + e_delta);
  }

  std::vector<double> dq, dk, dv, dbias, dsinks;

 private:
  const CaseData& data_;
  const LayerProjectionErrors& e_;
  const std::vector<double>& e_dout_;
  const Problem& p_;
  std::vector<double> shift_, e_o_;
};

std::string layer_gradients_beyond(const LayerData& layer, const LayerGradients& value, bool bias_gradient) {
  const DType dtype = layer.problem.dtype;
  for (const LayerGradientPart& part : layer_gradient_parts(layer, bias_gradient)) {
    for (double x : value.*part.values) {
      if (!std::isfinite(x) || std::fabs(x) > largest_finite(dtype)) {
        return fmt::format("its true {} holds {:.3g}, beyond {}'s range: no {} result can be right", part.name, x,
                           dtype_name(dtype), dtype_name(dtype));
      }
    }
  }
  return {};
}

}  // namespace

MatMul dtype_matmul(DType dtype) {
  return [dtype](const std::vector<double>& a, std::int64_t rows, std::int64_t inner, const std::vector<double>& b,
                 std::int64_t cols) { return project_in_dtype(a, rows, inner, b, cols, {}, dtype); };
}

std::vector<TensorTruth> LayerGradientTruth::tensors(const LayerData& layer, bool bias_requires_grad) const {
  std::vector<TensorTruth> tensors;
  const std::vector<LayerGradientPart> parts = layer_gradient_parts(layer, bias_requires_grad);
  for (std::size_t index = 0; index < parts.size(); ++index) {
    const LayerGradientPart& part = parts[index];
    if (!part.present) continue;
    TensorTruth t;
    t.name = part.name;
    t.dtype = layer.problem.dtype;
    t.shape = part.shape;
    t.value = &(value.*part.values);
    t.bound = &(bound.*part.values);
    if (index < measured.size()) t.measured = &measured[index];
    t.measured_of = "plain layer backward's";
    // A key bias moves every score of a row alike: its gradient is 0 but for
    // the sinks' share, so its elements hold nothing a relative error could
    // inform; its absolute bound is what judges it.
    t.decides_trust = part.values != &LayerGradients::db_k;
    tensors.push_back(std::move(t));
  }
  return tensors;
}

LayerGradientTruth layer_gradient_truth(const LayerData& layer, const LayerReference& ref, const std::vector<double>& dout,
                                        bool bias_gradient) {
  const Problem& p = layer.problem;
  const std::int64_t m = layer.model_dim, q_rows = p.batch * p.seq_q, k_rows = p.batch * p.seq_k;
  const DType dtype = p.dtype;
  const double c = ToleranceConstants::safety_factor;
  LayerGradientTruth t;

  // The attention's upstream gradient and what its computation in the dtype errs by.
  const std::vector<double> w_o_t = transposed(layer.w_o, layer.o_width(), m);
  const std::vector<double> d_attention = layer_attention_dout(layer, dout, reference_matmul);
  const std::vector<double> e_dout = split_heads(
      projection_error(merge_heads(d_attention, p.batch, p.heads_q, p.seq_q, p.head_dim_v), dout, q_rows, m, w_o_t,
                       layer.o_width(), {}, dtype),
      p.batch, p.seq_q, p.heads_q, p.head_dim_v);
  const LayerProjectionErrors inputs = layer_projection_errors(layer, ref);
  InputErrorPropagation moved(ref.attention, inputs, e_dout, bias_gradient);
  LayerBackwardReference truth = reference_layer_backward(layer, ref, dout, bias_gradient, &moved);
  const GradientBounds attention = derive_gradient_bounds(ref.attention, truth.attention_dout, ref.result, ref.stats, bias_gradient);
  auto attention_error = [&](const std::vector<double>& own, const std::vector<double>& carried) {
    std::vector<double> e = own;
    for (std::size_t i = 0; i < e.size(); ++i) e[i] += c * carried[i];
    return e;
  };
  t.value = std::move(truth.value);
  const LayerGradients& v = t.value;

  // The output projection's gradients: from the attention's output (its
  // layer bound) and dout (exact).
  const Operand d_y{dout, std::vector<double>(dout.size(), 0.0)};
  const Operand o{merge_heads(ref.result.out, p.batch, p.heads_q, p.seq_q, p.head_dim_v),
                  merge_heads(layer_attention_error(layer, ref), p.batch, p.heads_q, p.seq_q, p.head_dim_v)};
  const Operand ones_q{std::vector<double>(at(q_rows), 1.0), std::vector<double>(at(q_rows), 0.0)};
  const Operand ones_k{std::vector<double>(at(k_rows), 1.0), std::vector<double>(at(k_rows), 0.0)};
  ProductBound b = product_bound(o.transposed_(q_rows, layer.o_width()), layer.o_width(), q_rows, d_y, m, v.dw_o, dtype);
  t.bound.dw_o = std::move(b.bound), t.magnitude.dw_o = std::move(b.magnitude);
  if (!layer.b_o.empty()) {
    b = product_bound(ones_q, 1, q_rows, d_y, m, v.db_o, dtype);
    t.bound.db_o = std::move(b.bound), t.magnitude.db_o = std::move(b.magnitude);
  }
  // Each input projection's: x^T @ d, the column sums of d, d @ w^T, with d
  // the attention's gradient of that projection (merged) and its bound.
  // The magnitudes (the measured floor's, in units of the dtype's rounding):
  // every product of the chain multiplies the attention's gradient as the
  // dtype holds it, a rounding of each term (|d| @ |w|); and that gradient
  // was itself summed in the accumulation's precision from terms that may
  // cancel (one visible key: dS = P (dP - D) with P = 1 gives dQ = 0 from
  // two sums a backend rounds), what the attention's magnitude m_d carries
  // through the same product at the accumulation's roundoff.
  const double accumulated = accumulation_roundoff(dtype) / unit_roundoff(dtype);
  auto projection = [&](const std::vector<double>& x, std::int64_t rows, std::int64_t in, const std::vector<double>& w,
                        std::int64_t width, std::vector<double> d, std::vector<double> e_d, const std::vector<double>& m_d,
                        bool has_bias, const Operand& ones, std::vector<double> LayerGradients::*dx,
                        std::vector<double> LayerGradients::*dw, std::vector<double> LayerGradients::*db) {
    const Operand x_t{transposed(x, rows, in), transposed(rounding_of(x, dtype), rows, in)};
    std::vector<double> summed(d.size());
    for (std::size_t i = 0; i < d.size(); ++i) summed[i] = std::fabs(d[i]) + accumulated * m_d[i];
    const Operand g{std::move(d), std::move(e_d)};
    const Operand w_t{transposed(w, in, width), transposed(rounding_of(w, dtype), in, width)};
    t.bound.*dw = product_bound(x_t, in, rows, g, width, v.*dw, dtype).bound;
    t.magnitude.*dw = abs_matmul(x_t.value, in, rows, summed, width);
    if (has_bias) {
      t.bound.*db = product_bound(ones, 1, rows, g, width, v.*db, dtype).bound;
      t.magnitude.*db = abs_matmul(ones.value, 1, rows, summed, width);
    }
    t.bound.*dx = product_bound(g, rows, width, w_t, in, v.*dx, dtype).bound;
    t.magnitude.*dx = abs_matmul(summed, rows, width, w_t.value, in);
  };
  projection(layer.x_q, q_rows, m, layer.w_q, layer.q_width(), merge_heads(truth.attention.dq, p.batch, p.heads_q, p.seq_q, p.head_dim),
             merge_heads(attention_error(attention.bound.dq, moved.dq), p.batch, p.heads_q, p.seq_q, p.head_dim),
             merge_heads(attention.magnitude.dq, p.batch, p.heads_q, p.seq_q, p.head_dim),
             !layer.b_q.empty(), ones_q, &LayerGradients::dx_q, &LayerGradients::dw_q, &LayerGradients::db_q);
  projection(layer.x_k, k_rows, layer.k_in(), layer.w_k, layer.k_width(), merge_heads(truth.attention.dk, p.batch, p.heads_kv, p.seq_k, p.head_dim),
             merge_heads(attention_error(attention.bound.dk, moved.dk), p.batch, p.heads_kv, p.seq_k, p.head_dim),
             merge_heads(attention.magnitude.dk, p.batch, p.heads_kv, p.seq_k, p.head_dim),
             !layer.b_k.empty(), ones_k, &LayerGradients::dx_k, &LayerGradients::dw_k, &LayerGradients::db_k);
  projection(layer.x_v, k_rows, layer.v_in(), layer.w_v, layer.v_width(),
             merge_heads(truth.attention.dv, p.batch, p.heads_kv, p.seq_k, p.head_dim_v),
             merge_heads(attention_error(attention.bound.dv, moved.dv), p.batch, p.heads_kv, p.seq_k, p.head_dim_v),
             merge_heads(attention.magnitude.dv, p.batch, p.heads_kv, p.seq_k, p.head_dim_v),
             !layer.b_v.empty(), ones_k, &LayerGradients::dx_v, &LayerGradients::dw_v, &LayerGradients::db_v);
  if (!moved.dbias.empty()) {
    t.bound.dbias = attention_error(attention.bound.dbias, moved.dbias);
    t.magnitude.dbias = attention.magnitude.dbias;
  }
  if (!moved.dsinks.empty()) {
    t.bound.dsinks = attention_error(attention.bound.dsinks, moved.dsinks);
    t.magnitude.dsinks = attention.magnitude.dsinks;
  }
  t.beyond = layer_gradients_beyond(layer, t.value, bias_gradient);
  if (!t.beyond.empty()) return t;

  // The measured bound: k times the least accurate plain layer backward,
  // floored at a unit roundoff of the result plus one of the accumulation
  // at the summed magnitude.
  const std::vector<LayerGradients> family = baseline_layer_backward_family(layer, dout, bias_gradient);
  // Sums run over the rows, the model width or the projections' widths, and the attention's terms.
  const auto terms = std::max({q_rows, k_rows, m, layer.k_in(), layer.v_in(), layer.o_width(), static_cast<std::int64_t>(gradient_terms(p))});
  for (const LayerGradientPart& part : layer_gradient_parts(layer, bias_gradient)) {
    std::vector<const std::vector<double>*> plain;
    for (const LayerGradients& g : family) plain.push_back(&(g.*part.values));
    // Every product of the chain multiplies values the dtype holds (dQ, dK,
    // dV, O and the attention's dout are rounded to it): its floor takes a
    // rounding of each term, as the a-priori bound's carried errors do.
    t.measured.push_back(gradient_measured_limit(dtype, t.value.*part.values, t.magnitude.*part.values, plain, terms,
                                                 /*rounded_terms=*/true));
  }
  return t;
}

LayerGradientTruth conventional_layer_truth(const LayerData& layer, const LayerReference& ref,
                                            const std::vector<double>& dout, bool bias_gradient,
                                            const LayerGradientTruth& truth, bool additive, std::int64_t& rows) {
  const Problem& p = layer.problem;
  const std::vector<double> d_attention = layer_attention_dout(layer, dout, reference_matmul);
  const MeanVTerms terms = mean_v_terms(ref.attention, d_attention, additive);
  rows = terms.rows;
  if (rows == 0) return truth;
  // The attention as the convention has it: each row without a visible key
  // the mean of V over every key, and the gradients with the added terms.
  const ReferenceGradients format = reference_backward(ref.attention, d_attention, ref.result, bias_gradient);
  std::vector<double> out = ref.result.out, out_abs(out.size(), 0.0);
  const double n = static_cast<double>(p.seq_k);
  for (std::int64_t row = 0; row < p.rows(); ++row) {
    if (ref.stats.visible[at(row)] != 0) continue;
    const std::int64_t b = row / (p.heads_q * p.seq_q), g = row / p.seq_q % p.heads_q / p.group_size();
    for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
      double sum = 0, magnitude = 0;
      for (std::int64_t j = 0; j < p.seq_k; ++j) {
        const double v = ref.attention.v[at(((b * p.heads_kv + g) * p.seq_k + j) * p.head_dim_v + d)];
        sum += v / n, magnitude += std::fabs(v) / n;
      }
      out[at(row * p.head_dim_v + d)] = sum, out_abs[at(row * p.head_dim_v + d)] = magnitude;
    }
  }
  auto with = [](std::vector<double> a, const std::vector<double>& b) {
    for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    return a;
  };
  LayerGradientTruth t = truth;
  t.value = layer_gradients(layer, dout, out, with(format.dq, terms.value.dq), with(format.dk, terms.value.dk),
                            with(format.dv, terms.value.dv), format.dbias, format.dsinks, reference_matmul);
  // What the added terms are summed from, through the same chain in magnitudes.
  LayerData magnitudes = layer;
  for (std::vector<double>* x : {&magnitudes.x_q, &magnitudes.x_k, &magnitudes.x_v, &magnitudes.w_q, &magnitudes.w_k,
                                 &magnitudes.w_v, &magnitudes.w_o}) {
    for (double& e : *x) e = std::fabs(e);
  }
  std::vector<double> dout_abs = dout;
  for (double& e : dout_abs) e = std::fabs(e);
  const LayerGradients added = layer_gradients(magnitudes, dout_abs, out_abs, terms.abs.dq, terms.abs.dk, terms.abs.dv,
                                               {}, {}, reference_matmul);
  // Each added term is a product summed over rows, widths or keys.
  const auto inner = static_cast<double>(std::max({p.batch * p.seq_q, p.batch * p.seq_k, layer.model_dim, layer.k_in(),
                                                   layer.v_in(), layer.o_width(), p.seq_k}));
  const double u = unit_roundoff(p.dtype), u_acc = accumulation_roundoff(p.dtype);
  const std::vector<LayerGradientPart> parts = layer_gradient_parts(layer, bias_gradient);
  for (std::size_t index = 0; index < parts.size(); ++index) {
    const auto member = parts[index].values;
    if (member == &LayerGradients::db_o || member == &LayerGradients::dbias || member == &LayerGradients::dsinks) continue;
    const std::vector<double>& value = t.value.*member;
    const std::vector<double>& extra = added.*member;
    std::vector<double>& bound = t.bound.*member;
    std::vector<double>& magnitude = t.magnitude.*member;
    if (extra.size() != value.size() || bound.size() != value.size()) continue;
    double top = 0, squares = 0;
    for (std::size_t e = 0; e < value.size(); ++e) {
      bound[e] += ToleranceConstants::safety_factor * (u * std::fabs(value[e]) + (u + std::sqrt(inner) * u_acc) * extra[e]);
      magnitude[e] += extra[e];
      const double m = std::fabs(value[e]) + magnitude[e];  // the chain's terms are rounded to the dtype
      top = std::max(top, m);
      squares += m * m;
    }
    // The plain layer backwards follow the format, not the convention: the
    // measured floor is raised to one rounding of the conventional values.
    if (index < t.measured.size()) {
      MeasuredLimit& m = t.measured[index];
      const double floor = ToleranceConstants::baseline_floor * u;
      m.floor_max = std::max(m.floor_max, floor * top);
      m.floor_rms = std::max(m.floor_rms, floor * std::sqrt(squares / static_cast<double>(std::max<std::size_t>(value.size(), 1))));
    }
  }
  return t;
}

std::vector<LayerGradients> baseline_layer_backward_family(const LayerData& layer, const std::vector<double>& dout,
                                                           bool bias_gradient) {
  const MatMul mm = dtype_matmul(layer.problem.dtype);
  const CaseData inputs = layer_attention_inputs(layer);
  const std::vector<double> out = baseline_attention(inputs);
  const std::vector<double> d_attention = layer_attention_dout(layer, dout, mm);
  std::vector<LayerGradients> family;
  for (ReferenceGradients& g : baseline_backward_family(inputs, d_attention, out, bias_gradient)) {
    family.push_back(layer_gradients(layer, dout, out, g.dq, g.dk, g.dv, std::move(g.dbias), std::move(g.dsinks), mm));
  }
  return family;
}

LayerGradients run_layer_backward(const Backend& backend, const LayerData& layer, const std::vector<double>& dout,
                                  bool bias_gradient, const RunOptions& options) {
  if (runs_own_layers(backend)) return backend.extensions()->run_layer_backward(layer, dout, bias_gradient, options);
  const MatMul mm = dtype_matmul(layer.problem.dtype);
  const CaseData inputs = layer_attention_inputs(layer);
  BackwardRun run = run_backward(backend, inputs, layer_attention_dout(layer, dout, mm), bias_gradient, options);
  return layer_gradients(layer, dout, run.out, run.got.dq, run.got.dk, run.got.dv, std::move(run.got.dbias),
                         std::move(run.got.dsinks), mm);
}

Comparison judge_layer_backward(const LayerData& layer, bool bias_requires_grad, const LayerGradientTruth& truth,
                                const LayerGradients& got) {
  Comparison c;
  for (const TensorTruth& t : truth.tensors(layer, bias_requires_grad)) {
    const std::vector<double>* values = nullptr;
    for (const LayerGradientPart& part : layer_gradient_parts(layer, bias_requires_grad)) {
      if (t.name == part.name) values = &(got.*part.values);
    }
    if (values == nullptr || values->size() != t.value->size()) {
      c.fail(fmt::format("{}: {} values returned, expected {}", t.name, values ? values->size() : 0, t.value->size()));
      continue;
    }
    c.add(score_tensor(t, *values));
  }
  c.conclude();
  return c;
}

}  // namespace attn
