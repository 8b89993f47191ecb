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
                                      bool bias_gradient, BackwardObserver* observer) {
  const Problem& p = data.problem;
  if (const Status defined = backward_defined(p); !defined) throw InputError(defined.reason);
  if (static_cast<std::int64_t>(dout.size()) != p.out_elements()) {
    throw InputError(fmt::format("dout holds {} values, the case's out {}", dout.size(), p.out_elements()));
  }
  const std::int64_t d_qk = p.head_dim, d_v = p.head_dim_v;
  std::vector<CompensatedSum> dk(data.k.size()), dv(data.v.size()), dbias, dsinks;
  if (bias_gradient && p.bias.present) dbias.resize(data.bias.size());
  if (p.sinks) dsinks.resize(static_cast<std::size_t>(p.heads_q));
  ReferenceGradients g;
  g.dq.assign(data.q.size(), 0.0);

  ReferenceRowView view;
  std::vector<BackwardKey> keys;
  std::vector<CompensatedSum> dq_row(static_cast<std::size_t>(d_qk));
  for (std::int64_t b = 0; b < p.q_batch(); ++b) {
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      for (std::int64_t i = 0; i < p.seq_q; ++i) {
        const std::int64_t row = (b * p.heads_q + h) * p.seq_q + i;
        reference_row_view(data, b, h, i, view);
        const std::size_t n = view.visible.size();
        if (n == 0) continue;  // no visible key: dQ is 0 and the row contributes nothing
        BackwardRow facts;
        facts.b = b, facts.h = h, facts.i = i, facts.row = row;
        facts.q = &data.q[static_cast<std::size_t>(row * d_qk)];
        facts.o = &forward.out[static_cast<std::size_t>(row * d_v)];
        facts.dout = &dout[static_cast<std::size_t>(row * d_v)];
        facts.lse = forward.lse[static_cast<std::size_t>(row)];
        const double* q = facts.q;
        const double* dO = facts.dout;
        // D = sum_d dO_d O_d: the weighted mean of dP over the row's keys.
        CompensatedSum delta;
        for (std::int64_t d = 0; d < d_v; ++d) {
          delta.add_product(dO[d], facts.o[d]);
          facts.abs_delta += std::fabs(dO[d] * facts.o[d]);
        }
        facts.D = delta.value();
        keys.resize(n);
        for (std::size_t t = 0; t < n; ++t) {
          BackwardKey& key = keys[t];
          key.j = view.visible[t];
          key.k = view.k_rows[t];
          key.k_at = static_cast<std::size_t>(view.k_rows[t] - data.k.data());
          key.v_at = static_cast<std::size_t>(view.v_rows[t] - data.v.data());
          key.p = detmath::exp(reference_score(data, b, h, i, key.j) - facts.lse);
          key.tanh = 0;
          if (p.softcap != 0) {
            // The cap's derivative at the scaled product, computed as the forward computes it.
            CompensatedSum dot;
            for (std::int64_t d = 0; d < d_qk; ++d) dot.add_product(q[d], key.k[d]);
            CompensatedSum scaled;
            scaled.add_product(p.scale, dot.value());
            key.tanh = detmath::tanh(scaled.value() / p.softcap);
          }
          CompensatedSum dp;
          double a = 0;
          for (std::int64_t d = 0; d < d_v; ++d) {
            dp.add_product(dO[d], view.v_rows[t][d]);
            a += std::fabs(dO[d] * view.v_rows[t][d]);
          }
          key.abs_dp = a;
          CompensatedSum diff;  // dP - D, with both parts exact to about one rounding
          diff.add(dp.value());
          diff.add(-facts.D);
          key.gap = diff.value();
          key.ds = key.p * key.gap;
          if (!dbias.empty()) key.bias_at = broadcast_at(p.bias, b, h, i, key.j, p.seq_k);
        }
        for (auto& s : dq_row) s = CompensatedSum{};
        for (const BackwardKey& key : keys) {
          const double dx = p.softcap != 0 ? key.ds * (1.0 - key.tanh * key.tanh) : key.ds;
          const double sx = p.scale * dx;
          for (std::int64_t d = 0; d < d_qk; ++d) {
            dq_row[static_cast<std::size_t>(d)].add_product(sx, key.k[d]);
            dk[key.k_at + static_cast<std::size_t>(d)].add_product(sx, q[d]);
          }
          for (std::int64_t d = 0; d < d_v; ++d) dv[key.v_at + static_cast<std::size_t>(d)].add_product(key.p, dO[d]);
          if (!dbias.empty()) dbias[key.bias_at].add(key.ds);
        }
        for (std::int64_t d = 0; d < d_qk; ++d) g.dq[static_cast<std::size_t>(row * d_qk + d)] = dq_row[static_cast<std::size_t>(d)].value();
        if (p.sinks) {
          // A sink's logit: d lse / d sink = P_sink, so dsink = -sum_i P_sink,i D_i.
          facts.p_sink = detmath::exp(data.sinks[static_cast<std::size_t>(h)] - facts.lse);
          dsinks[static_cast<std::size_t>(h)].add_product(-facts.p_sink, facts.D);
        }
        facts.keys = &keys;
        if (observer) observer->row(facts);
      }
    }
  }
  g.dk = values_of(dk);
  g.dv = values_of(dv);
  g.dbias = values_of(dbias);
  g.dsinks = values_of(dsinks);
  return g;
}

}  // namespace attn
