#include "verify/relations.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "attnbench/error.hpp"
#include "verify/invariance.hpp"
#include "verify/score.hpp"

namespace attn {

namespace {

using std::int64_t;
std::size_t at(int64_t i) { return static_cast<std::size_t>(i); }

double smallest_normal(DType dtype) {
  switch (dtype) {
    case DType::f64: return std::ldexp(1.0, -1022);
    case DType::f16: return std::ldexp(1.0, -14);
    default: return std::ldexp(1.0, -126);  // float32, bfloat16
  }
}

double largest_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

double smallest_nonzero_abs(const std::vector<double>& x) {
  double m = INFINITY;
  for (double v : x) {
    if (v != 0) m = std::min(m, std::fabs(v));
  }
  return std::isfinite(m) ? m : 0;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b)); }

void scale_all(std::vector<double>& x, double factor) {
  for (double& v : x) v *= factor;
}

// The flat-index map of permuting an axis of `heads` (between outer and
// `inner` elements) of a tensor of `size` elements: new[o][h'][..] =
// old[o][perm[h']][..] reads old[from[e]] at e.
std::vector<int64_t> axis_map(int64_t size, int64_t heads, int64_t inner, const std::vector<int64_t>& perm) {
  std::vector<int64_t> from(at(size));
  const int64_t outer = heads * inner == 0 ? 0 : size / (heads * inner);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t x = 0; x < inner; ++x) from[at((o * heads + h) * inner + x)] = (o * heads + perm[at(h)]) * inner + x;
    }
  }
  return from;
}

// x with that axis permuted (q, k, v, mask, bias, slopes, sinks, dO).
template <typename T>
std::vector<T> permute_axis(const std::vector<T>& x, int64_t heads, int64_t inner, const std::vector<int64_t>& perm) {
  const std::vector<int64_t> from = axis_map(static_cast<int64_t>(x.size()), heads, inner, perm);
  std::vector<T> y(x.size());
  for (std::size_t e = 0; e < y.size(); ++e) y[e] = x[at(from[e])];
  return y;
}

// Format version 4: tensor t's codes, scales and zero points permuted along
// its heads (axis 1) or its sequence (axis 2) as its values are; a scale axis
// broadcast stays as it is. Per-(entry, kv head) descales follow the kv
// heads (`kv_perm`, for q too: a query head reads its kv head's). The
// originals, optional, are dropped.
void permute_codes(CaseData& c, const CaseData& data, char t, int axis, const std::vector<int64_t>& perm,
                   const std::vector<int64_t>& kv_perm) {
  const Problem& p = data.problem;
  const QuantSpec& spec = p.quant(t);
  if (!spec.quantised()) return;
  const QuantData& from = data.quant(t);
  QuantData& to = c.quant(t);
  const auto shape = p.stored_shape(t);
  const int64_t bytes = encoded_row_bytes(spec.encoding, shape[3]);
  const int64_t inner = axis == 1 ? shape[2] * bytes : bytes;
  to.codes = permute_axis(from.codes, shape[at(axis)], inner, perm);
  if (spec.has_scale() && spec.scale[at(axis)] == shape[at(axis)] && shape[at(axis)] > 1) {
    const int64_t scale_inner = (axis == 1 ? spec.scale[2] : 1) * spec.scale[3];
    to.scale = permute_axis(from.scale, shape[at(axis)], scale_inner, perm);
    if (spec.zero_point) to.zero_point = permute_axis(from.zero_point, shape[at(axis)], scale_inner, perm);
  }
  if (axis == 1 && spec.descale == Descale::entry_head) to.descale = permute_axis(from.descale, p.heads_kv, 1, kv_perm);
  to.original.clear();
}

// The power of two (2^k, k = +-bits) that scales every value of `x` exactly:
// up when x's largest stays within half the range of `dtype`, and times
// `growth` (what sums of it reach) within half the accumulation's; else down
// when x's smallest stays normal; 0 when neither.
double exact_power(const std::vector<double>& x, DType dtype, int bits, double growth) {
  const double up = std::ldexp(1.0, bits);
  const double largest = largest_abs(x), smallest = smallest_nonzero_abs(x);
  const double accumulation = dtype_max(dtype == DType::f64 ? DType::f64 : DType::f32);
  if (largest * up <= dtype_max(dtype) / 2 && largest * up * growth <= accumulation / 2) return up;
  if (smallest == 0 || smallest / up >= smallest_normal(dtype)) return 1 / up;
  return 0;
}

// Multiplies every value of q, k or v by the power of two f, exactly: a
// tensor in the dtype itself, or a quantised one through what dequantises
// it (its descale, else its scale), then its values recomputed; false when
// a quantised tensor has neither, or they would leave float32's normal range.
bool scale_values(CaseData& c, char tensor, double f) {
  const QuantSpec& spec = c.problem.quant(tensor);
  if (!spec.quantised()) {
    scale_all(c.values(tensor), f);
    return true;
  }
  QuantData& q = c.quant(tensor);
  std::vector<float>* carrier = spec.descale != Descale::none ? &q.descale : spec.has_scale() ? &q.scale : nullptr;
  if (carrier == nullptr) return false;
  for (const float x : *carrier) {
    const double y = std::fabs(static_cast<double>(x) * f);
    if (y > std::numeric_limits<float>::max() / 2 || (y != 0 && y < std::numeric_limits<float>::min())) return false;
  }
  for (float& x : *carrier) x = static_cast<float>(static_cast<double>(x) * f);
  q.original.clear();  // optional, and huge originals (a poisoned free slot's) may overflow when scaled
  c.dequantise();
  return true;
}

// Below what magnitude a result scaled by f may differ from its own bits
// scaled, though both runs are right: the result's own rounding among the
// dtype's subnormals, and the n terms summed into it, each of which may have
// rounded among the accumulation's subnormals (the error, up to n half
// spacings, reaches the result's last bit below about n times the smallest
// normal).
double subnormal_reach(const Problem& p, double f) {
  const double terms = std::max(static_cast<double>(p.seq_k), gradient_terms(p));
  const double accumulation = smallest_normal(p.dtype == DType::f64 ? DType::f64 : DType::f32);
  return std::max(f, 1.0) * std::max(smallest_normal(p.dtype), terms * accumulation);
}

// Whether every term p_ij v_jd of the output's sums is 0 or normal in the
// accumulation, before and after V x f: only then does each sum scale
// exactly. A lower bound of the weights from the scores' range (|q| |k|
// scale, softcap, bias, ALiBi) and an upper bound of lse (sinks too):
// seed 3, case 106 (sinks near 92) put weights near e^-82 on values near
// 1e-3, and the products rounded among float32's subnormals.
bool output_terms_normal(const CaseData& data, double f) {
  const Problem& p = data.problem;
  auto largest_norm = [](const std::vector<double>& x, int64_t width) {
    double largest = 0;
    for (std::size_t r = 0; width > 0 && r + at(width) <= x.size(); r += at(width)) {
      double sum = 0;
      for (int64_t d = 0; d < width; ++d) sum += x[r + at(d)] * x[r + at(d)];
      largest = std::max(largest, std::sqrt(sum));
    }
    return largest;
  };
  double reach = std::fabs(p.scale) * largest_norm(data.q, p.head_dim) * largest_norm(data.k, p.head_dim);
  if (p.softcap != 0) reach = std::min(reach, std::fabs(p.softcap));
  double lo = -reach, hi = reach;
  if (p.bias.present) {
    double bias_lo = INFINITY, bias_hi = -INFINITY;
    for (double b : data.bias) {
      if (std::isfinite(b)) bias_lo = std::min(bias_lo, b), bias_hi = std::max(bias_hi, b);
    }
    if (bias_lo <= bias_hi) lo += bias_lo, hi += bias_hi;
  }
  if (p.alibi) lo -= largest_abs(data.alibi_slopes) * static_cast<double>(std::max(p.seq_k, p.seq_q));
  double lse_hi = hi + std::log(static_cast<double>(std::max<int64_t>(p.seq_k, 1)));
  if (p.sinks) lse_hi = std::max(lse_hi, largest_abs(data.sinks)) + std::log(2.0);
  const double weight = std::exp(lo - lse_hi);
  const double normal = smallest_normal(p.dtype == DType::f64 ? DType::f64 : DType::f32);
  const double v_min = smallest_nonzero_abs(data.v);
  return v_min == 0 || weight * v_min * std::min(f, 1.0) >= normal;
}

std::string power_text(double factor) {
  const int k = static_cast<int>(std::lround(std::log2(factor)));
  return k >= 0 ? fmt::format("x {}", std::ldexp(1.0, k)) : fmt::format("/ {}", std::ldexp(1.0, -k));
}

}  // namespace

std::vector<double> TensorMap::apply(const std::vector<double>& own) const {
  std::vector<double> y(from.empty() ? own.size() : from.size());
  // (x + 0 would turn -0 into +0: the shift only where there is one)
  for (std::size_t e = 0; e < y.size(); ++e) {
    y[e] = factor * own[from.empty() ? e : at(from[e])];
    if (shift != 0) y[e] += shift;
  }
  return y;
}

const TensorMap& RelationRun::gradient(std::string_view name) const {
  if (name == "dq") return dq;
  if (name == "dk") return dk;
  if (name == "dv") return dv;
  if (name == "dbias") return dbias;
  return dsinks;
}

std::vector<RelationRun> relation_runs(const CaseData& data, const std::vector<double>* dout, int64_t element_budget,
                                       std::vector<std::string>* left_out, unsigned which) {
  const Problem& p = data.problem;
  std::vector<RelationRun> runs;
  auto leave = [&](unsigned relation, const std::string& why) {
    if (!left_out) return;
    for (unsigned bit = 1; bit <= kAllRelations; bit <<= 1) {
      if (relation & which & bit) left_out->push_back(fmt::format("{} ({})", relation_name(bit), why));
    }
  };
  const int64_t largest = static_cast<int64_t>(std::max({data.q.size(), data.k.size(), data.v.size()}));
  if (element_budget > 0 && largest > element_budget) {
    leave(kAllRelations, fmt::format("{} elements, beyond the budget of {}", largest, element_budget));
    return runs;
  }
  const bool backward = dout != nullptr;
  auto base = [&](unsigned relation, std::string what) {
    RelationRun r;
    r.relation = relation;
    r.what = std::move(what);
    r.data = data;
    r.backward = backward;
    return r;
  };
  const int64_t hq = p.heads_q, hkv = p.heads_kv, group = p.group_size();

  // V x 2^3: out x 2^3, lse alone; dq, dk, dbias and dsinks x 2^3, dv alone.
  if (!(which & kRelationVScale)) {
  } else if (const double f = exact_power(data.v, p.dtype, 3, static_cast<double>(std::max<int64_t>(p.seq_k, 1))); f != 0) {
    RelationRun r = base(kRelationVScale, fmt::format("V {}", power_text(f)));
    r.out.factor = f;
    // Products among the subnormals: within the bound, never bit for bit.
    r.exact_above = output_terms_normal(data, f) ? subnormal_reach(p, f) : INFINITY;
    r.dq.factor = r.dk.factor = r.dbias.factor = r.dsinks.factor = f;
    if (scale_values(r.data, 'v', f)) runs.push_back(std::move(r));
    else leave(kRelationVScale, "V's codes have no descale or scale to carry the power of two");
  } else {
    leave(kRelationVScale, "no power of two scales V exactly within the dtype's range");
  }

  // Q x 2^2 with the scale / 2^2: the same scores; dq / 2^2.
  const double q_growth = largest_abs(data.k) * static_cast<double>(std::max<int64_t>(p.head_dim, 1));
  if (!(which & kRelationQScale)) {
  } else if (const double f = exact_power(data.q, p.dtype, 2, std::max(q_growth, 1.0)); f != 0 && p.scale != 0) {
    RelationRun r = base(kRelationQScale, fmt::format("Q {} and the scale {}", power_text(f), power_text(1 / f)));
    r.data.problem.scale = p.scale / f;
    r.dq.factor = 1 / f;
    if (scale_values(r.data, 'q', f)) runs.push_back(std::move(r));
    else leave(kRelationQScale, "Q's codes have no descale or scale to carry the power of two");
  } else {
    leave(kRelationQScale, "no power of two scales Q exactly within the dtype's range");
  }

  // kv heads reversed, each with its query group, itself reversed.
  if (!(which & kRelationHeadPermutation)) {
  } else if (hq > 1) {
    std::vector<int64_t> kv_perm(at(hkv)), q_perm(at(hq));
    for (int64_t g = 0; g < hkv; ++g) kv_perm[at(g)] = hkv - 1 - g;
    for (int64_t h = 0; h < hq; ++h) q_perm[at(h)] = kv_perm[at(h / group)] * group + (group - 1 - h % group);
    RelationRun r = base(kRelationHeadPermutation, "kv heads reversed with their query groups, each group reversed");
    CaseData& c = r.data;
    c.q = permute_axis(data.q, hq, p.seq_q * p.head_dim, q_perm);
    c.k = permute_axis(data.k, hkv, p.kv_seq() * p.head_dim, kv_perm);
    c.v = permute_axis(data.v, hkv, p.kv_seq() * p.head_dim_v, kv_perm);
    if (p.mask.present && p.mask.heads == hq) c.mask = permute_axis(data.mask, hq, p.mask.rows * p.seq_k, q_perm);
    if (p.bias.present && p.bias.heads == hq) c.bias = permute_axis(data.bias, hq, p.bias.rows * p.seq_k, q_perm);
    if (p.alibi) c.alibi_slopes = permute_axis(data.alibi_slopes, hq, 1, q_perm);
    if (p.sinks) c.sinks = permute_axis(data.sinks, hq, 1, q_perm);
    permute_codes(c, data, 'q', 1, q_perm, kv_perm);
    permute_codes(c, data, 'k', 1, kv_perm, kv_perm);
    permute_codes(c, data, 'v', 1, kv_perm, kv_perm);
    const int64_t out_size = p.q_batch() * hq * p.seq_q * p.head_dim_v;
    r.out.from = axis_map(out_size, hq, p.seq_q * p.head_dim_v, q_perm);
    r.lse.from = axis_map(p.q_batch() * hq * p.seq_q, hq, p.seq_q, q_perm);
    if (backward) {
      r.dout = permute_axis(*dout, hq, p.seq_q * p.head_dim_v, q_perm);
      r.dq.from = axis_map(static_cast<int64_t>(data.q.size()), hq, p.seq_q * p.head_dim, q_perm);
      r.dk.from = axis_map(static_cast<int64_t>(data.k.size()), hkv, p.kv_seq() * p.head_dim, kv_perm);
      r.dv.from = axis_map(static_cast<int64_t>(data.v.size()), hkv, p.kv_seq() * p.head_dim_v, kv_perm);
      if (p.bias.present && p.bias.heads == hq) {
        r.dbias.from = axis_map(static_cast<int64_t>(data.bias.size()), hq, p.bias.rows * p.seq_k, q_perm);
      }
      if (p.sinks) r.dsinks.from = axis_map(hq, hq, 1, q_perm);
    }
    runs.push_back(std::move(r));
  } else {
    leave(kRelationHeadPermutation, "one head");
  }

  // Keys and values shuffled together (and the mask's and bias's key axis):
  // the same out and lse where nothing depends on a key's position.
  if (which & kRelationKeyPermutation) {
    std::string why;
    if (p.seq_k < 2) why = "fewer than two keys";
    else if (p.causal != Causal::none) why = "causal: visibility follows the key's position";
    else if (p.window_left >= 0 || p.window_right >= 0) why = "a sliding window follows the key's position";
    else if (p.alibi) why = "ALiBi follows the key's position";
    else if (p.kv_len) why = "kv_len hides keys by position";
    else if (p.ragged || p.paged()) why = "packed and paged keys are permuted by the batch invariance check instead";
    if (why.empty()) {
      // A fixed shuffle (a multiplicative step coprime to seq_k, then reversed halves).
      std::vector<int64_t> perm(at(p.seq_k));
      int64_t step = static_cast<int64_t>(std::llround(0.618 * static_cast<double>(p.seq_k))) | 1;
      while (std::gcd(step, p.seq_k) != 1) step += 2;
      for (int64_t j = 0; j < p.seq_k; ++j) perm[at(j)] = (j * step + p.seq_k / 3) % p.seq_k;
      RelationRun r = base(kRelationKeyPermutation, "keys and values shuffled together");
      CaseData& c = r.data;
      c.k = permute_axis(data.k, p.seq_k, p.head_dim, perm);
      c.v = permute_axis(data.v, p.seq_k, p.head_dim_v, perm);
      if (p.mask.present) c.mask = permute_axis(data.mask, p.seq_k, 1, perm);
      if (p.bias.present) c.bias = permute_axis(data.bias, p.seq_k, 1, perm);
      permute_codes(c, data, 'k', 2, perm, {});
      permute_codes(c, data, 'v', 2, perm, {});
      if (backward) {
        r.dk.from = axis_map(static_cast<int64_t>(data.k.size()), p.seq_k, p.head_dim, perm);
        r.dv.from = axis_map(static_cast<int64_t>(data.v.size()), p.seq_k, p.head_dim_v, perm);
        if (p.bias.present) r.dbias.from = axis_map(static_cast<int64_t>(data.bias.size()), p.seq_k, 1, perm);
      }
      runs.push_back(std::move(r));
    } else {
      leave(kRelationKeyPermutation, why);
    }
  }

  // + c on every score of every row (a bias, or the case's bias + c; the
  // sinks, logits of the same rows, + c too): out alone, lse + c. The
  // largest c of a few that keeps bias + c exact in the dtype; else 8, its
  // rounding counted as a score error.
  if (which & kRelationScoreShift) {
    std::string why;
    if (p.ragged || p.paged()) why = "a packed or paged case takes no bias";
    else if (p.seq_k == 0) why = "no key";
    double c = 0, rounding = 0;
    if (why.empty()) {
      for (const double candidate : {100.0, 64.0, 32.0, 16.0, 8.0}) {
        double worst = 0;
        bool fits = true;
        for (double b : data.bias) {
          if (!std::isfinite(b)) continue;
          const double shifted = round_to_dtype(b + candidate, p.dtype);
          if (!std::isfinite(shifted)) fits = false;
          worst = std::max(worst, std::fabs(shifted - (b + candidate)));
        }
        for (double s : data.sinks) {
          if (static_cast<double>(static_cast<float>(s + candidate)) != s + candidate) fits = false;
        }
        if (fits && (worst == 0 || candidate == 8.0)) {
          c = candidate;
          rounding = worst;
          break;
        }
      }
      if (c == 0) why = "no shift keeps the bias or the sinks finite and exact";
    }
    if (why.empty()) {
      RelationRun r = base(kRelationScoreShift, fmt::format("every score + {}", c));
      CaseData& d = r.data;
      if (p.bias.present) {
        for (double& b : d.bias) {
          if (std::isfinite(b)) b = round_to_dtype(b + c, p.dtype);
        }
      } else {
        d.problem.bias = {true, 1, 1, 1};
        d.bias.assign(at(p.seq_k), c);
      }
      for (double& s : d.sinks) s += c;
      r.lse.shift = c;
      r.score_error = rounding + accumulation_roundoff(p.dtype) * c;
      runs.push_back(std::move(r));
    } else {
      leave(kRelationScoreShift, why);
    }
  }

  // The other layout.
  if (which & kRelationLayout) {
    RelationRun r = base(kRelationLayout, "the other layout");
    r.data.problem.layout = p.layout == Layout::bhsd ? Layout::bshd : Layout::bhsd;
    runs.push_back(std::move(r));
  }

  // The backward only: dO x 2^2 scales every gradient by it.
  if (backward && (which & kRelationDoutScale)) {
    // What the backward multiplies dO by on its way (in the arithmetic
    // type): dP = dO . V and D = dO . O up to |v| dv, dS up to twice that,
    // dQ and dK by |scale| |k| (|q| over every row) from dS, dV over every
    // row. An up-scaled dO must keep all of them finite (|v| near float64's
    // largest overflowed dP in every backend: fuzz seed 8, case 914).
    const double rows = static_cast<double>(std::max<int64_t>(p.rows(), 1));
    const double dp = largest_abs(data.v) * static_cast<double>(std::max<int64_t>(p.head_dim_v, 1));
    const double a = std::fabs(p.scale);
    const double growth = std::max(rows, dp * (4 + 4 * a * largest_abs(data.k) + 2 * a * largest_abs(data.q) * rows));
    if (const double f = exact_power(*dout, p.dtype, 2, std::max(growth, 1.0)); f != 0) {
      RelationRun r = base(kRelationDoutScale, fmt::format("dO {}", power_text(f)));
      r.forward = false;
      r.dout = *dout;
      scale_all(r.dout, f);
      r.dq.factor = r.dk.factor = r.dv.factor = r.dbias.factor = r.dsinks.factor = f;
      r.exact_above = subnormal_reach(p, f);
      runs.push_back(std::move(r));
    } else {
      leave(kRelationDoutScale, "no power of two scales dO exactly within the dtype's range");
    }
  }
  // Shapes only: each transformation is exact by construction (a power of
  // two checked against the range, a permutation, a shift rounded to the
  // dtype), so the validated case's values need no second check.
  for (RelationRun& r : runs) r.data.validate_shapes();
  return runs;
}

Bounds relation_bounds(const CaseData& data, const std::vector<double>& out, const std::vector<double>* lse,
                       double score_error) {
  const Problem& p = data.problem;
  const double ua = accumulation_roundoff(p.dtype), uo = unit_roundoff(p.dtype);
  const double safety = 2 * ToleranceConstants::safety_factor;
  const double root_d = std::sqrt(static_cast<double>(p.head_dim));
  Bounds bounds;
  bounds.out.assign(out.size(), 0.0);
  bounds.lse.assign(lse ? lse->size() : 0, 0.0);
  const std::vector<BatchEntry> entries = batch_entries(data);
  int64_t q_start = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    const BatchEntry& e = entries[at(b)];
    const int64_t n = e.limit;
    // Per kv head: the largest |v| of each column and the longest key.
    std::vector<double> v_max(at(p.heads_kv * p.head_dim_v), 0.0), k_norm(at(p.heads_kv), 0.0);
    for (int64_t g = 0; g < p.heads_kv; ++g) {
      for (int64_t j = 0; j < n; ++j) {
        const double* v = &e.v[at((g * e.k_len + j) * p.head_dim_v)];
        for (int64_t x = 0; x < p.head_dim_v; ++x) v_max[at(g * p.head_dim_v + x)] = std::max(v_max[at(g * p.head_dim_v + x)], std::fabs(v[x]));
        const double* k = &e.k[at((g * e.k_len + j) * p.head_dim)];
        double norm = 0;
        for (int64_t x = 0; x < p.head_dim; ++x) norm += k[x] * k[x];
        k_norm[at(g)] = std::max(k_norm[at(g)], std::sqrt(norm));
      }
    }
    // Among the subnormals every term's rounding counts: a row with no
    // visible key may follow a declared convention (the mean of V over every
    // key of the entry, kv_len 0 included: py-numpy, V near 1e-310 in float64,
    // make test's fuzz seed 941222 case 1).
    const double floor =
        2 * underflow_floor(p.dtype) + subnormal_allowance(p.dtype, static_cast<double>(std::max(n, e.k_len)));
    const double growth = uo + std::sqrt(static_cast<double>(n) + 1) * ua;
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t g = h / p.group_size();
      for (int64_t i = 0; i < e.q_len; ++i) {
        const double* q = &e.q[at((h * e.q_len + i) * p.head_dim)];
        double q_norm = 0;
        for (int64_t x = 0; x < p.head_dim; ++x) q_norm += q[x] * q[x];
        const double s_max = std::fabs(p.scale) * std::sqrt(q_norm) * k_norm[at(g)];
        const double s_abs = p.softcap > 0 ? std::min(s_max, p.softcap) : s_max;
        double bias_abs = 0;
        if (!e.bias.empty()) {
          for (int64_t j = 0; j < e.k_len; ++j) {
            const double x = e.bias[at((h * e.q_len + i) * e.k_len + j)];
            if (std::isfinite(x)) bias_abs = std::max(bias_abs, std::fabs(x));
          }
        }
        const double alibi_abs = p.alibi ? std::fabs(data.alibi_slopes[at(h)]) * static_cast<double>(e.k_len + e.q_len) : 0;
        const double sink_abs = p.sinks ? std::fabs(data.sinks[at(h)]) : 0;
        const double delta = ua * ((root_d + 2) * s_max + s_abs + bias_abs + alibi_abs + sink_abs + 4) + score_error;
        const int64_t row = ((p.ragged ? 0 : b) * p.heads_q + h) * p.seq_q + (p.ragged ? q_start : 0) + i;
        for (int64_t x = 0; x < p.head_dim_v; ++x) {
          const double o = out[at(row * p.head_dim_v + x)];
          const double m = v_max[at(g * p.head_dim_v + x)];
          bounds.out[at(row * p.head_dim_v + x)] =
              safety * ((std::isfinite(o) ? uo * std::fabs(o) : 0) + growth * m + 2 * delta * m) + floor;
        }
        if (lse) {
          const double l = (*lse)[at(row)];
          bounds.lse[at(row)] =
              std::isfinite(l) ? safety * (ua * (std::fabs(l) + std::sqrt(static_cast<double>(n) + 1) + 1) + delta) : 0;
        }
      }
    }
    q_start += e.q_len;
  }
  return bounds;
}

namespace {

// One tensor of a relation: scored by the one judge against the expected
// (own results mapped), then checked bit for bit where declared.
struct RelationTensor {
  std::string name;
  Dims4 shape{};
  std::vector<double> expected, bound;
};

struct Exactness {
  int64_t differ = 0, compared = 0;
  std::string first;  // where the first element that is not bitwise lies
};

void check_bits(const RelationTensor& t, const std::vector<double>& got, double exact_above, bool skip_bits,
                Exactness& e) {
  if (skip_bits) return;
  for (std::size_t i = 0; i < got.size() && i < t.expected.size(); ++i) {
    if (exact_above > 0 && std::fabs(t.expected[i]) <= exact_above) continue;
    ++e.compared;
    if (same_bits(t.expected[i], got[i])) continue;
    if (e.differ++ == 0) {
      const Dims4 c = element_coordinates(t.shape, i);
      e.first = fmt::format("{}[{}, {}, {}, {}]: {} against {}", t.name, c[0], c[1], c[2], c[3], got[i], t.expected[i]);
    }
  }
}

Comparison conclude_relation(const Backend& backend, const RelationRun& run, Comparison c, const Exactness& e,
                             std::string_view direction) {
  c.compared = true;
  const bool declared = (backend.capabilities().bitwise_relations & run.relation) != 0;
  const std::string label = fmt::format("{} ({}{})", relation_name(run.relation), run.what, direction);
  if (c.verdict != Verdict::pass) {
    c.reason = fmt::format("{} breaks: {}", label, c.reason);
    return c;
  }
  if (e.differ == 0 && e.compared == 0) {
    c.reason = fmt::format("HOLDS within the bound: {}: every element lies where subnormals may round, none is "
                           "compared bit for bit", label);
    return c;
  }
  if (e.differ == 0) {
    c.reason = fmt::format("EXACT: {}: the same bits as its own run, mapped ({} elements)", label, e.compared);
    return c;
  }
  const TensorScore* worst = c.worst();
  const std::string text = fmt::format("{} of {} elements are not its own bits (first {}); the largest difference is {:.3g} of the bound",
                                       e.differ, e.compared, e.first, worst ? worst->worst_ratio : 0.0);
  if (declared) {
    c.fail(fmt::format("{}: declares it bitwise but {}", label, text));
  } else {
    c.reason = fmt::format("HOLDS within the bound: {}: {}", label, text);
  }
  return c;
}

}  // namespace

Comparison judge_relation(const Backend& backend, const CaseData& data, const BackendRun& own, const RelationRun& run,
                          const RunOptions& options) {
  const Problem& p = data.problem;
  if (const Status ok = backend_accepts(backend, run.data.problem); !ok) {
    throw Unsupported(fmt::format("it does not take the transformed case ({}): {}", run.what, ok.reason));
  }
  const BackendRun got = run_backend(backend, run.data, options);
  const Bounds own_bounds = relation_bounds(data, own.out, own.lse ? &*own.lse : nullptr, run.score_error);
  Comparison c;
  Exactness exact;
  auto judge = [&](std::string name, Dims4 shape, const TensorMap& map, const std::vector<double>& own_values,
                   const std::vector<double>& own_bound, const std::vector<double>& got_values, bool skip_bits) {
    RelationTensor t{std::move(name), shape, map.apply(own_values), {}};
    std::vector<double> scaled(own_bound);
    scale_all(scaled, std::fabs(map.factor));
    TensorMap unit = map;
    unit.factor = 1;
    unit.shift = 0;
    t.bound = unit.apply(scaled);
    TensorTruth truth;
    truth.name = t.name;
    truth.what = fmt::format("{} ({}): {}", relation_name(run.relation), run.what, t.name);
    truth.dtype = p.dtype;
    truth.shape = shape;
    truth.value = &t.expected;
    truth.bound = &t.bound;
    truth.decides_trust = false;
    c.add(score_tensor(truth, got_values));
    check_bits(t, got_values, run.exact_above, skip_bits, exact);
  };
  judge("out", {p.q_batch(), p.heads_q, p.seq_q, p.head_dim_v}, run.out, own.out, own_bounds.out, got.out, false);
  if (own.lse && got.lse) {
    // A shifted lse is rounded again: bitwise only unshifted.
    judge("lse", {p.q_batch(), p.heads_q, p.seq_q, 1}, run.lse, *own.lse, own_bounds.lse, *got.lse, run.lse.shift != 0);
  }
  if (!got.guard_damage.empty()) c.fail(fmt::format("{} ({}): {}", relation_name(run.relation), run.what, got.guard_damage));
  return conclude_relation(backend, run, std::move(c), exact, "");
}

Comparison judge_relation_backward(const Backend& backend, const CaseData& data, const std::vector<double>& dout,
                                   bool bias_gradient, const BackwardRun& own, const GradientTruth& truth,
                                   const RelationRun& run, const RunOptions& options) {
  const Problem& p = data.problem;
  if (const Status ok = backend_accepts(backend, run.data.problem, Direction::backward); !ok) {
    throw Unsupported(fmt::format("it does not take the transformed case ({}): {}", run.what, ok.reason));
  }
  const BackwardRun got = run_backward(backend, run.data, run.dout.empty() ? dout : run.dout, bias_gradient, options);
  Comparison c;
  Exactness exact;
  // Where the output scales (V x 2^k), the backward starts from the forward's
  // output in the dtype, whose subnormals round differently scaled: each
  // row's D = dO . O, and every gradient that takes it, may then differ in
  // the last bit though both runs are right (seed 2, case 142: float16 out
  // near 1e-4 beside a large sink). Within the bound, not bit for bit.
  const double out_factor = std::fabs(run.out.factor);
  const bool subnormal_out = std::isinf(run.exact_above) ||
                            (out_factor != 1 && std::any_of(own.out.begin(), own.out.end(), [&](double o) {
                              return o != 0 && std::fabs(o) < smallest_normal(p.dtype) * std::max(out_factor, 1.0);
                            }));
  // A row with no visible key that the backend fills by its declared
  // convention (py-numpy's mean of V) adds terms that the format's truth
  // lacks: dO / seq_k of each such row into dV of every key, summed over a
  // query group whose order the head permutation reverses (py-numpy, attn
  // fuzz seed 2, case 998: dV one float64 ulp apart against a bound of 0).
  const ReferenceGradients bounds = convention_widened_bounds(conventions_of(backend, p), data, dout, truth);
  for (const GradientPart& part : gradient_parts(p)) {
    const std::vector<double>& own_values = own.got.*part.values;
    const std::vector<double>& got_values = got.got.*part.values;
    const std::vector<double>& own_bound = bounds.*part.values;
    if (own_values.empty() || got_values.size() != own_values.size() || own_bound.size() != own_values.size()) continue;
    const TensorMap& map = run.gradient(part.name);
    RelationTensor t{part.name, part.shape, map.apply(own_values), {}};
    for (double x : t.expected) {
      if (std::isfinite(x) && std::fabs(x) > dtype_max(p.dtype) / 2) {
        throw Unsupported(fmt::format("{} ({}): its {} scaled would leave {}'s range", relation_name(run.relation),
                                      run.what, part.name, dtype_name(p.dtype)));
      }
    }
    std::vector<double> scaled(own_bound);
    scale_all(scaled, 2 * std::fabs(map.factor));
    TensorMap unit = map;
    unit.factor = 1;
    t.bound = unit.apply(scaled);
    TensorTruth tt;
    tt.name = part.name;
    tt.what = fmt::format("{} ({}, backward): {}", relation_name(run.relation), run.what, part.name);
    tt.dtype = p.dtype;
    tt.shape = part.shape;
    tt.value = &t.expected;
    tt.bound = &t.bound;
    tt.decides_trust = false;
    c.add(score_tensor(tt, got_values));
    check_bits(t, got_values, run.exact_above, subnormal_out, exact);
  }
  return conclude_relation(backend, run, std::move(c), exact, ", backward");
}

}  // namespace attn
