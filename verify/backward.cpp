#include "verify/backward.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/float_state.hpp"
#include "verify/backward_baseline.hpp"
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
  t.magnitude = std::move(errors.magnitude);
  return t;
}

namespace {

// The terms count the subnormal allowance is taken over (as gradient_truth's).
double summed_terms(const Problem& p) {
  return static_cast<double>(std::max(p.seq_k, p.q_batch() * p.heads_q * p.seq_q));
}

}  // namespace

void measure_gradients(GradientTruth& truth, const CaseData& data, const std::vector<double>& dout,
                       const std::vector<double>& out, bool bias_gradient) {
  const Problem& p = data.problem;
  const std::vector<ReferenceGradients> family = baseline_backward_family(data, dout, out, bias_gradient);
  const double u = unit_roundoff(p.dtype), ratio = accumulation_roundoff(p.dtype) / u;
  truth.measured.clear();
  for (const GradientPart& part : gradient_parts(p)) {
    const std::vector<double>& want = truth.value.*part.values;
    // What the floor is a unit roundoff (of the dtype) of: the result itself,
    // and the summed magnitude at the accumulation's roundoff.
    std::vector<double> magnitude(want.size());
    const std::vector<double>& summed = truth.magnitude.*part.values;
    for (std::size_t e = 0; e < want.size(); ++e) {
      magnitude[e] = std::fabs(want[e]) + (e < summed.size() ? ratio * summed[e] : 0.0);
    }
    std::vector<std::vector<double>> plain;
    bool finite = true;
    for (const ReferenceGradients& g : family) {
      const std::vector<double>& x = g.*part.values;
      for (double v : x) finite = finite && std::isfinite(v);
      if (x.size() == want.size()) plain.push_back(x);
    }
    const std::vector<char> every(want.size(), 1);
    MeasuredLimit m = measured_limit(p.dtype, want, plain, magnitude, 1, every, static_cast<std::int64_t>(summed_terms(p)));
    if (!finite) m.baseline_max = m.baseline_rms = std::numeric_limits<double>::infinity();
    truth.measured.push_back(m);
  }
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

namespace {

// One way a framework's "mean of V" rows pass gradients (see backward.hpp).
ConventionalGradients mean_v_gradients(const Convention& declared, const CaseData& data, const std::vector<double>& dout,
                                       const GradientTruth& truth, bool additive) {
  ConventionalGradients c;
  const Problem& p = data.problem;
  c.why = declared.why;
  c.additive = additive;
  c.truth = truth;
  // Per gradient, the |terms| added to each element and how many.
  struct Added {
    std::vector<double> ReferenceGradients::*values;
    std::vector<double> abs, count;
  };
  std::vector<Added> added = {{&ReferenceGradients::dq, {}, {}}, {&ReferenceGradients::dk, {}, {}},
                              {&ReferenceGradients::dv, {}, {}}};
  for (Added& a : added) a.abs.assign((c.truth.value.*a.values).size(), 0.0), a.count.assign(a.abs.size(), 0.0);
  auto add = [&](Added& a, std::size_t e, double term) {
    (c.truth.value.*a.values)[e] += term;
    a.abs[e] += std::fabs(term);
    ++a.count[e];
  };
  ReferenceRowView view;
  const double n = static_cast<double>(p.seq_k);
  std::vector<double> dp(static_cast<std::size_t>(p.seq_k));
  for (std::int64_t row = 0; row < p.rows(); ++row) {
    const std::int64_t i = row % p.seq_q, bh = row / p.seq_q, b = bh / p.heads_q, h = bh % p.heads_q;
    reference_row_view(data, b, h, i, view);
    if (!view.visible.empty()) continue;
    ++c.rows;
    const std::int64_t g = h / p.group_size();
    const double* dO = &dout[static_cast<std::size_t>(row * p.head_dim_v)];
    const double* q = &data.q[static_cast<std::size_t>(row * p.head_dim)];
    auto k_row = [&](std::int64_t j) { return static_cast<std::size_t>((b * p.heads_kv + g) * p.seq_k + j); };
    double mean = 0;
    for (std::int64_t j = 0; j < p.seq_k; ++j) {
      double x = 0;
      for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
        x += dO[d] * data.v[k_row(j) * static_cast<std::size_t>(p.head_dim_v) + static_cast<std::size_t>(d)];
        add(added[2], k_row(j) * static_cast<std::size_t>(p.head_dim_v) + static_cast<std::size_t>(d), dO[d] / n);
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
        add(added[0], static_cast<std::size_t>(row * p.head_dim + d), dx * k);
        add(added[1], k_row(j) * static_cast<std::size_t>(p.head_dim) + static_cast<std::size_t>(d), dx * q[d]);
      }
    }
  }
  if (c.rows == 0) return c;
  const double u = unit_roundoff(p.dtype), u_acc = accumulation_roundoff(p.dtype);
  const std::vector<GradientPart> parts = gradient_parts(p);
  for (Added& a : added) {
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

}  // namespace

ConventionalGradients conventional_gradients(const std::vector<Convention>& conventions, const CaseData& data,
                                             const std::vector<double>& dout, const GradientTruth& truth, bool additive) {
  const Problem& p = data.problem;
  const auto mean_v = std::find_if(conventions.begin(), conventions.end(),
                                   [](const Convention& x) { return x.kind == ConventionKind::empty_rows_mean_v; });
  if (mean_v == conventions.end() || p.ragged || p.paged() || p.seq_k == 0) return {};
  return mean_v_gradients(*mean_v, data, dout, truth, additive);
}

Comparison compare_gradients(const Problem& p, const GradientTruth& truth, const BackwardRun& run) {
  Comparison c;
  c.compared = true;
  std::string first_failure, measured_failure;
  std::size_t elements = 0, informative = 0;
  const std::vector<GradientPart> parts = gradient_parts(p);
  for (std::size_t index = 0; index < parts.size(); ++index) {
    const GradientPart& part = parts[index];
    const std::vector<double>& want = truth.value.*part.values;
    const std::vector<double>& bound = truth.bound.*part.values;
    const std::vector<double>& have = run.got.*part.values;
    if (want.empty()) continue;
    GradientScore score;
    score.name = part.name;
    if (have.size() != want.size()) {
      c.fail(fmt::format("{} has {} elements, expected {}", part.name, have.size(), want.size()));
      c.gradients.push_back(std::move(score));
      continue;
    }
    auto coordinates = [&](std::size_t e) {
      Dims4 at{};
      for (int a = 3; a >= 0; --a) {
        const auto extent = static_cast<std::size_t>(std::max<std::int64_t>(part.shape[a], 1));
        at[a] = static_cast<std::int64_t>(e % extent);
        e /= extent;
      }
      return at;
    };
    double dot = 0, got_squares = 0, want_squares = 0, error_squares = 0;
    std::int64_t last_row = -1;
    const auto width = static_cast<std::size_t>(std::max<std::int64_t>(part.shape[3], 1));
    for (std::size_t e = 0; e < want.size(); ++e) {
      const double x = have[e];
      double ratio;
      if (!std::isfinite(x)) {
        ++(std::isnan(x) ? score.nan_elements : score.infinite_elements);
        if (static_cast<std::int64_t>(e / width) != last_row) ++score.nonfinite_rows;
        last_row = static_cast<std::int64_t>(e / width);
        if (score.nonfinite_at.size() < 8) score.nonfinite_at.push_back(coordinates(e));
        ratio = std::numeric_limits<double>::infinity();
      } else {
        const double diff = std::fabs(x - want[e]);
        score.max_abs_error = std::max(score.max_abs_error, diff);
        error_squares += diff * diff;
        dot += x * want[e];
        got_squares += x * x;
        want_squares += want[e] * want[e];
        if (want[e] != 0) c.max_rel_error = std::max(c.max_rel_error, diff / std::fabs(want[e]));
        ratio = bound[e] > 0 ? diff / bound[e] : (diff > 0 ? std::numeric_limits<double>::infinity() : 0.0);
      }
      // As for out: an element tells something when its truth stands out of its bound, or must be exactly 0.
      ++elements;
      informative += std::fabs(want[e]) > bound[e] || want[e] == 0.0;
      if (ratio > 1.0 && first_failure.empty()) {
        const Dims4 at = coordinates(e);
        first_failure = fmt::format("{}[{},{},{},{}] is {:.6g}, expected {:.6g} (bound {:.3g})", part.name, at[0], at[1],
                                    at[2], at[3], x, want[e], bound[e]);
      }
      if (ratio > c.worst_ratio) {
        c.worst_ratio = ratio;
        c.bound_at_worst = bound[e];
      }
      score.worst_ratio = std::max(score.worst_ratio, ratio);
    }
    const std::int64_t nonfinite = score.nan_elements + score.infinite_elements;
    c.nan_elements += score.nan_elements;
    c.infinite_elements += score.infinite_elements;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    score.rms_error = std::sqrt(error_squares / static_cast<double>(want.size()));
    if (nonfinite > 0) {
      score.cosine = score.norm_ratio = nan;
    } else if (want_squares > 0) {
      score.norm_ratio = std::sqrt(got_squares / want_squares);
      score.cosine = got_squares > 0 ? dot / std::sqrt(got_squares * want_squares) : 0.0;
    } else if (got_squares > 0) {
      score.cosine = 0, score.norm_ratio = std::numeric_limits<double>::infinity();
    }
    c.max_abs_error = std::max(c.max_abs_error, score.max_abs_error);
    c.rms_error = std::max(c.rms_error, score.rms_error);
    // The measured bound, as for out (verify/compare.cpp, check 3), per gradient.
    if (index < truth.measured.size() && nonfinite == 0) {
      const ErrorNorms norms{score.max_abs_error, score.rms_error, static_cast<std::int64_t>(want.size())};
      const MeasuredJudgement j =
          judge_measured(norms, truth.measured[index], fmt::format("{}: ", part.name), "plain backward's");
      score.baseline_max_ratio = j.over_max;
      score.baseline_rms_ratio = j.over_rms;
      score.baseline_ratio = j.budget;
      if (!c.baseline_ratio || j.budget > *c.baseline_ratio) {
        c.baseline_ratio = j.budget;
        c.baseline_max_ratio = j.over_max;
        c.baseline_rms_ratio = j.over_rms;
      }
      if (measured_failure.empty()) measured_failure = j.failure;
    }
    if (nonfinite > 0) {
      const Dims4& at = score.nonfinite_at.front();
      c.fail(fmt::format("{} holds {} NaN and {} infinite values in {} rows, first at [{},{},{},{}]", part.name,
                         score.nan_elements, score.infinite_elements, score.nonfinite_rows, at[0], at[1], at[2], at[3]));
    }
    c.gradients.push_back(std::move(score));
  }
  // worst_index stays -1: a gradient's element is not one of out; the reason names it.
  c.informative_fraction = elements > 0 ? static_cast<double>(informative) / static_cast<double>(elements) : 0.0;
  if (!first_failure.empty() && c.nan_elements + c.infinite_elements == 0) c.fail(first_failure);
  if (!measured_failure.empty()) c.fail(measured_failure);
  return c;
}

}  // namespace attn
