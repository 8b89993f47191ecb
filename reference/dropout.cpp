#include "reference/dropout.hpp"

#include <fmt/format.h>

#include <cmath>

#include "attnbench/backend.hpp"
#include "attnbench/error.hpp"
#include "core/detmath.hpp"
#include "reference/compensated_sum.hpp"

namespace attn {

namespace {

std::vector<double> values_of(const std::vector<CompensatedSum>& sums) {
  std::vector<double> out(sums.size());
  for (std::size_t e = 0; e < sums.size(); ++e) out[e] = sums[e].value();
  return out;
}

// The dropout factor c of each visible key of row (b, h, i): 0 or keep_scale.
void row_factors(const CaseData& data, std::int64_t b, std::int64_t h, std::int64_t i, const ReferenceRowView& view,
                 const DropoutMaskView& mask, std::vector<double>& c) {
  const Problem& p = data.problem;
  const ReferenceRowEntry at = reference_row_entry(data, b, i);
  c.resize(view.visible.size());
  for (std::size_t t = 0; t < view.visible.size(); ++t) {
    c[t] = mask.at(p, at.entry, h, at.i, view.visible[t]) ? mask.keep_scale : 0.0;
  }
}

}  // namespace

__attribute__((target_clones("fma", "default")))  // as reference_attention's rows
DropoutForwardTruth reference_dropout(const CaseData& data, const ReferenceResult& forward, const DropoutMaskView& mask) {
  const Problem& p = data.problem;
  DropoutForwardTruth t;
  t.out.assign(static_cast<std::size_t>(p.out_elements()), 0.0);
  t.magnitude.assign(t.out.size(), 0.0);
  ReferenceRowView view;
  std::vector<double> c, weight;
  for (std::int64_t b = 0; b < p.q_batch(); ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        const std::int64_t row = (b * p.heads_q + h) * p.seq_q + i;
        reference_row_view(data, b, h, i, view);
        if (view.visible.empty()) continue;  // 0, as without dropout
        row_factors(data, b, h, i, view, mask, c);
        const double lse = forward.lse[static_cast<std::size_t>(row)];
        weight.resize(view.visible.size());
        for (std::size_t n = 0; n < view.visible.size(); ++n) {
          weight[n] = c[n] == 0 ? 0.0 : detmath::exp(reference_score(data, b, h, i, view.visible[n]) - lse) * c[n];
        }
        for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
          CompensatedSum acc;
          double magnitude = 0;
          for (std::size_t n = 0; n < view.visible.size(); ++n) {
            acc.add_product(weight[n], view.v_rows[n][d]);
            magnitude += std::fabs(weight[n] * view.v_rows[n][d]);
          }
          t.out[static_cast<std::size_t>(row * p.head_dim_v + d)] = acc.value();
          t.magnitude[static_cast<std::size_t>(row * p.head_dim_v + d)] = magnitude;
        }
      }
  return t;
}

__attribute__((target_clones("fma", "default")))
DropoutGradientTruth reference_dropout_backward(const CaseData& data, const std::vector<double>& dout,
                                                const ReferenceResult& forward, const std::vector<double>& dropout_out,
                                                const DropoutMaskView& mask, bool bias_gradient) {
  const Problem& p = data.problem;
  if (const Status defined = backward_defined(p); !defined) throw InputError(defined.reason);
  if (static_cast<std::int64_t>(dout.size()) != p.out_elements()) {
    throw InputError(fmt::format("dout holds {} values, the case's out {}", dout.size(), p.out_elements()));
  }
  const std::int64_t d_qk = p.head_dim, d_v = p.head_dim_v;
  const bool with_bias = bias_gradient && p.bias.present;
  std::vector<CompensatedSum> dq(data.q.size()), dk(data.k.size()), dv(data.v.size()),
      dbias(with_bias ? data.bias.size() : 0), dsinks(p.sinks ? static_cast<std::size_t>(p.heads_q) : 0);
  DropoutGradientTruth t;
  ReferenceGradients& m = t.magnitude;
  m.dq.assign(data.q.size(), 0.0);
  m.dk.assign(data.k.size(), 0.0);
  m.dv.assign(data.v.size(), 0.0);
  m.dbias.assign(dbias.size(), 0.0);
  m.dsinks.assign(dsinks.size(), 0.0);
  ReferenceRowView view;
  std::vector<double> c;
  for (std::int64_t b = 0; b < p.q_batch(); ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        const std::int64_t row = (b * p.heads_q + h) * p.seq_q + i;
        reference_row_view(data, b, h, i, view);
        if (view.visible.empty()) continue;
        row_factors(data, b, h, i, view, mask, c);
        const double lse = forward.lse[static_cast<std::size_t>(row)];
        const double* q = &data.q[static_cast<std::size_t>(row * d_qk)];
        const double* dO = &dout[static_cast<std::size_t>(row * d_v)];
        const double* o = &dropout_out[static_cast<std::size_t>(row * d_v)];
        // D = dO . O = sum_j p_j c_j dP_j: the row's mean of dP under the kept weights.
        CompensatedSum delta;
        double abs_delta = 0;
        for (std::int64_t d = 0; d < d_v; ++d) {
          delta.add_product(dO[d], o[d]);
          abs_delta += std::fabs(dO[d] * o[d]);
        }
        const double D = delta.value();
        for (std::size_t n = 0; n < view.visible.size(); ++n) {
          const std::int64_t j = view.visible[n];
          const double pj = detmath::exp(reference_score(data, b, h, i, j) - lse);
          const double* k = view.k_rows[n];
          const double* v = view.v_rows[n];
          CompensatedSum dp;
          double abs_dp = 0;
          for (std::int64_t d = 0; d < d_v; ++d) {
            dp.add_product(dO[d], v[d]);
            abs_dp += std::fabs(dO[d] * v[d]);
          }
          CompensatedSum gap;  // c dP - D
          gap.add_product(c[n], dp.value());
          gap.add(-D);
          const double ds = pj * gap.value();
          const double ds_magnitude = pj * (c[n] * abs_dp + abs_delta);
          double slope = 1;
          if (p.softcap != 0) {
            CompensatedSum dot;
            for (std::int64_t d = 0; d < d_qk; ++d) dot.add_product(q[d], k[d]);
            CompensatedSum scaled;
            scaled.add_product(p.scale, dot.value());
            const double th = detmath::tanh(scaled.value() / p.softcap);
            slope = 1.0 - th * th;
          }
          const double sx = p.scale * ds * slope, sx_magnitude = std::fabs(p.scale * slope) * ds_magnitude;
          const std::size_t k_at = static_cast<std::size_t>(k - data.k.data());
          const std::size_t v_at = static_cast<std::size_t>(v - data.v.data());
          for (std::int64_t d = 0; d < d_qk; ++d) {
            const std::size_t qd = static_cast<std::size_t>(row * d_qk + d), kd = k_at + static_cast<std::size_t>(d);
            dq[qd].add_product(sx, k[d]);
            dk[kd].add_product(sx, q[d]);
            m.dq[qd] += sx_magnitude * std::fabs(k[d]);
            m.dk[kd] += sx_magnitude * std::fabs(q[d]);
          }
          for (std::int64_t d = 0; d < d_v; ++d) {
            const std::size_t vd = v_at + static_cast<std::size_t>(d);
            dv[vd].add_product(pj * c[n], dO[d]);
            m.dv[vd] += std::fabs(pj * c[n] * dO[d]);
          }
          if (with_bias) {
            const BroadcastShape& s = p.bias;
            const std::size_t at = static_cast<std::size_t>(
                (((s.batch == 1 ? 0 : b) * s.heads + (s.heads == 1 ? 0 : h)) * s.rows + (s.rows == 1 ? 0 : i)) * p.seq_k + j);
            dbias[at].add(ds);
            m.dbias[at] += ds_magnitude;
          }
        }
        if (p.sinks) {
          const double p_sink = detmath::exp(data.sinks[static_cast<std::size_t>(h)] - lse);
          dsinks[static_cast<std::size_t>(h)].add_product(-p_sink, D);
          m.dsinks[static_cast<std::size_t>(h)] += p_sink * abs_delta;
        }
      }
  t.value.dq = values_of(dq);
  t.value.dk = values_of(dk);
  t.value.dv = values_of(dv);
  t.value.dbias = values_of(dbias);
  t.value.dsinks = values_of(dsinks);
  return t;
}

}  // namespace attn
