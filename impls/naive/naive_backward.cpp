// naive's backward pass (docs/format/v3.md): the textbook analytic gradient
// with P materialised per row, in the forward's precision (scores in the
// accumulation type of the dtype, float32 below float64; every sum in
// float64), from the forward's own output: D = rowsum(dO o O).
#include "impls/naive/naive_backward.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attnbench/dropout.hpp"
#include "attnbench/sequences.hpp"

namespace attn {

namespace {

double load(const TensorView& v, std::int64_t at) {
  return v.dtype == DType::f64 ? static_cast<const double*>(v.data)[at] : static_cast<double>(load_float(v, at));
}

void store(const MutableTensorView& v, std::int64_t at, double x) {
  if (v.dtype == DType::f64) static_cast<double*>(v.data)[at] = x;
  else store_float(v, at, static_cast<float>(x));
}

// The float64 sums of every gradient (canonical row-major) and one row's
// visible keys, scores and cap slopes (exact copies of the A values); made
// in prepare, zeroed by each run.
struct Sums {
  std::vector<double> dq, dk, dv, dbias, dsinks;
  std::vector<std::int64_t> keys;
  std::vector<double> score, slope;
  Sums(const Problem& p, const BackwardIO& io)
      : dq(static_cast<std::size_t>(p.q_elements())),
        dk(static_cast<std::size_t>(p.k_elements())),
        dv(static_cast<std::size_t>(p.v_elements())),
        dbias(io.dbias.empty() ? 0 : static_cast<std::size_t>(p.broadcast_elements(p.bias))),
        dsinks(static_cast<std::size_t>(p.heads_q)) {
    keys.reserve(static_cast<std::size_t>(p.seq_k));
    score.reserve(static_cast<std::size_t>(p.seq_k));
    slope.reserve(static_cast<std::size_t>(p.seq_k));
  }
  void clear() {
    for (auto* sums : {&dq, &dk, &dv, &dbias, &dsinks}) std::fill(sums->begin(), sums->end(), 0.0);
  }
};

// A is the score arithmetic: double for float64 cases, float otherwise (as the forward).
template <typename A>
void naive_backward(const Problem& p, const BackwardIO& io, Sums& sums) {
  const AttentionIO& f = io.forward;
  const SequenceMap seq = f.sequences(p);
  const TensorView out{f.out.data, f.out.dtype, f.out.shape, f.out.strides};
  sums.clear();
  std::vector<double>&dq = sums.dq, &dk = sums.dk, &dv = sums.dv, &dbias = sums.dbias, &dsinks = sums.dsinks;
  auto canonical = [](std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d, std::int64_t heads, std::int64_t seq_len,
                      std::int64_t width) { return static_cast<std::size_t>(((b * heads + h) * seq_len + s) * width + d); };
  const A scale = static_cast<A>(p.scale), cap = static_cast<A>(p.softcap);
  std::vector<std::int64_t>& keys = sums.keys;
  std::vector<double>&score = sums.score, &slope = sums.slope;
  // Dropout: the forward's mask, replayed from its seed; kept weights times 1 / (1 - p).
  const DropoutMask dropout(p, f.dropout);
  const double keep_scale = static_cast<double>(static_cast<A>(dropout.keep_scale()));
  for (std::int64_t e = 0; e < p.batch; ++e) {
    const std::int64_t q_len = seq.q_len(e);
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const std::int64_t g = h / p.group_size();
      for (std::int64_t qi = 0; qi < q_len; ++qi) {
        const SequenceMap::Row row = seq.entry_row(e, qi);
        // The q tensor's (batch, seq) of this query.
        const std::int64_t tb = p.ragged ? 0 : e, ts = p.ragged ? f.cu_seqlens_q[e] + qi : qi;
        keys.clear(), score.clear(), slope.clear();
        for (std::int64_t j = row.keys.lo; j < row.keys.hi; ++j) {
          if (!f.mask.empty() && f.mask.at(tb, h, ts, j) == 0) continue;
          A bias = 0;
          if (!f.bias.empty()) {
            bias = static_cast<A>(load(f.bias, f.bias.offset(tb, h, ts, j)));
            if (std::isinf(bias) && bias < 0) continue;
          }
          const SequenceMap::Key key = seq.key(e, j);
          A dot = 0;
          for (std::int64_t d = 0; d < p.head_dim; ++d) {
            dot += static_cast<A>(load(f.q, f.q.offset(tb, h, ts, d))) * static_cast<A>(load(f.k, f.k.offset(key.b, g, key.s, d)));
          }
          A s = scale * dot, cap_slope = 1;
          if (p.softcap != 0) {
            const A t = std::tanh(s / cap);
            s = cap * t;
            cap_slope = 1 - t * t;
          }
          if (f.alibi_slopes) s += alibi_term(static_cast<A>(f.alibi_slopes[h]), row.diag, j);
          keys.push_back(j);
          score.push_back(static_cast<double>(A{s + bias}));  // the A value, exactly
          slope.push_back(static_cast<double>(cap_slope));
        }
        if (keys.empty()) continue;  // no visible key: dQ stays 0, nothing else receives anything
        // P recomputed from the scores: max, sum (with the sink) and lse in float64.
        const double sink = f.sinks ? static_cast<double>(f.sinks[h]) : -std::numeric_limits<double>::infinity();
        double top = sink;
        for (double s : score) top = std::max(top, s);
        double sum = 0;
        for (double s : score) sum += std::exp(s - top);
        if (f.sinks) sum += std::exp(sink - top);
        const double lse = top + std::log(sum);
        // D from this backend's own forward output.
        double delta = 0;
        for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
          delta += load(io.dout, io.dout.offset(tb, h, ts, d)) * load(out, out.offset(tb, h, ts, d));
        }
        for (std::size_t n = 0; n < keys.size(); ++n) {
          const std::int64_t j = keys[n];
          const SequenceMap::Key key = seq.key(e, j);
          const double pj = std::exp(score[n] - lse);
          // The weight's dropout factor: 1, or 0 or 1 / (1 - p) as the forward drew it.
          const double c = !f.dropout.active() ? 1.0 : dropout.keeps(e, h, qi, j) ? keep_scale : 0.0;
          double dp = 0;
          for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
            dp += load(io.dout, io.dout.offset(tb, h, ts, d)) * load(f.v, f.v.offset(key.b, g, key.s, d));
          }
          const double ds = pj * (c * dp - delta);
          const double dx = ds * slope[n] * p.scale;
          for (std::int64_t d = 0; d < p.head_dim; ++d) {
            dq[canonical(tb, h, ts, d, p.heads_q, p.seq_q, p.head_dim)] += dx * load(f.k, f.k.offset(key.b, g, key.s, d));
            dk[canonical(key.b, g, key.s, d, p.heads_kv, p.kv_seq(), p.head_dim)] += dx * load(f.q, f.q.offset(tb, h, ts, d));
          }
          for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
            dv[canonical(key.b, g, key.s, d, p.heads_kv, p.kv_seq(), p.head_dim_v)] += pj * c * load(io.dout, io.dout.offset(tb, h, ts, d));
          }
          if (!dbias.empty()) {
            const std::int64_t bb = p.bias.batch == 1 ? 0 : tb, bh = p.bias.heads == 1 ? 0 : h, bq = p.bias.rows == 1 ? 0 : ts;
            dbias[canonical(bb, bh, bq, j, p.bias.heads, p.bias.rows, p.seq_k)] += ds;
          }
        }
        if (f.sinks) dsinks[static_cast<std::size_t>(h)] -= std::exp(sink - lse) * delta;
      }
    }
  }
  // Every element written, in the case's dtype.
  for (std::int64_t b = 0; b < p.q_batch(); ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t s = 0; s < p.seq_q; ++s)
        for (std::int64_t d = 0; d < p.head_dim; ++d)
          store(io.dq, io.dq.offset(b, h, s, d), dq[canonical(b, h, s, d, p.heads_q, p.seq_q, p.head_dim)]);
  for (std::int64_t b = 0; b < p.kv_batch(); ++b)
    for (std::int64_t h = 0; h < p.heads_kv; ++h)
      for (std::int64_t s = 0; s < p.kv_seq(); ++s) {
        for (std::int64_t d = 0; d < p.head_dim; ++d)
          store(io.dk, io.dk.offset(b, h, s, d), dk[canonical(b, h, s, d, p.heads_kv, p.kv_seq(), p.head_dim)]);
        for (std::int64_t d = 0; d < p.head_dim_v; ++d)
          store(io.dv, io.dv.offset(b, h, s, d), dv[canonical(b, h, s, d, p.heads_kv, p.kv_seq(), p.head_dim_v)]);
      }
  if (!dbias.empty()) {
    for (std::int64_t b = 0; b < p.bias.batch; ++b)
      for (std::int64_t h = 0; h < p.bias.heads; ++h)
        for (std::int64_t s = 0; s < p.bias.rows; ++s)
          for (std::int64_t j = 0; j < p.seq_k; ++j)
            store(io.dbias, io.dbias.offset(b, h, s, j), dbias[canonical(b, h, s, j, p.bias.heads, p.bias.rows, p.seq_k)]);
  }
  if (io.dsinks) {
    for (std::int64_t h = 0; h < p.heads_q; ++h) io.dsinks[h] = dsinks[static_cast<std::size_t>(h)];
  }
}

class NaiveBackwardPlan final : public BackwardPlan {
 public:
  NaiveBackwardPlan(const Problem& p, const BackwardIO& io) : problem_(p), io_(io), sums_(p, io) {}
  void run() override {
    if (problem_.dtype == DType::f64) naive_backward<double>(problem_, io_, sums_);
    else naive_backward<float>(problem_, io_, sums_);
  }

 private:
  Problem problem_;
  BackwardIO io_;
  Sums sums_;
};

}  // namespace

std::unique_ptr<BackwardPlan> make_naive_backward_plan(const Problem& problem, const BackwardIO& io) {
  return std::make_unique<NaiveBackwardPlan>(problem, io);
}

}  // namespace attn
