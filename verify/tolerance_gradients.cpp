// The gradients' a-priori bounds (verify/tolerance.hpp, derive_gradient_bounds):
// the error model of a plain same-precision backward, fed with the facts
// reference_backward reports for each row (reference/backward.hpp).
#include <algorithm>
#include <cmath>

#include "reference/backward.hpp"
#include "verify/tolerance.hpp"

namespace attn {

namespace {

// First-order error magnitudes per gradient element, accumulated over the
// rows; the magnitudes (c_*) each element is summed from, dS's terms taken
// before dP and D cancel; the sums of |terms| (m_*) and term counts (n_*)
// whose rounding the end adds.
class GradientErrorModel final : public BackwardObserver {
 public:
  GradientErrorModel(const CaseData& data, const ReferenceStats& stats, bool bias_gradient)
      : data_(data), stats_(stats), p_(data.problem) {
    u_ = unit_roundoff(p_.dtype), ua_ = accumulation_roundoff(p_.dtype), f_min_ = underflow_floor(p_.dtype);
    const std::size_t d_qk = static_cast<std::size_t>(std::max<std::int64_t>(p_.head_dim, 1));
    const std::size_t bias = bias_gradient && p_.bias.present ? data.bias.size() : 0;
    const std::size_t sinks = p_.sinks ? static_cast<std::size_t>(p_.heads_q) : 0;
    e_dq_.assign(data.q.size(), 0.0), m_dq_.assign(data.q.size(), 0.0), c_dq_.assign(data.q.size(), 0.0);
    sqrt_n_.assign(static_cast<std::size_t>(p_.rows()), 0.0);
    e_dk_.assign(data.k.size(), 0.0), m_dk_.assign(data.k.size(), 0.0), c_dk_.assign(data.k.size(), 0.0);
    n_dk_.assign(data.k.size() / d_qk, 0);
    e_dv_.assign(data.v.size(), 0.0), m_dv_.assign(data.v.size(), 0.0), c_dv_.assign(data.v.size(), 0.0);
    e_db_.assign(bias, 0.0), m_db_.assign(bias, 0.0), c_db_.assign(bias, 0.0), n_db_.assign(bias, 0);
    e_ds_.assign(sinks, 0.0), m_ds_.assign(sinks, 0.0);
  }

  void row(const BackwardRow& r) override {
    const std::int64_t d_qk = p_.head_dim, d_v = p_.head_dim_v;
    const double u = u_, ua = ua_, f_min = f_min_;
    const double sqrt_d = std::sqrt(static_cast<double>(d_qk)), sqrt_dv = std::sqrt(static_cast<double>(d_v));
    const std::vector<BackwardKey>& keys = *r.keys;
    const double sqrt_n = std::sqrt(static_cast<double>(keys.size()));
    sqrt_n_[static_cast<std::size_t>(r.row)] = sqrt_n;
    // The forward's error of the scores and of O, which D inherits (the forward bound's terms).
    const double score_error = (sqrt_d + 2.0) * ua * stats_.score_magnitude[static_cast<std::size_t>(r.row)];
    // O's own score error with a sink (the forward bound's rounding at the
    // scores' distance from it); P's is lse_error below.
    const double sink_error = p_.sinks && std::isfinite(r.lse) ? ua * std::fabs(r.lse) : 0.0;
    // exp(s - lse) inherits the rounding of lse itself, relative to its size.
    const double lse_error = ua * std::fabs(r.lse);
    double e_delta = (sqrt_dv + 1.0) * ua * r.abs_delta;
    for (std::int64_t d = 0; d < d_v; ++d) {
      const auto e = static_cast<std::size_t>(r.row * d_v + d);
      // Weights that underflow lose up to themselves each, times |v| (the
      // forward bound's term): with a sink far above the scores and |v| near
      // float32's largest, that is O's whole error, and D's and dsink's.
      double underflowed = 0;
      if (e < stats_.tiny_weighted_v.size() && e < stats_.hull_lo.size()) {
        const double v_max = std::max(std::fabs(stats_.hull_lo[e]), std::fabs(stats_.hull_hi[e]));
        underflowed = std::min(stats_.tiny_weighted_v[e], static_cast<double>(keys.size()) * weight_underflow(p_.dtype) * v_max);
      }
      const double e_o = u * std::fabs(r.o[d]) + f_min + (u + sqrt_n * ua) * stats_.weighted_abs_v[e] +
                         (score_error + sink_error) * stats_.weighted_dev_v[e] + underflowed;
      e_delta += std::fabs(r.dout[d]) * e_o;
    }
    const double scale = std::fabs(p_.scale);
    for (const BackwardKey& key : keys) {
      // P moved by the score error, the lse's and its rounding; dS by those,
      // by dP's and D's roundings (on |dP| + |D|: the cancellation) and its
      // own rounding; the cap's slope by the score error. P and dS rounded to
      // the dtype may land on its subnormals: f_min, absolutely.
      const double e_p = key.p * (u + 2.0 * score_error + sqrt_n * ua + lse_error) + f_min;
      const double e_s = e_p * std::fabs(key.gap) + key.p * ((sqrt_dv + 1.0) * ua * key.abs_dp + e_delta) +
                         u * std::fabs(key.ds) + f_min;
      const double slope = p_.softcap != 0 ? 1.0 - key.tanh * key.tanh : 1.0;
      double e_x = e_s;
      if (p_.softcap != 0) {
        // The slope 1 - t^2 is computed from t = tanh rounded in the
        // arithmetic type: its error is absolute, about 3 u_acc t^2 (t's
        // rounding, doubled by the square, and the square's own) plus the
        // subtraction's rounding, whatever the slope's size. Where the cap
        // saturates (|x| / cap beyond 9 in float32) t rounds to 1 and every
        // float implementation's slope is 0 where the true one is 1e-8.
        const double slope_rounding = ua * (3.0 * key.tanh * key.tanh + slope);
        e_x = e_s * slope + std::fabs(key.ds) * (2.0 * std::fabs(key.tanh) * slope * score_error / p_.softcap + slope_rounding);
      }
      const double sx = p_.scale * (p_.softcap != 0 ? key.ds * slope : key.ds);
      // The magnitude dS is rounded at before dP and D cancel: P (|dP| + |D|).
      const double before = scale * key.p * (key.abs_dp + std::fabs(r.D)) * slope;
      // Any float formulation rounds the score at the size of the bias and
      // ALiBi it adds: P moves by that many roundoffs relative, and dS, dQ,
      // dK, dV, dbias with it (a bias of -1000 puts it in the thousands).
      // A sink is no lattice value: every formulation subtracts it (as the
      // row's max or inside lse) from the score, which rounds at their
      // distance |s_j - sink| = |log(p_j / p_sink)| (a sink near 90 above
      // scores near 1: P_j off by 64 roundoffs in any float32 backward).
      const double sink_distance = r.p_sink > 0 && key.p > 0 ? std::fabs(std::log(key.p / r.p_sink)) : 0.0;
      const double moved = key.p * (reference_added_magnitude(data_, r.b, r.h, r.i, key.j) + sink_distance);
      const double moved_x = scale * moved * std::fabs(key.gap) * slope;
      for (std::int64_t d = 0; d < d_qk; ++d) {
        const auto e = static_cast<std::size_t>(r.row * d_qk + d), at = key.k_at + static_cast<std::size_t>(d);
        e_dq_[e] += scale * e_x * std::fabs(key.k[d]);
        m_dq_[e] += std::fabs(sx * key.k[d]);
        c_dq_[e] += std::max(std::fabs(sx * key.k[d]), before * std::fabs(key.k[d])) + moved_x * std::fabs(key.k[d]);
        e_dk_[at] += scale * e_x * std::fabs(r.q[d]);
        m_dk_[at] += std::fabs(sx * r.q[d]);
        c_dk_[at] += std::max(std::fabs(sx * r.q[d]), before * std::fabs(r.q[d])) + moved_x * std::fabs(r.q[d]);
      }
      ++n_dk_[key.k_at / static_cast<std::size_t>(d_qk)];
      for (std::int64_t d = 0; d < d_v; ++d) {
        const auto at = key.v_at + static_cast<std::size_t>(d);
        e_dv_[at] += e_p * std::fabs(r.dout[d]);
        m_dv_[at] += key.p * std::fabs(r.dout[d]);
        c_dv_[at] += (key.p + moved) * std::fabs(r.dout[d]);
      }
      if (!e_db_.empty()) {
        e_db_[key.bias_at] += e_s;
        m_db_[key.bias_at] += std::fabs(key.ds);
        c_db_[key.bias_at] += std::max(std::fabs(key.ds), key.p * (key.abs_dp + std::fabs(r.D))) + moved * std::fabs(key.gap);
        ++n_db_[key.bias_at];
      }
    }
    if (!e_ds_.empty()) {
      // dsink = -sum_i P_sink,i D_i: P_sink moved as any weight, D by its own error.
      const auto h = static_cast<std::size_t>(r.h);
      e_ds_[h] += r.p_sink * (std::fabs(r.D) * (u + 2.0 * score_error + sqrt_n * ua + lse_error) + e_delta);
      m_ds_[h] += std::fabs(r.p_sink * r.D);
    }
  }

  // The roundings of the sums over keys and rows (root-n growth) and of each
  // result, then C times each error plus the absolute floors.
  GradientBounds finish(ReferenceGradients truth) {
    const double u = u_, ua = ua_;
    const std::size_t d_qk = static_cast<std::size_t>(std::max<std::int64_t>(p_.head_dim, 1));
    const std::size_t d_v = static_cast<std::size_t>(std::max<std::int64_t>(p_.head_dim_v, 1));
    for (std::size_t e = 0; e < e_dq_.size(); ++e) {
      e_dq_[e] += sqrt_n_[e / d_qk] * ua * m_dq_[e] + u * std::fabs(truth.dq[e]);
    }
    for (std::size_t e = 0; e < e_dk_.size(); ++e) {
      const double m = static_cast<double>(n_dk_[e / d_qk]);
      e_dk_[e] += std::sqrt(std::max(m, 1.0)) * ua * m_dk_[e] + u * std::fabs(truth.dk[e]);
    }
    const std::size_t v_rows = e_dv_.size() / d_v;
    for (std::size_t e = 0; e < e_dv_.size(); ++e) {
      // dV's rows are summed over the same rows as dK's of the same key.
      const std::size_t key = e / d_v;
      const double m = key < n_dk_.size() && v_rows == n_dk_.size() ? static_cast<double>(n_dk_[key]) : 1.0;
      e_dv_[e] += std::sqrt(std::max(m, 1.0)) * ua * m_dv_[e] + u * std::fabs(truth.dv[e]);
    }
    for (std::size_t e = 0; e < e_db_.size(); ++e) {
      e_db_[e] += std::sqrt(std::max(static_cast<double>(n_db_[e]), 1.0)) * ua * m_db_[e] + u * std::fabs(truth.dbias[e]);
    }
    const double rows_per_head = static_cast<double>(p_.q_batch() * p_.seq_q);
    for (std::size_t e = 0; e < e_ds_.size(); ++e) {
      e_ds_[e] += std::sqrt(std::max(rows_per_head, 1.0)) * ua * m_ds_[e] + u * std::fabs(truth.dsinks[e]);
    }
    GradientBounds g;
    const double c = ToleranceConstants::safety_factor;
    const double floor = underflow_floor(p_.dtype) + subnormal_allowance(p_.dtype, gradient_terms(p_));
    auto bounds = [&](const std::vector<double>& errors) {
      std::vector<double> bound(errors.size());
      for (std::size_t e = 0; e < errors.size(); ++e) bound[e] = c * errors[e] + floor;
      return bound;
    };
    g.bound = {bounds(e_dq_), bounds(e_dk_), bounds(e_dv_), bounds(e_db_), bounds(e_ds_)};
    g.magnitude = {std::move(c_dq_), std::move(c_dk_), std::move(c_dv_), std::move(c_db_), std::move(m_ds_)};
    g.value = std::move(truth);
    return g;
  }

 private:
  const CaseData& data_;
  const ReferenceStats& stats_;
  const Problem& p_;
  double u_ = 0, ua_ = 0, f_min_ = 0;
  std::vector<double> e_dq_, m_dq_, c_dq_, sqrt_n_;
  std::vector<double> e_dk_, m_dk_, c_dk_, e_dv_, m_dv_, c_dv_, e_db_, m_db_, c_db_, e_ds_, m_ds_;
  std::vector<std::int64_t> n_dk_, n_db_;
};

}  // namespace

double gradient_terms(const Problem& p) {
  return static_cast<double>(std::max(p.seq_k, p.q_batch() * p.heads_q * p.seq_q));
}

GradientBounds derive_gradient_bounds(const CaseData& data, const std::vector<double>& dout,
                                      const ReferenceResult& forward, const ReferenceStats& stats, bool bias_gradient) {
  GradientErrorModel model(data, stats, bias_gradient);
  ReferenceGradients truth = reference_backward(data, dout, forward, bias_gradient, &model);
  return model.finish(std::move(truth));
}

}  // namespace attn
