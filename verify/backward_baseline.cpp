#include "verify/backward_baseline.hpp"

#include <cmath>
#include <cstdlib>
#include <limits>

#include "core/detmath.hpp"
#include "reference/reference.hpp"
#include "verify/baseline.hpp"

namespace attn {

namespace {

// The sums of one formulation over the whole case, in arithmetic type A.
template <typename A>
struct Accumulators {
  std::vector<A> dq, dk, dv, dbias, dsinks;
};

template <typename A>
ReferenceGradients run_formulation(const CaseData& data, const std::vector<double>& dout, const std::vector<double>& out,
                                   bool bias_gradient, GradientFormulation formulation) {
  const Problem& p = data.problem;
  const bool textbook = formulation == GradientFormulation::textbook;
  const bool reversed = formulation == GradientFormulation::reversed;
  const std::int64_t d_qk = p.head_dim, d_v = p.head_dim_v;
  auto R = [&](A x) { return static_cast<A>(round_to_dtype(static_cast<double>(x), p.dtype)); };
  // The n-th of `count` in this formulation's order.
  auto nth = [&](std::int64_t n, std::int64_t count) { return reversed ? count - 1 - n : n; };
  const A scale = static_cast<A>(p.scale);

  Accumulators<A> acc;
  acc.dq.assign(data.q.size(), A{0});
  acc.dk.assign(data.k.size(), A{0});
  acc.dv.assign(data.v.size(), A{0});
  const bool with_bias = bias_gradient && p.bias.present;
  if (with_bias) acc.dbias.assign(data.bias.size(), A{0});
  if (p.sinks) acc.dsinks.assign(static_cast<std::size_t>(p.heads_q), A{0});
  // The textbook's GQA: kv heads repeated for each query head (as a framework
  // without native GQA does), so dK and dV are sums per query head, rounded to
  // the dtype, then summed over the group in the dtype by the repeat's backward.
  const std::int64_t group = p.group_size();
  const bool per_head = textbook && group > 1;
  std::vector<A> dk_heads(per_head ? data.k.size() * static_cast<std::size_t>(group) : 0);
  std::vector<A> dv_heads(per_head ? data.v.size() * static_cast<std::size_t>(group) : 0);
  // Row r of K or V (kv head g) as seen by query head h: its row among the repeated heads.
  auto head_row = [&](std::size_t r, std::int64_t h) {
    const auto seq = static_cast<std::size_t>(p.kv_seq());
    const std::size_t s_ = r % seq, bg = r / seq;
    const std::size_t bb = bg / static_cast<std::size_t>(p.heads_kv);
    return (bb * static_cast<std::size_t>(p.heads_q) + static_cast<std::size_t>(h)) * seq + s_;
  };

  ReferenceRowView view;
  std::vector<A> score, slope, prob, dx;
  const std::int64_t rows = p.rows();
  for (std::int64_t step = 0; step < rows; ++step) {
    const std::int64_t row = nth(step, rows);
    const std::int64_t i = row % p.seq_q, bh = row / p.seq_q, b = bh / p.heads_q, h = bh % p.heads_q;
    reference_row_view(data, b, h, i, view);
    const auto n = static_cast<std::int64_t>(view.visible.size());
    if (n == 0) continue;  // dQ stays 0; the row gives nothing
    const double* q = &data.q[static_cast<std::size_t>(row * d_qk)];
    const double* dO = &dout[static_cast<std::size_t>(row * d_v)];
    const double* o = &out[static_cast<std::size_t>(row * d_v)];
    // In this formulation's order, or in order (`forward`: as the forward computed it).
    auto dot = [&](const double* x, const double* y, std::int64_t width, bool forward = false) {
      A sum = 0;
      for (std::int64_t e = 0; e < width; ++e) {
        const std::int64_t d = forward ? e : nth(e, width);
        sum += static_cast<A>(x[d]) * static_cast<A>(y[d]);
      }
      return sum;
    };
    // The scores: the forward's (its natural formulation's, dot products in
    // order), which give the max, the sum and lse; and this formulation's own
    // recomputation of them, in its order (the same values but for reversed,
    // whose different roundings meet the forward's lse, as a fused backward's
    // tiles meet the forward kernel's).
    auto score_of = [&](std::int64_t t, bool forward, A* slope_out) {
      const std::int64_t j = view.visible[static_cast<std::size_t>(t)];
      A s = scale * dot(q, view.k_rows[static_cast<std::size_t>(t)], d_qk, forward), c = 1;
      if (p.softcap != 0) s = soft_capped<A>(s, p.softcap, &c);
      if (p.alibi) s += -static_cast<A>(data.alibi_slopes[static_cast<std::size_t>(h)]) * static_cast<A>(std::llabs(view.diag - j));
      if (p.bias.present) {
        const BroadcastShape& m = p.bias;
        const std::int64_t at =
            (((m.batch == 1 ? 0 : b) * m.heads + (m.heads == 1 ? 0 : h)) * m.rows + (m.rows == 1 ? 0 : i)) * p.seq_k + j;
        s += static_cast<A>(data.bias[static_cast<std::size_t>(at)]);
      }
      if (slope_out) *slope_out = c;
      return s;
    };
    score.resize(static_cast<std::size_t>(n)), slope.resize(static_cast<std::size_t>(n));
    const A sink = p.sinks ? static_cast<A>(data.sinks[static_cast<std::size_t>(h)]) : -std::numeric_limits<A>::infinity();
    A top = sink;
    for (std::int64_t t = 0; t < n; ++t) {
      score[static_cast<std::size_t>(t)] = score_of(t, true, &slope[static_cast<std::size_t>(t)]);
      top = std::max(top, score[static_cast<std::size_t>(t)]);
    }
    prob.resize(static_cast<std::size_t>(n)), dx.resize(static_cast<std::size_t>(n));
    A l = 0;
    for (std::int64_t t = 0; t < n; ++t) {
      const auto at = static_cast<std::size_t>(nth(t, n));
      prob[at] = static_cast<A>(detmath::exp(static_cast<double>(score[at] - top)));
      l += prob[at];
    }
    const A e_sink = p.sinks ? static_cast<A>(detmath::exp(static_cast<double>(sink - top))) : A{0};
    l += e_sink;
    A p_sink, delta = 0;
    if (textbook) {
      for (A& w : prob) w = R(w / l);
      p_sink = R(e_sink / l);
      std::vector<A>& dp = dx;  // dP first, then dX in place
      for (std::int64_t t = 0; t < n; ++t) {
        const auto at = static_cast<std::size_t>(nth(t, n));
        dp[at] = R(dot(dO, view.v_rows[at], d_v));
        delta += prob[at] * dp[at];
      }
      for (std::size_t t = 0; t < dx.size(); ++t) {
        const A ds = R(prob[t] * (dp[t] - delta));
        dx[t] = p.softcap != 0 ? R(ds * slope[t]) : ds;
        score[t] = ds;  // kept for dbias
      }
    } else {
      const A lse = top + static_cast<A>(std::log(static_cast<double>(l)));
      for (std::int64_t t = 0; t < n; ++t) {
        const auto at = static_cast<std::size_t>(t);
        if (reversed) score[at] = score_of(t, false, &slope[at]);  // recomputed in its own order
        prob[at] = static_cast<A>(detmath::exp(static_cast<double>(score[at] - lse)));
      }
      p_sink = p.sinks ? static_cast<A>(detmath::exp(static_cast<double>(sink - lse))) : A{0};
      delta = dot(dO, o, d_v);
      for (std::int64_t t = 0; t < n; ++t) {
        const auto at = static_cast<std::size_t>(nth(t, n));
        const A ds = prob[at] * (dot(dO, view.v_rows[at], d_v) - delta);
        score[at] = ds;
        dx[at] = R(ds * slope[at]);
        prob[at] = R(prob[at]);  // the 16-bit operand of dV's product
      }
    }
    // The three products and the reductions.
    A* dq = &acc.dq[static_cast<std::size_t>(row * d_qk)];
    for (std::int64_t t = 0; t < n; ++t) {
      const auto at = static_cast<std::size_t>(nth(t, n));
      const double* k = view.k_rows[at];
      const auto k_off = static_cast<std::size_t>(k - data.k.data());
      const auto v_off = static_cast<std::size_t>(view.v_rows[at] - data.v.data());
      for (std::int64_t e = 0; e < d_qk; ++e) {
        const std::int64_t d = nth(e, d_qk);
        dq[d] += dx[at] * static_cast<A>(k[d]);
        if (per_head) {
          dk_heads[head_row(k_off / static_cast<std::size_t>(d_qk), h) * static_cast<std::size_t>(d_qk) + static_cast<std::size_t>(d)] +=
              dx[at] * static_cast<A>(q[d]);
        } else {
          acc.dk[k_off + static_cast<std::size_t>(d)] += dx[at] * static_cast<A>(q[d]);
        }
      }
      for (std::int64_t e = 0; e < d_v; ++e) {
        const std::int64_t d = nth(e, d_v);
        if (per_head) {
          dv_heads[head_row(v_off / static_cast<std::size_t>(d_v), h) * static_cast<std::size_t>(d_v) + static_cast<std::size_t>(d)] +=
              prob[at] * static_cast<A>(dO[d]);
        } else {
          acc.dv[v_off + static_cast<std::size_t>(d)] += prob[at] * static_cast<A>(dO[d]);
        }
      }
      if (with_bias) {
        const BroadcastShape& m = p.bias;
        const std::int64_t j = view.visible[at];
        const std::int64_t bias_at =
            (((m.batch == 1 ? 0 : b) * m.heads + (m.heads == 1 ? 0 : h)) * m.rows + (m.rows == 1 ? 0 : i)) * p.seq_k + j;
        acc.dbias[static_cast<std::size_t>(bias_at)] += score[at];
      }
    }
    if (p.sinks) acc.dsinks[static_cast<std::size_t>(h)] -= p_sink * delta;
  }

  ReferenceGradients g;
  auto finish = [&](const std::vector<A>& sums, A factor) {
    std::vector<double> values(sums.size());
    for (std::size_t e = 0; e < sums.size(); ++e) values[e] = static_cast<double>(R(factor * sums[e]));
    return values;
  };
  g.dq = finish(acc.dq, scale);
  g.dk = finish(acc.dk, scale);
  g.dv = finish(acc.dv, A{1});
  if (per_head) {
    // Each query head's share rounded to the dtype, then the group's sum in the dtype.
    auto group_sum = [&](std::vector<double>& sums, const std::vector<A>& heads, std::int64_t width, A factor) {
      for (std::size_t e = 0; e < sums.size(); ++e) {
        const std::size_t r = e / static_cast<std::size_t>(width), d = e % static_cast<std::size_t>(width);
        const std::int64_t g0 = static_cast<std::int64_t>((r / static_cast<std::size_t>(p.kv_seq())) % static_cast<std::size_t>(p.heads_kv));
        A total = 0;
        for (std::int64_t h = g0 * group; h < (g0 + 1) * group; ++h) {
          total = R(total + R(factor * heads[head_row(r, h) * static_cast<std::size_t>(width) + d]));
        }
        sums[e] = static_cast<double>(total);
      }
    };
    group_sum(g.dk, dk_heads, d_qk, scale);
    group_sum(g.dv, dv_heads, d_v, A{1});
  }
  g.dbias = finish(acc.dbias, A{1});
  g.dsinks = finish(acc.dsinks, A{1});
  return g;
}

}  // namespace

ReferenceGradients baseline_backward(const CaseData& data, const std::vector<double>& dout, const std::vector<double>& out,
                                     bool bias_gradient, GradientFormulation formulation) {
  if (data.problem.dtype == DType::f64) return run_formulation<double>(data, dout, out, bias_gradient, formulation);
  return run_formulation<float>(data, dout, out, bias_gradient, formulation);
}

std::vector<ReferenceGradients> baseline_backward_family(const CaseData& data, const std::vector<double>& dout,
                                                         const std::vector<double>& out, bool bias_gradient) {
  std::vector<ReferenceGradients> family;
  for (GradientFormulation f : kGradientFormulations) family.push_back(baseline_backward(data, dout, out, bias_gradient, f));
  return family;
}

}  // namespace attn
