#include "verify/baseline.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <type_traits>

#include "core/detmath.hpp"
#include "core/thread_pool.hpp"
#include "reference/reference.hpp"
#include "verify/layer.hpp"

namespace attn {

namespace {

// One row of the plain algorithm in accumulation type A (float or double).
constexpr double kLog2e = 1.4426950408889634;
constexpr double kLn2 = 0.6931471805599453;

// Where one row's results go: out and, when `probe` is set, the same row with
// V replaced by ones; with `normalised_out` set, a natural pass also gives the
// normalised formulation's results (the same scores and weights).
struct RowSinks {
  std::vector<double>* out = nullptr;
  std::vector<double>* probe = nullptr;
  std::vector<double>* normalised_out = nullptr;
  std::vector<double>* normalised_probe = nullptr;
};

template <typename A>
void baseline_row(const CaseData& data, std::int64_t row, const RowSinks& sinks, std::vector<A>& weights,
                  std::vector<A>& rounded, Formulation formulation) {
  const bool folded = formulation == Formulation::log2_folded;
  const bool reversed = formulation == Formulation::reversed;
  const Problem& p = data.problem;
  const std::int64_t i = row % p.seq_q, bh = row / p.seq_q, b = bh / p.heads_q, h = bh % p.heads_q;
  thread_local ReferenceRowView view;  // one per worker thread, reused across rows
  reference_row_view(data, b, h, i, view);
  const double* q = &data.q[static_cast<std::size_t>(row * p.head_dim)];
  const A scale = static_cast<A>(p.scale);
  const A folded_scale = static_cast<A>(static_cast<double>(p.scale) * kLog2e);
  weights.clear();
  // The sink is one more logit in the denominator, carrying no value.
  const A sink_logit = p.sinks ? static_cast<A>(data.sinks[static_cast<std::size_t>(h)]) * (folded ? static_cast<A>(kLog2e) : A{1})
                         : -std::numeric_limits<A>::infinity();
  A max_score = sink_logit;
  for (std::size_t n = 0; n < view.visible.size(); ++n) {
    const std::int64_t j = view.visible[n];
    const double* k = view.k_rows[n];
    A dot = 0;
    if (folded) {
      for (std::int64_t d = 0; d < p.head_dim; ++d) dot = std::fma(folded_scale * static_cast<A>(q[d]), static_cast<A>(k[d]), dot);
    } else {
      for (std::int64_t e = 0; e < p.head_dim; ++e) {
        const std::int64_t d = reversed ? p.head_dim - 1 - e : e;
        dot += static_cast<A>(q[d]) * static_cast<A>(k[d]);
      }
    }
    A s = folded ? dot : scale * dot;
    if (p.softcap != 0) {
      s = folded ? soft_capped<A>(s / static_cast<A>(kLog2e), p.softcap) * static_cast<A>(kLog2e) : soft_capped<A>(s, p.softcap);
    }
    if (p.alibi) {
      const A term = -static_cast<A>(data.alibi_slopes[static_cast<std::size_t>(h)]) * static_cast<A>(std::llabs(view.diag - j));
      s += folded ? static_cast<A>(kLog2e) * term : term;
    }
    if (p.bias.present) {
      const BroadcastShape& m = p.bias;
      const std::int64_t at = (((m.batch == 1 ? 0 : b) * m.heads + (m.heads == 1 ? 0 : h)) * m.rows +
                               (m.rows == 1 ? 0 : i)) * p.seq_k + j;
      const A bias = static_cast<A>(data.bias[static_cast<std::size_t>(at)]);
      s += folded ? static_cast<A>(kLog2e) * bias : bias;
    }
    weights.push_back(s);  // of the n-th visible key
    max_score = std::max(max_score, s);
  }
  const auto first = static_cast<std::size_t>(row * p.head_dim_v), width = static_cast<std::size_t>(p.head_dim_v);
  if (weights.empty()) {
    for (std::vector<double>* sink : {sinks.out, sinks.probe, sinks.normalised_out, sinks.normalised_probe}) {
      if (sink) std::fill_n(sink->begin() + static_cast<std::ptrdiff_t>(first), width, 0.0);
    }
    return;
  }
  thread_local std::vector<double> exponents;  // each weight's, exact in double
  exponents.resize(weights.size());
  for (std::size_t n = 0; n < weights.size(); ++n) {
    const double d = static_cast<double>(weights[n] - max_score);
    exponents[n] = folded ? d * kLn2 : d;
  }
  detmath::exp_n(exponents.data(), exponents.data(), exponents.size());
  for (std::size_t n = 0; n < weights.size(); ++n) weights[n] = static_cast<A>(exponents[n]);
  const std::size_t count = weights.size();
  auto nth = [&](std::size_t n) { return reversed ? count - 1 - n : n; };  // the order of the sums over keys
  A sum = 0;
  for (std::size_t n = 0; n < count; ++n) sum += weights[nth(n)];
  if (p.sinks) {
    const double x = static_cast<double>(sink_logit - max_score);
    sum += static_cast<A>(detmath::exp(folded ? x * kLn2 : x));
  }
  const A reciprocal = A{1} / sum;
  auto finish = [&](bool normalised, std::vector<double>* out, std::vector<double>* probe) {
    rounded.resize(count);
    for (std::size_t n = 0; n < count; ++n) {
      rounded[n] = static_cast<A>(round_to_dtype(static_cast<double>(normalised ? weights[n] / sum : weights[n]), p.dtype));
    }
    auto result = [&](A acc) {
      return round_to_dtype(static_cast<double>(normalised ? acc : folded ? acc * reciprocal : acc / sum), p.dtype);
    };
    for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
      A acc = 0;
      for (std::size_t step = 0; step < count; ++step) {
        const std::size_t n = nth(step);
        const double v = view.v_rows[n][d];
        acc = folded ? std::fma(rounded[n], static_cast<A>(v), acc) : acc + rounded[n] * static_cast<A>(v);
      }
      (*out)[first + static_cast<std::size_t>(d)] = result(acc);
    }
    if (probe) {  // V = ones: the same sum with every v exactly 1
      A acc = 0;
      for (std::size_t step = 0; step < count; ++step) acc = folded ? std::fma(rounded[nth(step)], A{1}, acc) : acc + rounded[nth(step)];
      std::fill_n(probe->begin() + static_cast<std::ptrdiff_t>(first), width, result(acc));
    }
  };
  finish(formulation == Formulation::normalised, sinks.out, sinks.probe);
  if (sinks.normalised_out) finish(true, sinks.normalised_out, sinks.normalised_probe);
}

template <typename Body> void rows_in_parallel(const Problem& p, int threads, Body body) {
  const std::int64_t rows = p.rows();
  int workers = threads > 0 ? threads : available_cpus();
  if (rows * p.seq_k * (p.head_dim + p.head_dim_v) < (1 << 16)) workers = 1;
  auto work = [&](int worker) {
    auto run = [&](auto zero) {
      using A = decltype(zero);
      std::vector<A> weights, rounded;
      for (std::int64_t row = worker; row < rows; row += workers) body(row, weights, rounded);
    };
    if (p.dtype == DType::f64) run(0.0);
    else run(0.0f);
  };
  run_on_new_threads(workers, work);
}

}  // namespace

std::vector<double> baseline_attention(const CaseData& data, int threads, Formulation formulation) {
  std::vector<double> out(static_cast<std::size_t>(data.problem.out_elements()), 0.0);
  const RowSinks sinks{&out};
  rows_in_parallel(data.problem, threads, [&](std::int64_t row, auto& weights, auto& rounded) {
    baseline_row(data, row, sinks, weights, rounded, formulation);
  });
  return out;
}

BaselineFamily baseline_family(const CaseData& data, int threads) {
  const auto n = static_cast<std::size_t>(data.problem.out_elements());
  BaselineFamily family;
  family.out.assign(std::size(kFormulations), std::vector<double>(n, 0.0));
  family.probe.assign(std::size(kFormulations), std::vector<double>(n, 0.0));
  auto at = [](Formulation f) {
    return static_cast<std::size_t>(std::find(std::begin(kFormulations), std::end(kFormulations), f) - std::begin(kFormulations));
  };
  // Three passes for four formulations: the normalised one shares the natural pass.
  for (Formulation f : {Formulation::natural, Formulation::log2_folded, Formulation::reversed}) {
    RowSinks sinks{&family.out[at(f)], &family.probe[at(f)]};
    if (f == Formulation::natural) {
      sinks.normalised_out = &family.out[at(Formulation::normalised)];
      sinks.normalised_probe = &family.probe[at(Formulation::normalised)];
    }
    rows_in_parallel(data.problem, threads, [&](std::int64_t row, auto& weights, auto& rounded) {
      baseline_row(data, row, sinks, weights, rounded, f);
    });
  }
  return family;
}

std::vector<double> baseline_layer(const LayerData& layer, int threads, Formulation formulation) {
  const Problem& p = layer.problem;
  const std::vector<double> o = baseline_attention(layer_attention_inputs(layer), threads, formulation);
  const std::vector<double> merged = merge_heads(o, p.batch, p.heads_q, p.seq_q, p.head_dim_v);
  return project_in_dtype(merged, p.batch * p.seq_q, layer.o_width(), layer.w_o, layer.model_dim, layer.b_o, p.dtype);
}

}  // namespace attn
