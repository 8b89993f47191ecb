#include "reference/backward.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "attnbench/backend.hpp"
#include "attnbench/error.hpp"
#include "core/detmath.hpp"
#include "reference/compensated_sum.hpp"

namespace attn {

namespace {

// Index of (b, h, i, j) in a mask or bias of the problem's broadcast shape.
std::size_t broadcast_at(const BroadcastShape& s, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j,
                         std::int64_t seq_k) {
  const std::int64_t bb = s.batch == 1 ? 0 : b, hh = s.heads == 1 ? 0 : h, ii = s.rows == 1 ? 0 : i;
  return static_cast<std::size_t>(((bb * s.heads + hh) * s.rows + ii) * seq_k + j);
}

std::vector<double> values_of(const std::vector<CompensatedSum>& sums) {
  std::vector<double> out(sums.size());
  for (std::size_t e = 0; e < sums.size(); ++e) out[e] = sums[e].value();
  return out;
}

}  // namespace

// Built twice like the forward's compute_row: std::fma inside CompensatedSum
// is an instruction or a library call, with the same bits either way.
__attribute__((target_clones("fma", "default")))
ReferenceGradients reference_backward(const CaseData& data, const std::vector<double>& dout, const ReferenceResult& forward,
                                      const ReferenceStats& stats, bool bias_gradient, const GradientPrecision* precision,
                                      GradientErrors* errors) {
  const Problem& p = data.problem;
  if (const Status defined = backward_defined(p); !defined) throw InputError(defined.reason);
  if (static_cast<std::int64_t>(dout.size()) != p.out_elements()) {
    throw InputError(fmt::format("dout holds {} values, the case's out {}", dout.size(), p.out_elements()));
  }
  const std::int64_t d_qk = p.head_dim, d_v = p.head_dim_v;
  const bool track = errors != nullptr && precision != nullptr;
  const double u = track ? precision->u : 0, ua = track ? precision->u_acc : 0, f_min = track ? precision->f_min : 0;
  const double sqrt_d = std::sqrt(static_cast<double>(d_qk)), sqrt_dv = std::sqrt(static_cast<double>(d_v));

  std::vector<CompensatedSum> dk(data.k.size()), dv(data.v.size()), dbias, dsinks;
  if (bias_gradient && p.bias.present) dbias.resize(data.bias.size());
  if (p.sinks) dsinks.resize(static_cast<std::size_t>(p.heads_q));
  ReferenceGradients g;
  g.dq.assign(data.q.size(), 0.0);
  // Error magnitudes, and the sums of |terms| and term counts whose rounding they add at the end.
  std::vector<double> e_dq, e_dk, e_dv, e_db, e_ds, m_dk, m_dv, m_db, m_ds;
  std::vector<double> c_dq_all, c_dk, c_db;  // the magnitudes (GradientErrors::magnitude) where dS's terms count before cancelling
  // dV's magnitude: its sum of |terms| and what rounding the score at the
  // size of its bias and ALiBi moves (c_* hold the same for dQ, dK, dbias).
  std::vector<double> c_dv;
  std::vector<std::int64_t> n_dk, n_db;
  if (track) {
    e_dq.assign(g.dq.size(), 0.0), c_dq_all.assign(g.dq.size(), 0.0);
    e_dk.assign(dk.size(), 0.0), m_dk.assign(dk.size(), 0.0), c_dk.assign(dk.size(), 0.0), n_dk.assign(dk.size() / static_cast<std::size_t>(std::max<std::int64_t>(d_qk, 1)), 0);
    e_dv.assign(dv.size(), 0.0), m_dv.assign(dv.size(), 0.0), c_dv.assign(dv.size(), 0.0);
    e_db.assign(dbias.size(), 0.0), m_db.assign(dbias.size(), 0.0), c_db.assign(dbias.size(), 0.0), n_db.assign(dbias.size(), 0);
    e_ds.assign(dsinks.size(), 0.0), m_ds.assign(dsinks.size(), 0.0);
  }

  ReferenceRowView view;
  std::vector<double> prob, dscore, dx, tanh_x, abs_dp, gap, added;
  std::vector<CompensatedSum> dq_row(static_cast<std::size_t>(d_qk));
  std::vector<double> m_dq(static_cast<std::size_t>(d_qk)), c_dq(static_cast<std::size_t>(d_qk));
  for (std::int64_t b = 0; b < p.q_batch(); ++b) {
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        const std::int64_t row = (b * p.heads_q + h) * p.seq_q + i;
        reference_row_view(data, b, h, i, view);
        const std::size_t n = view.visible.size();
        if (n == 0) continue;  // no visible key: dQ is 0 and the row contributes nothing
        const double* q = &data.q[static_cast<std::size_t>(row * d_qk)];
        const double* o = &forward.out[static_cast<std::size_t>(row * d_v)];
        const double* dO = &dout[static_cast<std::size_t>(row * d_v)];
        const double lse = forward.lse[static_cast<std::size_t>(row)];
        // D = sum_d dO_d O_d: the weighted mean of dP over the row's keys.
        CompensatedSum delta;
        double abs_delta = 0;
        for (std::int64_t d = 0; d < d_v; ++d) {
          delta.add_product(dO[d], o[d]);
          abs_delta += std::fabs(dO[d] * o[d]);
        }
        const double D = delta.value();
        prob.resize(n), dscore.resize(n), dx.resize(n), tanh_x.resize(n), abs_dp.resize(n), gap.resize(n), added.resize(n);
        for (std::size_t t = 0; t < n; ++t) {
          const std::int64_t j = view.visible[t];
          const double* k = view.k_rows[t];
          const double* v = view.v_rows[t];
          prob[t] = detmath::exp(reference_score(data, b, h, i, j) - lse);
          added[t] = track ? reference_added_magnitude(data, b, h, i, j) : 0.0;
          tanh_x[t] = 0;
          if (p.softcap != 0) {
            // The cap's derivative at the scaled product, computed as the forward computes it.
            CompensatedSum dot;
            for (std::int64_t d = 0; d < d_qk; ++d) dot.add_product(q[d], k[d]);
            CompensatedSum scaled;
            scaled.add_product(p.scale, dot.value());
            tanh_x[t] = detmath::tanh(scaled.value() / p.softcap);
          }
          CompensatedSum dp;
          double a = 0;
          for (std::int64_t d = 0; d < d_v; ++d) {
            dp.add_product(dO[d], v[d]);
            a += std::fabs(dO[d] * v[d]);
          }
          abs_dp[t] = a;
          CompensatedSum diff;  // dP - D, with both parts exact to about one rounding
          diff.add(dp.value());
          diff.add(-D);
          gap[t] = diff.value();
          dscore[t] = prob[t] * gap[t];
          dx[t] = p.softcap != 0 ? dscore[t] * (1.0 - tanh_x[t] * tanh_x[t]) : dscore[t];
        }
        for (auto& s : dq_row) s = CompensatedSum{};
        std::fill(m_dq.begin(), m_dq.end(), 0.0);
        std::fill(c_dq.begin(), c_dq.end(), 0.0);
        // The forward's error of O, which D inherits (the forward bound's terms).
        const double score_error = (sqrt_d + 2.0) * ua * stats.score_magnitude[static_cast<std::size_t>(row)];
        const double sqrt_n = std::sqrt(static_cast<double>(n));
        // exp(s - lse) inherits the rounding of lse itself, relative to its size.
        const double lse_error = ua * std::fabs(lse);
        double e_delta = 0;
        if (track) {
          e_delta = (sqrt_dv + 1.0) * ua * abs_delta;
          for (std::int64_t d = 0; d < d_v; ++d) {
            const auto e = static_cast<std::size_t>(row * d_v + d);
            const double e_o = u * std::fabs(o[d]) + f_min + (u + sqrt_n * ua) * stats.weighted_abs_v[e] +
                               score_error * stats.weighted_dev_v[e];
            e_delta += std::fabs(dO[d]) * e_o;
          }
        }
        for (std::size_t t = 0; t < n; ++t) {
          const std::int64_t j = view.visible[t];
          const double* k = view.k_rows[t];
          const auto k_off = static_cast<std::size_t>(view.k_rows[t] - data.k.data());
          const auto v_off = static_cast<std::size_t>(view.v_rows[t] - data.v.data());
          const double sx = p.scale * dx[t];
          for (std::int64_t d = 0; d < d_qk; ++d) {
            dq_row[static_cast<std::size_t>(d)].add_product(sx, k[d]);
            dk[k_off + static_cast<std::size_t>(d)].add_product(sx, q[d]);
          }
          for (std::int64_t d = 0; d < d_v; ++d) dv[v_off + static_cast<std::size_t>(d)].add_product(prob[t], dO[d]);
          std::size_t bias_at = 0;
          if (!dbias.empty()) {
            bias_at = broadcast_at(p.bias, b, h, i, j, p.seq_k);
            dbias[bias_at].add(dscore[t]);
          }
          if (!track) continue;
          // Errors: P moved by the score error, the lse's and its rounding;
          // dS by those, by dP's and D's roundings (on |dP| + |D|: the
          // cancellation) and its own rounding; the cap's slope by the score error.
          // P and dS rounded to the dtype may land on its subnormals: f_min, absolutely.
          const double e_p = prob[t] * (u + 2.0 * score_error + sqrt_n * ua + lse_error) + f_min;
          const double e_s = e_p * std::fabs(gap[t]) + prob[t] * ((sqrt_dv + 1.0) * ua * abs_dp[t] + e_delta) +
                             u * std::fabs(dscore[t]) + f_min;
          double e_x = e_s;
          if (p.softcap != 0) {
            const double slope = 1.0 - tanh_x[t] * tanh_x[t];
            e_x = e_s * slope + std::fabs(dscore[t]) * 2.0 * std::fabs(tanh_x[t]) * slope * score_error / p.softcap;
          }
          const double scale = std::fabs(p.scale);
          // The magnitude dS is rounded at before dP and D cancel: P (|dP| + |D|).
          const double slope = p.softcap != 0 ? 1.0 - tanh_x[t] * tanh_x[t] : 1.0;
          const double before = scale * prob[t] * (abs_dp[t] + std::fabs(D)) * slope;
          // Any float formulation rounds the score at the size of the bias and
          // ALiBi it adds: P moves by that many roundoffs relative, and dS, dQ,
          // dK, dV, dbias with it (a bias of -1000 puts it in the thousands).
          const double moved = prob[t] * added[t];
          const double moved_x = scale * moved * std::fabs(gap[t]) * slope;
          for (std::int64_t d = 0; d < d_qk; ++d) {
            e_dq[static_cast<std::size_t>(row * d_qk + d)] += scale * e_x * std::fabs(k[d]);
            m_dq[static_cast<std::size_t>(d)] += std::fabs(sx * k[d]);
            c_dq[static_cast<std::size_t>(d)] += std::max(std::fabs(sx * k[d]), before * std::fabs(k[d])) + moved_x * std::fabs(k[d]);
            e_dk[k_off + static_cast<std::size_t>(d)] += scale * e_x * std::fabs(q[d]);
            m_dk[k_off + static_cast<std::size_t>(d)] += std::fabs(sx * q[d]);
            c_dk[k_off + static_cast<std::size_t>(d)] +=
                std::max(std::fabs(sx * q[d]), before * std::fabs(q[d])) + moved_x * std::fabs(q[d]);
          }
          ++n_dk[k_off / static_cast<std::size_t>(d_qk)];
          for (std::int64_t d = 0; d < d_v; ++d) {
            e_dv[v_off + static_cast<std::size_t>(d)] += e_p * std::fabs(dO[d]);
            m_dv[v_off + static_cast<std::size_t>(d)] += prob[t] * std::fabs(dO[d]);
            c_dv[v_off + static_cast<std::size_t>(d)] += (prob[t] + moved) * std::fabs(dO[d]);
          }
          if (!dbias.empty()) {
            e_db[bias_at] += e_s;
            m_db[bias_at] += std::fabs(dscore[t]);
            c_db[bias_at] += std::max(std::fabs(dscore[t]), prob[t] * (abs_dp[t] + std::fabs(D))) + moved * std::fabs(gap[t]);
            ++n_db[bias_at];
          }
        }
        for (std::int64_t d = 0; d < d_qk; ++d) {
          const auto e = static_cast<std::size_t>(row * d_qk + d);
          g.dq[e] = dq_row[static_cast<std::size_t>(d)].value();
          if (!track) continue;
          e_dq[e] += sqrt_n * ua * m_dq[static_cast<std::size_t>(d)] + u * std::fabs(g.dq[e]);
          c_dq_all[e] = c_dq[static_cast<std::size_t>(d)];
        }
        if (p.sinks) {
          // A sink's logit: d lse / d sink = P_sink, so dsink = -sum_i P_sink,i D_i.
          const double sink = data.sinks[static_cast<std::size_t>(h)];
          const double p_sink = detmath::exp(sink - lse);
          dsinks[static_cast<std::size_t>(h)].add_product(-p_sink, D);
          if (track) {
            e_ds[static_cast<std::size_t>(h)] +=
                p_sink * (std::fabs(D) * (u + 2.0 * score_error + sqrt_n * ua + lse_error) + e_delta);
            m_ds[static_cast<std::size_t>(h)] += std::fabs(p_sink * D);
          }
        }
      }
    }
  }
  g.dk = values_of(dk);
  g.dv = values_of(dv);
  g.dbias = values_of(dbias);
  g.dsinks = values_of(dsinks);
  if (track) {
    // The roundings of the sums over rows (root-n growth) and of each result.
    for (std::size_t e = 0; e < e_dk.size(); ++e) {
      const double m = static_cast<double>(n_dk[e / static_cast<std::size_t>(d_qk)]);
      e_dk[e] += std::sqrt(std::max(m, 1.0)) * ua * m_dk[e] + u * std::fabs(g.dk[e]);
    }
    const std::size_t v_rows = d_v > 0 ? e_dv.size() / static_cast<std::size_t>(d_v) : 0;
    for (std::size_t e = 0; e < e_dv.size(); ++e) {
      // dV's rows are summed over the same rows as dK's of the same key.
      const std::size_t key = e / static_cast<std::size_t>(d_v);
      const double m = key < n_dk.size() && v_rows == n_dk.size() ? static_cast<double>(n_dk[key]) : 1.0;
      e_dv[e] += std::sqrt(std::max(m, 1.0)) * ua * m_dv[e] + u * std::fabs(g.dv[e]);
    }
    for (std::size_t e = 0; e < e_db.size(); ++e) {
      e_db[e] += std::sqrt(std::max(static_cast<double>(n_db[e]), 1.0)) * ua * m_db[e] + u * std::fabs(g.dbias[e]);
    }
    const double rows_per_head = static_cast<double>(p.q_batch() * p.seq_q);
    for (std::size_t e = 0; e < e_ds.size(); ++e) {
      e_ds[e] += std::sqrt(std::max(rows_per_head, 1.0)) * ua * m_ds[e] + u * std::fabs(g.dsinks[e]);
    }
    *errors = {std::move(e_dq), std::move(e_dk), std::move(e_dv), std::move(e_db), std::move(e_ds),
               {std::move(c_dq_all), std::move(c_dk), std::move(c_dv), std::move(c_db), std::move(m_ds)}};
  }
  return g;
}

}  // namespace attn
