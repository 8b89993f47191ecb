#include "verify/backward.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/float_state.hpp"
#include "verify/tolerance.hpp"

namespace attn {

namespace {

// A buffer of `shape` in the dtype and the case's layout, every element NaN.
struct Filled {
  Buffer storage;
  MutableTensorView view;
  Filled(const Dims4& shape, DType dtype, Layout layout)
      : storage(static_cast<std::size_t>(shape[0] * shape[1] * shape[2] * shape[3]) * dtype_size(dtype)),
        view{storage.data(), dtype, shape, layout_strides(shape, layout)} {
    const std::int64_t n = shape[0] * shape[1] * shape[2] * shape[3];
    for (std::int64_t e = 0; e < n; ++e) store_from_double(storage.data(), e, dtype, std::numeric_limits<double>::quiet_NaN());
  }
  std::vector<double> canonical() const {
    std::vector<double> values;
    const Dims4& s = view.shape;
    values.reserve(static_cast<std::size_t>(s[0] * s[1] * s[2] * s[3]));
    for (std::int64_t a = 0; a < s[0]; ++a)
      for (std::int64_t b = 0; b < s[1]; ++b)
        for (std::int64_t c = 0; c < s[2]; ++c)
          for (std::int64_t d = 0; d < s[3]; ++d) values.push_back(load_as_double(view.data, view.offset(a, b, c, d), view.dtype));
    return values;
  }
};

}  // namespace

BackwardRun run_backward(const Backend& backend, const CaseData& data, const std::vector<double>& dout, bool bias_gradient,
                         const RunOptions& options) {
  const Problem& p = data.problem;
  DeviceReadyInputs inputs = make_backend_inputs(data);
  const Dims4 out_shape{p.q_batch(), p.heads_q, p.seq_q, p.head_dim_v};
  Filled out(out_shape, p.dtype, p.layout), grad_out(out_shape, p.dtype, p.layout);
  for (std::int64_t b = 0, e = 0; b < out_shape[0]; ++b)
    for (std::int64_t h = 0; h < out_shape[1]; ++h)
      for (std::int64_t i = 0; i < out_shape[2]; ++i)
        for (std::int64_t d = 0; d < out_shape[3]; ++d, ++e)
          store_from_double(grad_out.view.data, grad_out.view.offset(b, h, i, d), p.dtype, dout[static_cast<std::size_t>(e)]);
  std::vector<double> lse(static_cast<std::size_t>(p.rows()), std::numeric_limits<double>::quiet_NaN());
  Filled dq({p.q_batch(), p.heads_q, p.seq_q, p.head_dim}, p.dtype, p.layout);
  Filled dk({p.kv_batch(), p.heads_kv, p.kv_seq(), p.head_dim}, p.dtype, p.layout);
  Filled dv({p.kv_batch(), p.heads_kv, p.kv_seq(), p.head_dim_v}, p.dtype, p.layout);
  const bool with_bias = bias_gradient && p.bias.present;
  Filled dbias(with_bias ? Dims4{p.bias.batch, p.bias.heads, p.bias.rows, p.seq_k} : Dims4{1, 1, 1, 1}, p.dtype, Layout::bhsd);
  std::vector<double> dsinks(p.sinks ? static_cast<std::size_t>(p.heads_q) : 0, std::numeric_limits<double>::quiet_NaN());

  BackwardRun run;
  const auto start = std::chrono::steady_clock::now();
  {
    const FloatStateGuard floats;  // the backend's floating-point state stays with it
    inputs.io.out = out.view;
    inputs.io.lse = lse.data();
    auto forward = backend.prepare(p, inputs.io, options);
    forward->run();
    forward->read_output();
    BackwardIO io;
    io.forward = inputs.io;
    if (!forward->has_lse()) io.forward.lse = nullptr;
    io.dout = TensorView{grad_out.view.data, p.dtype, grad_out.view.shape, grad_out.view.strides};
    io.dq = dq.view;
    io.dk = dk.view;
    io.dv = dv.view;
    if (with_bias) io.dbias = dbias.view;
    io.dsinks = p.sinks ? dsinks.data() : nullptr;
    auto backward = backend.prepare_backward(p, io, options);
    backward->run();
  }
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  run.got.dq = dq.canonical();
  run.got.dk = dk.canonical();
  run.got.dv = dv.canonical();
  if (with_bias) run.got.dbias = dbias.canonical();
  run.got.dsinks = std::move(dsinks);
  return run;
}

std::vector<GradientPart> gradient_parts(const Problem& p) {
  return {{"dq", {p.q_batch(), p.heads_q, p.seq_q, p.head_dim}, &ReferenceGradients::dq, &FixtureGradients::dq},
          {"dk", {p.kv_batch(), p.heads_kv, p.kv_seq(), p.head_dim}, &ReferenceGradients::dk, &FixtureGradients::dk},
          {"dv", {p.kv_batch(), p.heads_kv, p.kv_seq(), p.head_dim_v}, &ReferenceGradients::dv, &FixtureGradients::dv},
          {"dbias", {p.bias.batch, p.bias.heads, p.bias.rows, p.seq_k}, &ReferenceGradients::dbias, &FixtureGradients::dbias},
          {"dsinks", {1, 1, 1, p.heads_q}, &ReferenceGradients::dsinks, &FixtureGradients::dsinks}};
}

GradientTruth gradient_truth(const CaseData& data, const std::vector<double>& dout, bool bias_gradient,
                             const ReferenceResult& forward, const ReferenceStats& stats) {
  const Problem& p = data.problem;
  const GradientPrecision precision = gradient_precision(p.dtype);
  GradientErrors errors;
  GradientTruth t;
  t.value = reference_backward(data, dout, forward, stats, bias_gradient, &precision, &errors);
  const double terms = static_cast<double>(std::max(p.seq_k, p.q_batch() * p.heads_q * p.seq_q));
  t.bound.dq = gradient_bounds(p.dtype, errors.dq, terms);
  t.bound.dk = gradient_bounds(p.dtype, errors.dk, terms);
  t.bound.dv = gradient_bounds(p.dtype, errors.dv, terms);
  t.bound.dbias = gradient_bounds(p.dtype, errors.dbias, terms);
  t.bound.dsinks = gradient_bounds(p.dtype, errors.dsinks, terms);
  return t;
}

std::string backward_differences(const Problem& p, const BackwardRun& a, const BackwardRun& b, bool dq_may_vary) {
  for (const GradientPart& part : gradient_parts(p)) {
    if (dq_may_vary && part.values == &ReferenceGradients::dq) continue;
    const std::vector<double>& x = a.got.*part.values;
    const std::vector<double>& y = b.got.*part.values;
    if (x.size() != y.size()) return fmt::format("{} has {} and {} elements", part.name, x.size(), y.size());
    for (std::size_t e = 0; e < x.size(); ++e) {
      // Bit for bit: NaN against NaN is equal, -0 against 0 is not.
      if (std::memcmp(&x[e], &y[e], sizeof(double)) != 0) {
        return fmt::format("{} differs at flat index {} ({:.17g} and {:.17g})", part.name, e, x[e], y[e]);
      }
    }
  }
  return {};
}

std::string gradients_beyond(const Problem& p, const ReferenceGradients& truth) {
  const double largest = largest_finite(p.dtype);
  for (const GradientPart& part : gradient_parts(p)) {
    for (double x : truth.*part.values) {
      if (!std::isfinite(x) || std::fabs(x) > largest) {
        return fmt::format("its true {} holds {:.3g}, beyond {}'s range: no {} result can be right", part.name, x,
                           dtype_name(p.dtype), dtype_name(p.dtype));
      }
    }
  }
  return {};
}

Comparison compare_gradients(const Problem& p, const GradientTruth& truth, const BackwardRun& run) {
  Comparison c;
  c.compared = true;
  std::string first_failure;
  std::size_t elements = 0, informative = 0;
  for (const GradientPart& part : gradient_parts(p)) {
    const std::vector<double>& want = truth.value.*part.values;
    const std::vector<double>& bound = truth.bound.*part.values;
    const std::vector<double>& have = run.got.*part.values;
    if (want.empty()) continue;
    if (have.size() != want.size()) {
      c.fail(fmt::format("{} has {} elements, expected {}", part.name, have.size(), want.size()));
      continue;
    }
    for (std::size_t e = 0; e < want.size(); ++e) {
      const double x = have[e];
      double ratio;
      if (!std::isfinite(x)) {
        ++(std::isnan(x) ? c.nan_elements : c.infinite_elements);
        ratio = std::numeric_limits<double>::infinity();
      } else {
        const double diff = std::fabs(x - want[e]);
        c.max_abs_error = std::max(c.max_abs_error, diff);
        if (want[e] != 0) c.max_rel_error = std::max(c.max_rel_error, diff / std::fabs(want[e]));
        ratio = bound[e] > 0 ? diff / bound[e] : (diff > 0 ? std::numeric_limits<double>::infinity() : 0.0);
      }
      // As for out: an element tells something when its truth stands out of its bound, or must be exactly 0.
      ++elements;
      informative += std::fabs(want[e]) > bound[e] || want[e] == 0.0;
      if (ratio > 1.0 && first_failure.empty()) {
        Dims4 at{};
        std::size_t rest = e;
        for (int a = 3; a >= 0; --a) {
          const auto extent = static_cast<std::size_t>(std::max<std::int64_t>(part.shape[a], 1));
          at[a] = static_cast<std::int64_t>(rest % extent);
          rest /= extent;
        }
        first_failure = fmt::format("{}[{},{},{},{}] is {:.6g}, expected {:.6g} (bound {:.3g})", part.name, at[0], at[1],
                                    at[2], at[3], x, want[e], bound[e]);
      }
      if (ratio > c.worst_ratio) {
        c.worst_ratio = ratio;
        c.bound_at_worst = bound[e];
      }
    }
  }
  // worst_index stays -1: a gradient's element is not one of out; the reason names it.
  c.informative_fraction = elements > 0 ? static_cast<double>(informative) / static_cast<double>(elements) : 0.0;
  if (!first_failure.empty()) c.fail(first_failure);
  return c;
}

}  // namespace attn
