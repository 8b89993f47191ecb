#include "attnbench/value_range.hpp"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "attnbench/error.hpp"

namespace attn {

namespace {

// Each term of a score in the log2 domain may be this large: its sum with
// the others (scaled product, ALiBi, bias), times log2(e), stays finite.
constexpr double kLargestTerm = std::numeric_limits<float>::max() / 16.0;
constexpr double kLog2e = 1.4426950408889634;

}  // namespace

Status float32_scores_fit(const Problem& p, const AttentionIO& io) {
  if (p.softcap != 0) {
    if (p.softcap * kLog2e > kLargestTerm) {
      return Status::no(fmt::format("softcap {:.6g} is beyond what float32 scores hold (at most {:.3g})", p.softcap,
                                    kLargestTerm / kLog2e));
    }
    if (p.softcap < std::numeric_limits<float>::min()) {
      return Status::no(fmt::format("softcap {:.6g} is below float32's normal range", p.softcap));
    }
  }
  // The largest distance from a diagonal to a key: fewer than seq_q + seq_k positions.
  const double distance = static_cast<double>(p.seq_q + p.seq_k);
  if (io.alibi_slopes) {
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const double penalty = std::fabs(static_cast<double>(io.alibi_slopes[h])) * distance * kLog2e;
      if (penalty > kLargestTerm) {
        return Status::no(fmt::format("ALiBi slope {:.6g} of head {} over up to {} key positions gives penalties "
                                      "beyond what float32 scores hold",
                                      static_cast<double>(io.alibi_slopes[h]), h, p.seq_q + p.seq_k));
      }
    }
  }
  if (io.sinks) {
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      if (std::fabs(static_cast<double>(io.sinks[h])) * kLog2e > kLargestTerm) {
        return Status::no(fmt::format("sink {:.6g} of head {} is beyond what float32 scores hold",
                                      static_cast<double>(io.sinks[h]), h));
      }
    }
  }
  if (!io.bias.empty() && p.dtype == DType::f32) {  // 16-bit biases are far inside the range
    const Dims4& shape = io.bias.shape;
    auto extent = [&](int axis) { return io.bias.strides[static_cast<std::size_t>(axis)] == 0 ? 1 : shape[static_cast<std::size_t>(axis)]; };
    for (std::int64_t b = 0; b < extent(0); ++b)
      for (std::int64_t h = 0; h < extent(1); ++h)
        for (std::int64_t i = 0; i < extent(2); ++i)
          for (std::int64_t j = 0; j < shape[3]; ++j) {
            const double x = load_float(io.bias, io.bias.offset(b, h, i, j));
            if (std::isfinite(x) && std::fabs(x) * kLog2e > kLargestTerm) {
              return Status::no(fmt::format("bias {:.6g} is beyond what float32 scores hold", x));
            }
          }
  }
  return Status::yes();
}

namespace {

// A row's weights e^(s - m) below e^-128 (2.6e-56) are 0 in float32 and
// change no float64 sum of weights near 1: a sink this far from every score
// gives the same float32 answer at any distance beyond it.
constexpr double kNegligible = 128.0;

// The largest Euclidean norm of a row of q or k (scores are bounded by
// scale times the two), NaN when the values are not readable (quantised).
double largest_row_norm(const TensorView& v) {
  if (v.data == nullptr) return NAN;
  double largest = 0;
  for (std::int64_t b = 0; b < v.shape[0]; ++b)
    for (std::int64_t h = 0; h < v.shape[1]; ++h)
      for (std::int64_t i = 0; i < v.shape[2]; ++i) {
        double sum = 0;
        for (std::int64_t d = 0; d < v.shape[3]; ++d) {
          const double x = load_float(v, v.offset(b, h, i, d));
          sum += x * x;
        }
        if (!std::isfinite(sum)) return INFINITY;  // a row of NaN or inf bounds nothing
        largest = std::max(largest, sum);
      }
  return std::sqrt(largest);
}

// The largest finite |bias|, 0 without one.
double largest_bias(const AttentionIO& io) {
  if (io.bias.empty()) return 0;
  const Dims4& shape = io.bias.shape;
  auto extent = [&](int axis) { return io.bias.strides[static_cast<std::size_t>(axis)] == 0 ? 1 : shape[static_cast<std::size_t>(axis)]; };
  double largest = 0;
  for (std::int64_t b = 0; b < extent(0); ++b)
    for (std::int64_t h = 0; h < extent(1); ++h)
      for (std::int64_t i = 0; i < extent(2); ++i)
        for (std::int64_t j = 0; j < shape[3]; ++j) {
          const double x = load_float(io.bias, io.bias.offset(b, h, i, j));
          if (std::isfinite(x)) largest = std::max(largest, std::fabs(x));
        }
  return largest;
}

enum class SinkFix { none, takes_all, takes_none };

// The equivalent case that fits, with what it changed. Kept on the heap for
// the plan's life: `io` points into `sinks`.
struct Float32Equivalent {
  Problem problem;
  AttentionIO io;
  std::vector<float> sinks, slopes;
  std::vector<SinkFix> sink_fix;  // per query head
  std::vector<double> true_slopes;  // per query head, where ALiBi runs with a stand-in slope; else empty
  double takes_none_below = 0;    // a row whose lse is below this has no visible key
  std::string backward_refusal;   // non-empty: the forward is exact, the backward is not
};

bool sink_out_of_range(double sink) { return std::fabs(sink) * kLog2e > kLargestTerm; }

// nullptr when the case fits as it is; throws Unsupported when it neither
// fits nor has an equivalent that does.
std::unique_ptr<Float32Equivalent> float32_equivalent(const Problem& p, const AttentionIO& io) {
  const Status fits = float32_scores_fit(p, io);
  if (fits) return nullptr;
  const bool cap_large = p.softcap != 0 && p.softcap * kLog2e > kLargestTerm;
  const bool cap_small = p.softcap != 0 && p.softcap < std::numeric_limits<float>::min();
  bool sinks_out = false;
  for (std::int64_t h = 0; io.sinks && h < p.heads_q; ++h) sinks_out |= sink_out_of_range(io.sinks[h]);
  const double distance = static_cast<double>(p.seq_q + p.seq_k);
  auto penalty_out_of_range = [&](double slope) { return std::fabs(slope) * distance * kLog2e > kLargestTerm; };
  bool alibi_out = false;
  for (std::int64_t h = 0; io.alibi_slopes && h < p.heads_q; ++h) alibi_out |= penalty_out_of_range(io.alibi_slopes[h]);
  // What only a refusal answers: the bias or ALiBi beyond the range, or a
  // reason float32_scores_fit gives for anything else.
  Problem other = p;
  other.softcap = cap_large || cap_small ? 0 : p.softcap;
  AttentionIO rest = io;
  if (sinks_out) rest.sinks = nullptr;
  if (alibi_out) rest.alibi_slopes = nullptr;
  if (const Status left = float32_scores_fit(other, rest); !left) throw Unsupported(left.reason);

  auto e = std::make_unique<Float32Equivalent>();
  e->problem = p;
  e->io = io;
  // The scores' bound: the product (float32's rounding of a dot product stays
  // far inside 1 %), then the cap, ALiBi and the bias.
  const double product = std::fabs(p.scale) * largest_row_norm(io.q) * largest_row_norm(io.k) * 1.01;
  if (cap_large || cap_small || sinks_out || alibi_out) {
    if (!std::isfinite(product)) {
      throw Unsupported(fits.reason + " (and its q or k cannot bound the scores: quantised or not finite)");
    }
  }
  double capped = product;
  if (cap_large) {
    if (p.softcap < std::ldexp(product, 13)) {
      throw Unsupported(fmt::format("softcap {:.6g} beside scores up to {:.3g} is beyond what float32 scores hold "
                                    "(it is the identity only for scores below 2^-13 of it)",
                                    p.softcap, product));
    }
    e->problem.softcap = 0;  // tanh(x) = x within 2^-27 relative below x = 2^-13, and its slope 1 within 2^-26
  } else if (cap_small) {
    // Every capped score lies within the cap of 0: the weights are those of
    // zero scores (e^(+-2^-126) is 1 in float32 and float64).
    e->problem.softcap = 0;
    e->problem.scale = 0;
    capped = 0;
    e->backward_refusal = fmt::format(
        "softcap {:.6g} is below float32's normal range: its gradient's slope is 1 where a score is exactly 0 and 0 "
        "elsewhere, which float32 products cannot decide",
        p.softcap);
  } else if (p.softcap != 0) {
    capped = std::min(capped, p.softcap);
  }
  if (alibi_out) {
    // Keys one position further from the diagonal than the row's nearest
    // visible ones carry weights e^(-slope) e^(2 bound) or less: 0 in float32
    // and beside float64's weights near 1 from a slope of 2 bound + 128 on.
    // Such heads run with the stand-in slope 2^40 (one for every case, so a
    // row gets the same bits in any batch): the nearest keys' weights are the
    // same, and lse is put back from the distance it shows,
    // round(-lse / 2^40). Float32 keeps no score beside 2^40 times a
    // distance (nor does float64 beside 1e38 times one): keys equally near
    // on both sides share the weight evenly in both.
    const double stand_in = std::ldexp(1.0, 40);
    const double others = capped + largest_bias(io);
    if (2 * others + kNegligible > stand_in || distance > std::ldexp(1.0, 21)) {
      throw Unsupported(fmt::format("{} (and the other terms of a score reach {:.3g} over {} positions)", fits.reason,
                                    others, p.seq_q + p.seq_k));
    }
    // A sink within 2^39 of 0 takes from a row's nearest keys what it takes
    // with the true slope: the same when they are on the diagonal, all when
    // they are not; lse then shows a distance of 0 and stays.
    for (std::int64_t h = 0; io.sinks && h < p.heads_q; ++h) {
      if (std::fabs(static_cast<double>(io.sinks[h])) + others + kNegligible > stand_in / 2) {
        throw Unsupported(fmt::format("{} (with sink {:.6g} of head {}: a stand-in slope would move weight between "
                                      "the keys and the sink)",
                                      fits.reason, static_cast<double>(io.sinks[h]), h));
      }
    }
    e->slopes.assign(io.alibi_slopes, io.alibi_slopes + p.heads_q);
    e->true_slopes.assign(static_cast<std::size_t>(p.heads_q), 0.0);
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const double slope = io.alibi_slopes[h];
      if (!penalty_out_of_range(slope)) continue;
      e->slopes[static_cast<std::size_t>(h)] = static_cast<float>(std::copysign(stand_in, slope));
      e->true_slopes[static_cast<std::size_t>(h)] = slope;
    }
    e->io.alibi_slopes = e->slopes.data();
    e->backward_refusal = fmt::format(
        "{} for the backward: the forward's lse, near -slope times a distance, holds the row's scores in float64 only "
        "to within {:.3g}, and the backward recomputes the weights from it",
        fits.reason, std::ldexp(std::fabs(*std::max_element(io.alibi_slopes, io.alibi_slopes + p.heads_q,
                                                              [](float a, float b) { return std::fabs(a) < std::fabs(b); })),
                                -52));
  }
  if (!sinks_out) return e;
  double alibi = 0;
  for (std::int64_t h = 0; io.alibi_slopes && h < p.heads_q; ++h) {
    alibi = std::max(alibi, std::fabs(static_cast<double>(io.alibi_slopes[h])) * distance);
  }
  const double reach = capped + alibi + largest_bias(io) + kNegligible;
  const float stand_in = static_cast<float>(reach);
  if (sink_out_of_range(stand_in)) {
    throw Unsupported(fmt::format("{} (and the scores beside it reach {:.3g})", fits.reason, reach - kNegligible));
  }
  e->sinks.assign(io.sinks, io.sinks + p.heads_q);
  e->sink_fix.assign(static_cast<std::size_t>(p.heads_q), SinkFix::none);
  for (std::int64_t h = 0; h < p.heads_q; ++h) {
    const double sink = io.sinks[h];
    if (!sink_out_of_range(sink)) continue;
    const bool above = sink > 0;
    e->sinks[static_cast<std::size_t>(h)] = above ? stand_in : -stand_in;
    e->sink_fix[static_cast<std::size_t>(h)] = above ? SinkFix::takes_all : SinkFix::takes_none;
  }
  e->takes_none_below = -(reach - kNegligible / 2);
  e->io.sinks = e->sinks.data();
  return e;
}

// lse rows of query head h: [batch, heads_q, seq_q] ([1, heads_q, seq_q] packed).
template <typename Each> void for_each_lse(const Problem& p, double* lse, std::int64_t h, Each&& each) {
  for (std::int64_t b = 0; b < p.q_batch(); ++b)
    for (std::int64_t i = 0; i < p.seq_q; ++i) each(lse[(b * p.heads_q + h) * p.seq_q + i]);
}

// The true sink's lse from the stand-in's (forward), or back (backward, whose
// plans recompute the weights from the forward's lse).
void put_back_lse(const Float32Equivalent& e, const double* true_sinks, double* lse, bool to_stand_in) {
  if (lse == nullptr) return;
  for (std::size_t h = 0; h < e.true_slopes.size(); ++h) {
    const double slope = e.true_slopes[h], stand_in = e.slopes[h];
    if (slope == 0) continue;
    for_each_lse(e.problem, lse, static_cast<std::int64_t>(h), [&](double& x) {
      if (!std::isfinite(x)) return;  // a row with no visible key
      const double distance = std::nearbyint(-x / stand_in);
      x -= (slope - stand_in) * distance;
    });
  }
  if (e.sink_fix.empty()) return;
  for (std::int64_t h = 0; h < e.problem.heads_q; ++h) {
    const SinkFix fix = e.sink_fix[static_cast<std::size_t>(h)];
    if (fix == SinkFix::none) continue;
    const double sink = to_stand_in ? e.sinks[static_cast<std::size_t>(h)] : true_sinks[h];
    for_each_lse(e.problem, lse, h, [&](double& x) {
      // Every row of a sink that takes all has the sink as lse; with one that
      // takes none, only the rows with no visible key do (the others are
      // above every score's bound less 64).
      if (fix == SinkFix::takes_all || (to_stand_in ? x == true_sinks[h] : x < e.takes_none_below)) x = sink;
    });
  }
}

// The stand-in case's plan writes lse into a buffer of its own, and every
// run() and read_output() (which may write lse again: plan_per_entry's does)
// puts the true lse from it into the caller's.
class Float32RangePlan final : public Plan {
 public:
  Float32RangePlan(std::unique_ptr<Float32Equivalent> e, const AttentionIO& io, const PlanMaker& make)
      : e_(std::move(e)), lse_(io.lse) {
    if (io.sinks) true_sinks_.assign(io.sinks, io.sinks + e_->problem.heads_q);
    if (lse_ != nullptr && (!e_->sink_fix.empty() || !e_->true_slopes.empty())) {
      stand_in_lse_.assign(static_cast<std::size_t>(e_->problem.q_batch() * e_->problem.heads_q * e_->problem.seq_q), 0.0);
      e_->io.lse = stand_in_lse_.data();
    }
    inner_ = make(e_->problem, e_->io);
  }
  void run() override {
    inner_->run();
    publish();
  }
  double run_timed() override {
    const double seconds = inner_->run_timed();
    publish();
    return seconds;
  }
  void read_output() override {
    inner_->read_output();
    publish();
  }
  bool has_lse() const override { return inner_->has_lse(); }
  std::size_t workspace_bytes() const override { return inner_->workspace_bytes() + stand_in_lse_.size() * sizeof(double); }

 private:
  void publish() {
    if (stand_in_lse_.empty()) return;
    std::copy(stand_in_lse_.begin(), stand_in_lse_.end(), lse_);
    put_back_lse(*e_, true_sinks_.data(), lse_, false);
  }
  std::unique_ptr<Float32Equivalent> e_;
  double* lse_;
  std::vector<double> true_sinks_, stand_in_lse_;
  std::unique_ptr<Plan> inner_;
};

class Float32RangeBackwardPlan final : public BackwardPlan {
 public:
  // `make` prepares the stand-in case's plan on this plan's own copy of the
  // views, whose forward lse (when the sinks changed it) is a copy put back
  // to the stand-ins' before each run.
  Float32RangeBackwardPlan(std::unique_ptr<Float32Equivalent> e, const BackwardIO& io, const BackwardPlanMaker& make)
      : e_(std::move(e)), io_(io), forward_lse_(io.forward.lse) {
    if (io.forward.sinks) true_sinks_.assign(io.forward.sinks, io.forward.sinks + e_->problem.heads_q);
    io_.forward = e_->io;
    io_.forward.lse = forward_lse_;
    if (forward_lse_ != nullptr && !e_->sink_fix.empty()) {
      lse_.assign(static_cast<std::size_t>(e_->problem.q_batch() * e_->problem.heads_q * e_->problem.seq_q), 0.0);
      io_.forward.lse = lse_.data();
    }
    inner_ = make(e_->problem, io_);
  }
  void run() override {
    if (!lse_.empty()) {
      std::copy(forward_lse_, forward_lse_ + lse_.size(), lse_.begin());
      put_back_lse(*e_, true_sinks_.data(), lse_.data(), true);
    }
    inner_->run();
  }

 private:
  std::unique_ptr<Float32Equivalent> e_;
  BackwardIO io_;
  double* forward_lse_;  // the forward's, read only
  std::vector<double> lse_, true_sinks_;
  std::unique_ptr<BackwardPlan> inner_;
};

}  // namespace

std::unique_ptr<Plan> prepare_in_float32_range(const Problem& p, const AttentionIO& io, const PlanMaker& make) {
  std::unique_ptr<Float32Equivalent> e = float32_equivalent(p, io);
  if (!e) return make(p, io);
  return std::make_unique<Float32RangePlan>(std::move(e), io, make);
}

std::unique_ptr<BackwardPlan> prepare_backward_in_float32_range(const Problem& p, const BackwardIO& io,
                                                                const BackwardPlanMaker& make) {
  std::unique_ptr<Float32Equivalent> e = float32_equivalent(p, io.forward);
  if (!e) return make(p, io);
  if (!e->backward_refusal.empty()) throw Unsupported(e->backward_refusal);
  return std::make_unique<Float32RangeBackwardPlan>(std::move(e), io, make);
}

double case_memory_limit_bytes() {
  const char* text = std::getenv("ATTN_MAX_CASE_GIB");
  double gib = 2.0;
  if (text != nullptr) {
    char* end = nullptr;
    const double value = std::strtod(text, &end);
    if (end != text && *end == '\0' && value > 0 && std::isfinite(value)) gib = value;
  }
  return gib * 1024.0 * 1024.0 * 1024.0;
}

double address_space_left() {
  struct rlimit limit {};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return INFINITY;
  double mapped_pages = 0;
  std::ifstream statm("/proc/self/statm");  // first field: pages mapped (libraries, stacks, malloc's arenas)
  if (!(statm >> mapped_pages)) return INFINITY;
  return static_cast<double>(limit.rlim_cur) - mapped_pages * static_cast<double>(sysconf(_SC_PAGESIZE));
}

void require_workspace(double bytes, const char* what) {
  if (const double left = address_space_left(); bytes > left) {
    throw Unsupported(fmt::format("{} would take {:.2f} GiB, more than the {:.2f} GiB of address space this process "
                                  "may still map (ulimit -v)",
                                  what, bytes / (1 << 30), std::max(left, 0.0) / (1 << 30)));
  }
  const double limit = case_memory_limit_bytes();
  if (bytes > limit) {
    throw Unsupported(fmt::format("{} would take {:.2f} GiB, more than a case may use ({:.2f} GiB; ATTN_MAX_CASE_GIB "
                                  "raises it)",
                                  what, bytes / (1 << 30), limit / (1 << 30)));
  }
}

void require_float32_scores(const Problem& p, const AttentionIO& io) {
  const Status fits = float32_scores_fit(p, io);
  if (!fits) throw Unsupported(fits.reason);
}

}  // namespace attn
