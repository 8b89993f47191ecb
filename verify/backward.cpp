#include "verify/backward.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/float_state.hpp"
#include "verify/backward_baseline.hpp"
#include "verify/run_case.hpp"
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
                         const RunOptions& options, const DropoutView& dropout) {
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
  if (dropout.active()) {
    run.kept = unwritten_mask(p);
    inputs.io.dropout = dropout;
    inputs.io.dropout.kept = run.kept.data();
  }
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
    io.forward.dropout.kept = nullptr;
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
  run.out = out.canonical();
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

std::vector<TensorTruth> GradientTruth::tensors(const Problem& p) const {
  std::vector<TensorTruth> tensors;
  const std::vector<GradientPart> parts = gradient_parts(p);
  for (std::size_t index = 0; index < parts.size(); ++index) {
    const GradientPart& part = parts[index];
    if ((value.*part.values).empty()) continue;
    TensorTruth t;
    t.name = part.name;
    t.dtype = p.dtype;
    t.shape = part.shape;
    t.value = &(value.*part.values);
    t.bound = &(bound.*part.values);
    if (index < measured.size()) t.measured = &measured[index];
    t.measured_of = "plain backward's";
    tensors.push_back(std::move(t));
  }
  return tensors;
}

namespace {

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

}  // namespace

BackwardTruth::BackwardTruth(const CaseData& data, const FixtureGradients& gradients, const ForwardTruth& forward)
    : data_(data), gradients_(gradients) {
  GradientBounds b = derive_gradient_bounds(data, gradients.dout, forward.truth, forward.stats, gradients.bias_requires_grad);
  truth_.value = std::move(b.value);
  truth_.bound = std::move(b.bound);
  truth_.magnitude = std::move(b.magnitude);
  beyond_ = gradients_beyond(data.problem, truth_.value);
}

const GradientTruth& BackwardTruth::measured_from(const std::vector<double>& out) {
  for (const auto& [seen, truth] : measured_) {
    if (seen == out) return truth;
  }
  GradientTruth truth = truth_;
  const Problem& p = data_.problem;
  const std::vector<ReferenceGradients> family =
      baseline_backward_family(data_, gradients_.dout, out, gradients_.bias_requires_grad);
  for (const GradientPart& part : gradient_parts(p)) {
    std::vector<const std::vector<double>*> plain;
    for (const ReferenceGradients& g : family) plain.push_back(&(g.*part.values));
    truth.measured.push_back(gradient_measured_limit(p.dtype, truth.value.*part.values, truth.magnitude.*part.values, plain,
                                                     static_cast<std::int64_t>(gradient_terms(p))));
  }
  return measured_.emplace_back(out, std::move(truth)).second;
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

namespace {

// The truth as a declared convention changes it (judge_backward, in backward.hpp).
struct ConventionalGradients {
  GradientTruth truth;
  std::int64_t rows = 0;
  bool additive = false;
  std::string why;  // the declaration's own words
};

// One way a framework's "mean of V" rows pass gradients (see backward.hpp).
ConventionalGradients mean_v_gradients(const Convention& declared, const CaseData& data, const std::vector<double>& dout,
                                       const GradientTruth& truth, bool additive) {
  ConventionalGradients c;
  const Problem& p = data.problem;
  c.why = declared.why;
  c.additive = additive;
  c.truth = truth;
  const MeanVTerms terms = mean_v_terms(data, dout, additive);
  c.rows = terms.rows;
  // Per gradient, the |terms| added to each element and how many.
  struct Added {
    std::vector<double> ReferenceGradients::*values;
    const std::vector<double>& abs;
    const std::vector<double>& count;
  };
  const std::vector<Added> added = {{&ReferenceGradients::dq, terms.abs.dq, terms.count.dq},
                                    {&ReferenceGradients::dk, terms.abs.dk, terms.count.dk},
                                    {&ReferenceGradients::dv, terms.abs.dv, terms.count.dv}};
  if (c.rows == 0) return c;
  for (const Added& a : added) {
    std::vector<double>& value = c.truth.value.*a.values;
    const std::vector<double>& extra = terms.value.*a.values;
    for (std::size_t e = 0; e < value.size(); ++e) value[e] += extra[e];
  }
  const double u = unit_roundoff(p.dtype), u_acc = accumulation_roundoff(p.dtype);
  const std::vector<GradientPart> parts = gradient_parts(p);
  for (const Added& a : added) {
    std::vector<double>& value = c.truth.value.*a.values;
    std::vector<double>& bound = c.truth.bound.*a.values;
    std::vector<double>& magnitude = c.truth.magnitude.*a.values;
    for (std::size_t e = 0; e < value.size(); ++e) {
      if (a.count[e] == 0) continue;
      // Rounding the new terms (and the result they move) as any other sum of them.
      bound[e] += ToleranceConstants::safety_factor * (u * std::fabs(value[e]) + (u + std::sqrt(a.count[e]) * u_acc) * a.abs[e]);
      magnitude[e] += a.abs[e];
    }
    // The plain backwards follow the format, not the convention: the measured
    // floor is raised to one rounding of the conventional values it now holds.
    for (std::size_t index = 0; index < c.truth.measured.size() && index < parts.size(); ++index) {
      if (parts[index].values != a.values) continue;
      double top = 0, squares = 0;
      for (std::size_t e = 0; e < value.size(); ++e) {
        const double m = std::fabs(value[e]) + (u_acc / u) * magnitude[e];
        top = std::max(top, m);
        squares += m * m;
      }
      MeasuredLimit& m = c.truth.measured[index];
      const double floor = ToleranceConstants::baseline_floor * u;
      m.floor_max = std::max(m.floor_max, floor * top);
      m.floor_rms = std::max(m.floor_rms, floor * std::sqrt(squares / static_cast<double>(std::max<std::size_t>(value.size(), 1))));
    }
  }
  return c;
}

ConventionalGradients conventional_gradients(const std::vector<Convention>& conventions, const CaseData& data,
                                             const std::vector<double>& dout, const GradientTruth& truth, bool additive) {
  const Problem& p = data.problem;
  const auto mean_v = std::find_if(conventions.begin(), conventions.end(),
                                   [](const Convention& x) { return x.kind == ConventionKind::empty_rows_mean_v; });
  if (mean_v == conventions.end() || p.ragged || p.paged() || p.seq_k == 0) return {};
  return mean_v_gradients(*mean_v, data, dout, truth, additive);
}

}  // namespace

ReferenceGradients convention_widened_bounds(const std::vector<Convention>& conventions, const CaseData& data,
                                             const std::vector<double>& dout, const GradientTruth& truth) {
  ReferenceGradients bound = truth.bound;
  for (const bool additive : {false, true}) {
    const ConventionalGradients c = conventional_gradients(conventions, data, dout, truth, additive);
    if (c.rows == 0) continue;
    for (const GradientPart& part : gradient_parts(data.problem)) {
      std::vector<double>& widened = bound.*part.values;
      const std::vector<double>& way = c.truth.bound.*part.values;
      for (std::size_t e = 0; e < widened.size() && e < way.size(); ++e) widened[e] = std::max(widened[e], way[e]);
    }
  }
  return bound;
}

MeanVTerms mean_v_terms(const CaseData& data, const std::vector<double>& dout, bool additive) {
  MeanVTerms t;
  const Problem& p = data.problem;
  if (p.ragged || p.paged() || p.seq_k == 0) return t;
  for (ReferenceGradients* g : {&t.value, &t.abs, &t.count}) {
    g->dq.assign(static_cast<std::size_t>(p.rows() * p.head_dim), 0.0);
    g->dk.assign(static_cast<std::size_t>(p.kv_batch() * p.heads_kv * p.seq_k * p.head_dim), 0.0);
    g->dv.assign(static_cast<std::size_t>(p.kv_batch() * p.heads_kv * p.seq_k * p.head_dim_v), 0.0);
  }
  auto add = [&](std::vector<double> ReferenceGradients::*g, std::size_t e, double term) {
    (t.value.*g)[e] += term;
    (t.abs.*g)[e] += std::fabs(term);
    ++(t.count.*g)[e];
  };
  ReferenceRowView view;
  const double n = static_cast<double>(p.seq_k);
  std::vector<double> dp(static_cast<std::size_t>(p.seq_k));
  for (std::int64_t row = 0; row < p.rows(); ++row) {
    const std::int64_t i = row % p.seq_q, bh = row / p.seq_q, b = bh / p.heads_q, h = bh % p.heads_q;
    reference_row_view(data, b, h, i, view);
    if (!view.visible.empty()) continue;
    ++t.rows;
    const std::int64_t g = h / p.group_size();
    const double* dO = &dout[static_cast<std::size_t>(row * p.head_dim_v)];
    const double* q = &data.q[static_cast<std::size_t>(row * p.head_dim)];
    auto k_row = [&](std::int64_t j) { return static_cast<std::size_t>((b * p.heads_kv + g) * p.seq_k + j); };
    double mean = 0;
    for (std::int64_t j = 0; j < p.seq_k; ++j) {
      double x = 0;
      for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
        x += dO[d] * data.v[k_row(j) * static_cast<std::size_t>(p.head_dim_v) + static_cast<std::size_t>(d)];
        add(&ReferenceGradients::dv, k_row(j) * static_cast<std::size_t>(p.head_dim_v) + static_cast<std::size_t>(d), dO[d] / n);
      }
      dp[static_cast<std::size_t>(j)] = x;
      mean += x / n;
    }
    if (!additive) continue;
    // Uniform weights on scores that still carry s_j: dS_j = (dP_j - mean dP) / n.
    for (std::int64_t j = 0; j < p.seq_k; ++j) {
      const double dx = p.scale * (dp[static_cast<std::size_t>(j)] - mean) / n;
      for (std::int64_t d = 0; d < p.head_dim; ++d) {
        const double k = data.k[k_row(j) * static_cast<std::size_t>(p.head_dim) + static_cast<std::size_t>(d)];
        add(&ReferenceGradients::dq, static_cast<std::size_t>(row * p.head_dim + d), dx * k);
        add(&ReferenceGradients::dk, k_row(j) * static_cast<std::size_t>(p.head_dim) + static_cast<std::size_t>(d), dx * q[d]);
      }
    }
  }
  return t;
}

Comparison judge_backward(const Problem& p, const GradientTruth& truth, const ReferenceGradients& got) {
  Comparison c;
  const std::vector<GradientPart> parts = gradient_parts(p);
  for (const TensorTruth& t : truth.tensors(p)) {
    const auto part = std::find_if(parts.begin(), parts.end(), [&](const GradientPart& x) { return t.name == x.name; });
    c.add(score_tensor(t, got.*part->values));
  }
  c.conclude();
  return c;
}

Comparison judge_backward(const Problem& p, const GradientTruth& truth, const ReferenceGradients& got,
                          const std::vector<Convention>& conventions, const CaseData& data, const std::vector<double>& dout) {
  Comparison c = judge_backward(p, truth, got);
  if (c.verdict != Verdict::fail) return c;
  for (bool additive : {false, true}) {  // the second only when the first does not explain the gradients
    const ConventionalGradients conventional = conventional_gradients(conventions, data, dout, truth, additive);
    if (conventional.rows == 0) break;
    Comparison as_declared = judge_backward(p, conventional.truth, got);
    if (as_declared.verdict != Verdict::pass && as_declared.verdict != Verdict::mistrusted) continue;
    const std::string differs = fmt::format(
        "{} rows with no visible key weigh every key 1/seq_k, so their dO / seq_k reaches dV of every key{} "
        "(declared: {}); the format passes them nothing",
        conventional.rows, conventional.additive ? " and (dP - mean dP) / seq_k reaches dQ and dK" : "", conventional.why);
    as_declared.as_declared(differs);
    return as_declared;
  }
  return c;
}

namespace {

void append(Comparison& c, const std::string& text) { c.reason += (c.reason.empty() ? "" : "; ") + text; }

}  // namespace

Comparison judge_backend_backward(const Backend& backend, const CaseData& data, BackwardTruth& truth,
                                  const RunOptions& options, FirstBackwards& first) {
  const Problem& p = data.problem;
  const FixtureGradients& g = truth.gradients();
  const BackwardRun run = run_backward(backend, data, g.dout, g.bias_requires_grad, options);
  Comparison c = judge_backward(p, truth.measured_from(run.out), run.got, conventions_of(backend, p), data, g.dout);
  const BackwardRun again = run_backward(backend, data, g.dout, g.bias_requires_grad, options);
  const bool dq_may_vary = backend.capabilities().nondeterministic_dq;
  // Gradients are compared bit for bit only between runs whose forward gave
  // the same out (a forward may differ between thread counts; its backward
  // then starts elsewhere).
  if (again.out != run.out) {
    append(c, fmt::format("its forward's out differs between two runs at {} threads, so its gradients were not "
                          "compared between them", options.threads));
  } else if (std::string why = backward_differences(p, run, again, dq_may_vary); !why.empty()) {
    c.fail(fmt::format("not deterministic: {} between two runs at {} threads", why, options.threads));
  } else if (dq_may_vary) {
    // Declared: reported, not failed.
    if (std::string dq = backward_differences(p, run, again, false); !dq.empty()) {
      append(c, fmt::format("{} between two runs (declared non-deterministic dQ accumulation)", dq));
    }
  }
  const auto [earlier, inserted] = first.try_emplace({&backend, p.layout}, run);
  if (inserted) return c;
  if (earlier->second.out != run.out) {
    append(c, fmt::format("its forward's out at {} threads differs from the first thread count's, so its gradients "
                          "were not compared with those", options.threads));
  } else if (std::string why = backward_differences(p, earlier->second, run, dq_may_vary); !why.empty()) {
    const std::string declared = thread_dependent_gradients_of(backend);
    if (declared.empty() || c.verdict == Verdict::fail) {
      c.fail(fmt::format("not deterministic: {} at {} threads against the first thread count", why, options.threads));
    } else {
      // Declared by the framework's adapter: shown, not failed (docs/verification/tolerance.md#differs).
      if (c.verdict == Verdict::pass) c.verdict = Verdict::differs;
      append(c, fmt::format("{} at {} threads against the first thread count (declared: {})", why, options.threads,
                            declared));
    }
  }
  return c;
}

}  // namespace attn
