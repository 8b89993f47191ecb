#include "verify/invariance.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "attnbench/error.hpp"
#include "verify/relations.hpp"
#include "verify/run_case.hpp"

namespace attn {

namespace {

using std::int64_t;
std::size_t at(int64_t i) { return static_cast<std::size_t>(i); }

// Index of (b, h, i, j) in a mask or bias stored [sb, sh, sr, seq_k] with broadcast axes of 1.
int64_t broadcast_at(const BroadcastShape& s, int64_t b, int64_t h, int64_t i, int64_t j, int64_t seq_k) {
  return (((s.batch == 1 ? 0 : b) * s.heads + (s.heads == 1 ? 0 : h)) * s.rows + (s.rows == 1 ? 0 : i)) * seq_k + j;
}

// Values of keys past an entry's length and of free pages: valid in every
// dtype, large enough that a read shows.
constexpr double kUnread = 1000.0;

// Format version 4: the row of scale cells that stored row (b, h, s) reads
// (groups cells each), broadcast axes of 1 as in CaseData::dequantise.
int64_t scale_cell(const QuantSpec& spec, int64_t b, int64_t h, int64_t s) {
  return ((spec.scale[0] == 1 ? 0 : b) * spec.scale[1] + (spec.scale[1] == 1 ? 0 : h)) * spec.scale[2] +
         (spec.scale[2] == 1 ? 0 : s);
}

// The codes of a row no entry reads: the largest code (ggml: blocks of 10^4,
// or a quarter of the dtype's range), as core/quantise.cpp fills free slots.
std::vector<std::uint8_t> unread_codes(Encoding e, int64_t width, DType dtype) {
  std::vector<std::uint8_t> row(at(encoded_row_bytes(e, width)));
  auto fill = [&](std::uint8_t code) { std::fill(row.begin(), row.end(), code); };
  switch (e) {
    case Encoding::e4m3: fill(0x7E); break;  // 448
    case Encoding::e5m2: fill(0x7B); break;  // 57344
    case Encoding::s8: fill(0x7F); break;
    case Encoding::u8: fill(0xFF); break;
    case Encoding::s4:
    case Encoding::u4:
      fill(e == Encoding::s4 ? 0x77 : 0xFF);
      if (width % 2 != 0) row.back() &= 0x0F;  // the last byte's high nibble is no element
      break;
    case Encoding::q8_0:
    case Encoding::q4_0: {
      const std::vector<double> x(at(width), std::min(1e4, largest_finite(dtype) / 4));
      ggml_quantise_row(e, x.data(), width, row.data());
      break;
    }
    case Encoding::none: break;
  }
  return row;
}

// How one quantised tensor's rows are sized: heads, bytes of codes and
// scale groups per row.
struct CodeRows {
  int64_t heads = 0, bytes = 0, groups = 0;
  bool zero_point = false;
};
CodeRows code_rows(const Problem& p, char t) {
  const QuantSpec& spec = p.quant(t);
  const auto shape = p.stored_shape(t);
  return {shape[1], encoded_row_bytes(spec.encoding, shape[3]), spec.has_scale() ? spec.scale[3] : 0, spec.zero_point};
}

constexpr char kTensors[3] = {'q', 'k', 'v'};

}  // namespace

std::string_view arrangement_name(Arrangement arrangement) {
  switch (arrangement) {
    case Arrangement::dense: return "dense";
    case Arrangement::packed: return "packed";
    case Arrangement::paged: return "paged";
  }
  return "?";
}

std::vector<BatchEntry> batch_entries(const CaseData& data, const std::vector<double>* dout, int64_t count) {
  const Problem& p = data.problem;
  const int64_t hq = p.heads_q, hkv = p.heads_kv, d = p.head_dim, dv = p.head_dim_v;
  std::vector<BatchEntry> entries(at(count < 0 ? p.batch : std::min(count, p.batch)));
  for (int64_t b = 0; b < static_cast<int64_t>(entries.size()); ++b) {
    BatchEntry& e = entries[at(b)];
    int64_t q0 = 0, k0 = 0;  // first row of the entry in q's and k's sequence axis (packed)
    if (p.ragged) {
      q0 = data.cu_seqlens_q[at(b)];
      k0 = data.cu_seqlens_k[at(b)];
      e.q_len = data.cu_seqlens_q[at(b + 1)] - q0;
      e.k_len = data.cu_seqlens_k[at(b + 1)] - k0;
      e.limit = e.k_len;
    } else if (p.paged()) {
      e.q_len = p.seq_q;
      e.k_len = data.seq_lens[at(b)];
      e.limit = e.k_len;
    } else {
      e.q_len = p.seq_q;
      e.k_len = p.seq_k;
      e.limit = p.kv_len ? std::min(data.kv_len[at(b)], p.seq_k) : p.seq_k;
    }
    const int64_t tb = p.ragged ? 0 : b;
    e.q.resize(at(hq * e.q_len * d));
    if (dout) e.dout.resize(at(hq * e.q_len * dv));
    for (int64_t h = 0; h < hq; ++h) {
      for (int64_t i = 0; i < e.q_len; ++i) {
        const int64_t r = (tb * hq + h) * p.seq_q + q0 + i;
        std::copy(&data.q[at(r * d)], &data.q[at((r + 1) * d)], &e.q[at((h * e.q_len + i) * d)]);
        if (dout) std::copy(&(*dout)[at(r * dv)], &(*dout)[at((r + 1) * dv)], &e.dout[at((h * e.q_len + i) * dv)]);
      }
    }
    // Where key j of kv head g is held: (tensor batch, seq position).
    auto key_at = [&](int64_t g, int64_t j, int64_t width) {
      if (p.paged()) {
        const int64_t page = data.page_table[at(b * p.pages_per_entry() + j / p.page_size)];
        return ((page * hkv + g) * p.page_size + j % p.page_size) * width;
      }
      return ((tb * hkv + g) * p.seq_k + k0 + j) * width;
    };
    e.k.resize(at(hkv * e.k_len * d));
    e.v.resize(at(hkv * e.k_len * dv));
    for (int64_t g = 0; g < hkv; ++g) {
      for (int64_t j = 0; j < e.k_len; ++j) {
        const double* k = &data.k[at(key_at(g, j, d))];
        std::copy(k, k + d, &e.k[at((g * e.k_len + j) * d)]);
        const double* v = &data.v[at(key_at(g, j, dv))];
        std::copy(v, v + dv, &e.v[at((g * e.k_len + j) * dv)]);
      }
    }
    // Format version 4: each quantised tensor's rows as stored, with the
    // scale groups and zero points each reads, and the entry's descales.
    for (int t = 0; t < 3; ++t) {
      const char name = kTensors[t];
      const QuantSpec& spec = p.quant(name);
      if (!spec.quantised()) continue;
      const QuantData& from = data.quant(name);
      const auto shape = p.stored_shape(name);
      const CodeRows w = code_rows(p, name);
      const int64_t len = name == 'q' ? e.q_len : e.k_len;
      EntryCodes& to = e.codes[at(t)];
      for (int64_t h = 0; h < w.heads; ++h) {
        for (int64_t i = 0; i < len; ++i) {
          int64_t sb = tb, ss = (name == 'q' ? q0 : k0) + i;
          if (name != 'q' && p.paged()) {
            sb = data.page_table[at(b * p.pages_per_entry() + i / p.page_size)];
            ss = i % p.page_size;
          }
          const int64_t row = (sb * shape[1] + h) * shape[2] + ss;
          to.codes.insert(to.codes.end(), from.codes.begin() + row * w.bytes, from.codes.begin() + (row + 1) * w.bytes);
          if (w.groups == 0) continue;
          const int64_t cell = scale_cell(spec, sb, h, ss) * w.groups;
          to.scale.insert(to.scale.end(), from.scale.begin() + cell, from.scale.begin() + cell + w.groups);
          if (spec.zero_point) {
            to.zero_point.insert(to.zero_point.end(), from.zero_point.begin() + cell,
                                 from.zero_point.begin() + cell + w.groups);
          }
        }
      }
      if (spec.descale == Descale::entry_head) {
        to.descale.assign(from.descale.begin() + b * hkv, from.descale.begin() + (b + 1) * hkv);
      }
    }
    auto rows = [&](const BroadcastShape& shape, const auto& stored, auto& into) {
      into.resize(at(hq * e.q_len * e.k_len));
      for (int64_t h = 0; h < hq; ++h) {
        for (int64_t i = 0; i < e.q_len; ++i) {
          for (int64_t j = 0; j < e.k_len; ++j) {
            into[at((h * e.q_len + i) * e.k_len + j)] = stored[at(broadcast_at(shape, b, h, i, j, p.seq_k))];
          }
        }
      }
    };
    if (p.mask.present) rows(p.mask, data.mask, e.mask);
    if (p.bias.present) rows(p.bias, data.bias, e.bias);
  }
  return entries;
}

namespace {

// Format version 4: the codes, scales, zero points and descales of tensor t
// in the assembled case `c` from its entries' rows, the scales in the
// original's shape (c.problem's, fitted): empty, or why that shape cannot
// hold them (per-entry scales in a packed batch, ...).
std::string place_codes(CaseData& c, const CaseData& original, const std::vector<BatchEntry>& entries, int t,
                        Arrangement arrangement) {
  const char name = kTensors[t];
  const Problem& p = c.problem;
  const QuantSpec& spec = p.quant(name);
  const auto shape = p.stored_shape(name);
  const CodeRows w = code_rows(p, name);
  QuantData& out = c.quant(name);
  out = {};
  const std::vector<std::uint8_t> unread = unread_codes(spec.encoding, shape[3], p.dtype);
  const int64_t rows = shape[0] * shape[1] * shape[2];
  out.codes.resize(at(rows * w.bytes));
  for (int64_t r = 0; r < rows; ++r) std::copy(unread.begin(), unread.end(), out.codes.begin() + r * w.bytes);
  const int64_t cells = w.groups > 0 ? spec.scale[0] * spec.scale[1] * spec.scale[2] : 0;
  out.scale.assign(at(cells * w.groups), 1.0f);
  if (spec.zero_point) out.zero_point.assign(at(cells * w.groups), 0);
  std::vector<char> taken(at(cells), 0);
  int64_t q_off = 0, k_off = 0;
  for (int64_t b = 0; b < static_cast<int64_t>(entries.size()); ++b) {
    const BatchEntry& e = entries[at(b)];
    const EntryCodes& from = e.codes[at(t)];
    const int64_t len = name == 'q' ? e.q_len : e.k_len;
    for (int64_t h = 0; h < w.heads; ++h) {
      for (int64_t i = 0; i < len; ++i) {
        int64_t sb = p.ragged ? 0 : b, ss = (p.ragged ? (name == 'q' ? q_off : k_off) : 0) + i;
        if (name != 'q' && p.paged()) {
          sb = c.page_table[at(b * p.pages_per_entry() + i / p.page_size)];
          ss = i % p.page_size;
        }
        const int64_t row = (sb * shape[1] + h) * shape[2] + ss, mine = h * len + i;
        std::copy(from.codes.begin() + mine * w.bytes, from.codes.begin() + (mine + 1) * w.bytes,
                  out.codes.begin() + row * w.bytes);
        if (w.groups == 0) continue;
        const int64_t cell = scale_cell(spec, sb, h, ss);
        const float* scale = &from.scale[at(mine * w.groups)];
        const std::int32_t* zero = spec.zero_point ? &from.zero_point[at(mine * w.groups)] : nullptr;
        float* to_scale = &out.scale[at(cell * w.groups)];
        std::int32_t* to_zero = spec.zero_point ? &out.zero_point[at(cell * w.groups)] : nullptr;
        if (!taken[at(cell)]) {
          std::copy(scale, scale + w.groups, to_scale);
          if (zero) std::copy(zero, zero + w.groups, to_zero);
          taken[at(cell)] = 1;
        } else if (!std::equal(scale, scale + w.groups, to_scale) || (zero && !std::equal(zero, zero + w.groups, to_zero))) {
          const QuantSpec& was = original.problem.quant(name);
          return fmt::format("{}'s scales of shape [{}] cannot keep that shape in a {} batch of these entries", name,
                             fmt::join(was.scale, ", "), arrangement_name(arrangement));
        }
      }
    }
    q_off += e.q_len;
    k_off += e.k_len;
  }
  if (spec.descale == Descale::tensor) out.descale = original.quant(name).descale;
  if (spec.descale == Descale::entry_head) {
    for (const BatchEntry& e : entries) out.descale.insert(out.descale.end(), e.codes[at(t)].descale.begin(), e.codes[at(t)].descale.end());
  }
  return {};
}

}  // namespace

Assembled assemble(const CaseData& original, const std::vector<BatchEntry>& entries, Arrangement arrangement,
                   int64_t page_size, std::uint64_t seed) {
  const Problem& o = original.problem;
  const int64_t n = static_cast<int64_t>(entries.size());
  const int64_t hq = o.heads_q, hkv = o.heads_kv, d = o.head_dim, dv = o.head_dim_v;
  if (n == 0) return {std::nullopt, "no entry"};
  const bool masked = std::any_of(entries.begin(), entries.end(), [](const BatchEntry& e) { return !e.mask.empty(); });
  const bool biased = std::any_of(entries.begin(), entries.end(), [](const BatchEntry& e) { return !e.bias.empty(); });
  const bool limited = std::any_of(entries.begin(), entries.end(), [](const BatchEntry& e) { return e.limit < e.k_len; });
  const bool equal_q = std::all_of(entries.begin(), entries.end(), [&](const BatchEntry& e) { return e.q_len == entries[0].q_len; });
  const bool equal_k = std::all_of(entries.begin(), entries.end(), [&](const BatchEntry& e) { return e.k_len == entries[0].k_len; });
  if (arrangement != Arrangement::dense && (masked || biased || limited)) {
    return {std::nullopt, fmt::format("a {} batch takes no mask, bias or kv_len", arrangement_name(arrangement))};
  }
  if (arrangement == Arrangement::dense && !(equal_q && equal_k)) return {std::nullopt, "entries of other lengths"};
  if (arrangement == Arrangement::paged && !equal_q) return {std::nullopt, "entries with other numbers of queries"};

  CaseData c;
  Problem& p = c.problem;
  p = o;
  p.batch = n;
  p.ragged = arrangement == Arrangement::packed;
  p.page_size = 0;
  p.num_pages = 0;
  p.kv_len = false;
  p.mask = {};
  p.bias = {};
  c.alibi_slopes = original.alibi_slopes;
  c.sinks = original.sinks;
  int64_t total_q = 0, total_k = 0, longest_k = 0;
  for (const BatchEntry& e : entries) {
    total_q += e.q_len;
    total_k += e.k_len;
    longest_k = std::max(longest_k, e.k_len);
  }
  // Where entry e's query row i and key j go (element offsets of q and k rows).
  std::vector<int64_t> q_start(at(n)), k_start(at(n));
  if (arrangement == Arrangement::dense) {
    p.seq_q = entries[0].q_len;
    p.seq_k = entries[0].k_len;
    p.kv_len = limited;
    if (limited) {
      for (const BatchEntry& e : entries) c.kv_len.push_back(e.limit);
    }
  } else if (arrangement == Arrangement::packed) {
    p.seq_q = std::max<int64_t>(total_q, 1);
    p.seq_k = total_k;
    c.cu_seqlens_q.assign(1, 0);
    c.cu_seqlens_k.assign(1, 0);
    for (const BatchEntry& e : entries) {
      c.cu_seqlens_q.push_back(c.cu_seqlens_q.back() + e.q_len);
      c.cu_seqlens_k.push_back(c.cu_seqlens_k.back() + e.k_len);
    }
  } else {
    p.seq_q = entries[0].q_len;
    p.page_size = page_size;
    const int64_t per_entry = std::max<int64_t>((longest_k + page_size - 1) / page_size, 1);
    p.seq_k = per_entry * page_size;
    // Every entry's pages, then as many free ones, in a shuffled pool.
    p.num_pages = 2 * n * per_entry;
    std::vector<int64_t> pool(at(p.num_pages));
    std::iota(pool.begin(), pool.end(), 0);
    std::mt19937_64 rng(seed);
    std::shuffle(pool.begin(), pool.end(), rng);
    c.page_table.assign(pool.begin(), pool.begin() + n * per_entry);
    for (const BatchEntry& e : entries) c.seq_lens.push_back(e.k_len);
  }
  p.fit_quant_scales();  // full axes of a quantised tensor's scales to the new sizes; broadcast ones stay
  p.validate();
  const int64_t q_batch = p.q_batch(), kv_batch = p.kv_batch(), kv_seq = p.kv_seq();
  c.q.assign(at(q_batch * hq * p.seq_q * d), 0.0);
  c.k.assign(at(kv_batch * hkv * kv_seq * d), kUnread);
  c.v.assign(at(kv_batch * hkv * kv_seq * dv), kUnread);
  const bool with_dout =
      std::all_of(entries.begin(), entries.end(), [&](const BatchEntry& e) { return e.dout.size() == at(hq * e.q_len * dv); }) &&
      std::any_of(entries.begin(), entries.end(), [](const BatchEntry& e) { return !e.dout.empty(); });
  std::vector<double> dout;
  if (with_dout) dout.assign(at(q_batch * hq * p.seq_q * dv), 0.0);
  int64_t q_off = 0, k_off = 0;
  for (int64_t b = 0; b < n; ++b) {
    const BatchEntry& e = entries[at(b)];
    const int64_t tb = p.ragged ? 0 : b;
    const int64_t q0 = p.ragged ? q_off : 0, k0 = p.ragged ? k_off : 0;
    for (int64_t h = 0; h < hq; ++h) {
      for (int64_t i = 0; i < e.q_len; ++i) {
        const int64_t r = (tb * hq + h) * p.seq_q + q0 + i, from = h * e.q_len + i;
        std::copy(&e.q[at(from * d)], &e.q[at((from + 1) * d)], &c.q[at(r * d)]);
        if (with_dout) std::copy(&e.dout[at(from * dv)], &e.dout[at((from + 1) * dv)], &dout[at(r * dv)]);
      }
    }
    auto key_at = [&](int64_t g, int64_t j, int64_t width) {
      if (p.paged()) {
        const int64_t page = c.page_table[at(b * p.pages_per_entry() + j / page_size)];
        return ((page * hkv + g) * page_size + j % page_size) * width;
      }
      return ((tb * hkv + g) * p.seq_k + k0 + j) * width;
    };
    for (int64_t g = 0; g < hkv; ++g) {
      for (int64_t j = 0; j < e.k_len; ++j) {
        std::copy(&e.k[at((g * e.k_len + j) * d)], &e.k[at((g * e.k_len + j + 1) * d)], &c.k[at(key_at(g, j, d))]);
        std::copy(&e.v[at((g * e.k_len + j) * dv)], &e.v[at((g * e.k_len + j + 1) * dv)], &c.v[at(key_at(g, j, dv))]);
      }
    }
    q_off += e.q_len;
    k_off += e.k_len;
  }
  if (masked || biased) {
    // Full [n, heads_q, seq_q, seq_k] rows: each entry's own.
    const int64_t size = n * hq * p.seq_q * p.seq_k;
    if (masked) {
      p.mask = {true, n, hq, p.seq_q};
      c.mask.assign(at(size), 1);
    }
    if (biased) {
      p.bias = {true, n, hq, p.seq_q};
      c.bias.assign(at(size), 0.0);
    }
    for (int64_t b = 0; b < n; ++b) {
      const BatchEntry& e = entries[at(b)];
      for (int64_t r = 0; r < hq * e.q_len * e.k_len; ++r) {
        if (masked) c.mask[at(b * hq * e.q_len * e.k_len + r)] = e.mask.empty() ? 1 : e.mask[at(r)];
        if (biased) c.bias[at(b * hq * e.q_len * e.k_len + r)] = e.bias.empty() ? 0.0 : e.bias[at(r)];
      }
    }
  }
  // Format version 4: the codes in place, then the values are theirs.
  if (o.quantised()) {
    for (int t = 0; t < 3; ++t) {
      if (!p.quant(kTensors[t]).quantised()) continue;
      std::string why = place_codes(c, original, entries, t, arrangement);
      if (!why.empty()) return {std::nullopt, std::move(why)};
    }
    c.dequantise();
  }
  // Shapes only: every value is one of a validated case's (or the unread
  // filler, exact in every dtype), so none needs checking again.
  c.validate_shapes();
  return {std::move(c), {}, std::move(dout)};
}

namespace {

// Rows stored [heads, len, width] (queries, dO, keys, codes): the first
// `take` of each head, padded past `len` with `fill` (or, for scales, the
// head's last row); or each head's rows `times` over.
template <typename T>
std::vector<T> head_rows(const std::vector<T>& x, int64_t heads, int64_t len, int64_t take, int64_t width, T fill,
                         bool repeat_last = false) {
  std::vector<T> out;
  out.reserve(at(heads * take * width));
  for (int64_t h = 0; h < heads; ++h) {
    out.insert(out.end(), x.begin() + h * len * width, x.begin() + (h * len + std::min(take, len)) * width);
    for (int64_t i = len; i < take; ++i) {
      if (repeat_last && len > 0) {
        out.insert(out.end(), x.begin() + (h * len + len - 1) * width, x.begin() + (h * len + len) * width);
      } else {
        out.insert(out.end(), at(width), fill);
      }
    }
  }
  return out;
}

template <typename T>
std::vector<T> repeated_rows(const std::vector<T>& x, int64_t heads, int64_t len, int times, int64_t width) {
  std::vector<T> out;
  for (int64_t h = 0; h < heads; ++h) {
    for (int t = 0; t < times; ++t) out.insert(out.end(), x.begin() + h * len * width, x.begin() + (h + 1) * len * width);
  }
  return out;
}

// The same for a quantised tensor's rows: zero codes past `len` (a finite
// value in every encoding), each with its head's last scales.
EntryCodes head_codes(const EntryCodes& c, const CodeRows& w, int64_t len, int64_t take) {
  EntryCodes out;
  out.codes = head_rows(c.codes, w.heads, len, take, w.bytes, std::uint8_t{0});
  if (w.groups > 0) out.scale = head_rows(c.scale, w.heads, len, take, w.groups, 1.0f, true);
  if (w.zero_point) out.zero_point = head_rows(c.zero_point, w.heads, len, take, w.groups, 0, true);
  out.descale = c.descale;
  return out;
}

EntryCodes repeated_codes(const EntryCodes& c, const CodeRows& w, int64_t len, int times) {
  EntryCodes out;
  out.codes = repeated_rows(c.codes, w.heads, len, times, w.bytes);
  if (w.groups > 0) out.scale = repeated_rows(c.scale, w.heads, len, times, w.groups);
  if (w.zero_point) out.zero_point = repeated_rows(c.zero_point, w.heads, len, times, w.groups);
  out.descale = c.descale;
  return out;
}

// A neighbour: the first `q_len` queries (and dO rows) and `k_len` keys of
// an entry, as a serving batch holds short requests next to a long one.
BatchEntry prefix(const BatchEntry& e, int64_t q_len, int64_t k_len, const Problem& p, bool with_dout) {
  const int64_t hq = p.heads_q, hkv = p.heads_kv, d = p.head_dim, dv = p.head_dim_v;
  BatchEntry s;
  s.q_len = q_len;
  s.k_len = std::min(k_len, e.k_len);
  s.limit = s.k_len;
  s.q = head_rows(e.q, hq, e.q_len, q_len, d, 0.5);
  if (with_dout) s.dout = head_rows(e.dout, hq, e.q_len, q_len, dv, 0.5);
  s.k = head_rows(e.k, hkv, e.k_len, s.k_len, d, 0.0);
  s.v = head_rows(e.v, hkv, e.k_len, s.k_len, dv, 0.0);
  for (int t = 0; t < 3; ++t) {
    if (!p.quant(kTensors[t]).quantised()) continue;
    s.codes[at(t)] = t == 0 ? head_codes(e.codes[0], code_rows(p, 'q'), e.q_len, s.q_len)
                            : head_codes(e.codes[at(t)], code_rows(p, kTensors[t]), e.k_len, s.k_len);
  }
  return s;
}

// Neighbours of other lengths: the first half of an entry's queries and
// keys (shorter), or its keys (and, packed, its queries) twice (longer).
BatchEntry shorter(const BatchEntry& e, const Problem& p, bool with_dout) {
  return prefix(e, std::max<int64_t>(e.q_len / 2, 1), e.k_len / 2, p, with_dout);
}

BatchEntry longer(const BatchEntry& e, const Problem& p, bool more_queries, bool with_dout) {
  const int64_t hq = p.heads_q, hkv = p.heads_kv, d = p.head_dim, dv = p.head_dim_v;
  BatchEntry l;
  const int q_times = more_queries ? 2 : 1;
  l.q_len = q_times * e.q_len;
  l.k_len = 2 * e.k_len;
  l.limit = l.k_len;
  l.q = repeated_rows(e.q, hq, e.q_len, q_times, d);
  if (with_dout) l.dout = repeated_rows(e.dout, hq, e.q_len, q_times, dv);
  l.k = repeated_rows(e.k, hkv, e.k_len, 2, d);
  l.v = repeated_rows(e.v, hkv, e.k_len, 2, dv);
  for (int t = 0; t < 3; ++t) {
    if (!p.quant(kTensors[t]).quantised()) continue;
    l.codes[at(t)] = t == 0 ? repeated_codes(e.codes[0], code_rows(p, 'q'), e.q_len, q_times)
                            : repeated_codes(e.codes[at(t)], code_rows(p, kTensors[t]), e.k_len, 2);
  }
  return l;
}

int64_t elements(const CaseData& c) {
  return static_cast<int64_t>(std::max({c.q.size(), c.k.size(), c.v.size(), c.mask.size(), c.bias.size()}));
}

constexpr int64_t kMostEntries = 1024;

}  // namespace

std::vector<InvarianceRun> invariance_runs(const CaseData& data, int64_t element_budget, const std::vector<double>* dout) {
  const Problem& p = data.problem;
  std::vector<InvarianceRun> runs;
  const int64_t n = p.batch;
  // Runs of the whole batch only within the budget and for a batch of at
  // most 1024 entries (each entry taken out is a few small vectors: 2^22
  // entries of one query would take gigabytes); else each of the first 16
  // entries alone.
  const bool whole = n <= kMostEntries && (element_budget <= 0 || elements(data) <= element_budget);
  const std::vector<BatchEntry> entries = batch_entries(data, dout, whole ? n : std::min<int64_t>(n, 16));
  const Arrangement own = p.ragged ? Arrangement::packed : p.paged() ? Arrangement::paged : Arrangement::dense;
  const int64_t own_page = p.paged() ? p.page_size : 16;
  auto add = [&](std::string what, const std::vector<BatchEntry>& es, const std::vector<int64_t>& source, Arrangement a,
                 std::int64_t page_size, std::uint64_t seed) {
    Assembled built;
    try {
      built = assemble(data, es, a, page_size, seed);
    } catch (const InputError&) {
      return;  // an arrangement the format cannot hold (an entry without queries, alone and dense)
    }
    if (!built.data) return;
    if (element_budget > 0 && elements(*built.data) > element_budget) return;
    runs.push_back({std::move(what), std::move(*built.data), a, source, std::move(built.dout)});
  };
  // Each entry alone (the first 16), in the case's own arrangement.
  for (int64_t b = 0; b < std::min<int64_t>(n, 16); ++b) {
    if (n == 1) break;  // alone is the case itself
    add(fmt::format("alone (entry {})", b), {entries[at(b)]}, {b}, own, own_page, 7 + static_cast<std::uint64_t>(b));
  }
  if (!whole) return runs;
  // The batch reversed.
  if (n > 1) {
    std::vector<BatchEntry> reversed(entries.rbegin(), entries.rend());
    std::vector<int64_t> source(at(n));
    for (int64_t b = 0; b < n; ++b) source[at(b)] = n - 1 - b;
    add("reversed", reversed, source, own, own_page, 3);
  }
  // Among many short requests: the case's entries in the middle of a batch
  // of 64, the others of one query (a paged batch: as many as the case's)
  // and 1 to 16 keys. Splits and tile counts that follow the number of
  // sequences or tiles change here; it costs little more than the case.
  if (n < 64) {
    const Arrangement a = own == Arrangement::dense ? Arrangement::packed : own;
    const int64_t q_len = a == Arrangement::paged ? entries[0].q_len : 1;
    std::vector<BatchEntry> batch;
    std::vector<int64_t> source;
    for (int64_t filler = 0; static_cast<int64_t>(batch.size()) + n < 64; ++filler) {
      batch.push_back(prefix(entries[at(filler % n)], q_len, 1 + filler % 16, p, dout != nullptr));
      source.push_back(-1);
    }
    const std::size_t middle = batch.size() / 2;
    batch.insert(batch.begin() + static_cast<std::ptrdiff_t>(middle), entries.begin(), entries.end());
    std::vector<int64_t> ours(at(n));
    std::iota(ours.begin(), ours.end(), 0);
    source.insert(source.begin() + static_cast<std::ptrdiff_t>(middle), ours.begin(), ours.end());
    add(fmt::format("among 63 short entries{}", own == a ? "" : fmt::format(" ({})", arrangement_name(a))), batch,
        source, a, own_page, 23);
  }
  // Among other entries of the case's own size: the case's entries after
  // others, 16 or 4 in all, with shorter and longer neighbours where the
  // arrangement holds other lengths.
  for (const int64_t size : {16, 4}) {
    if (size <= n) break;
    std::vector<BatchEntry> batch;
    std::vector<int64_t> source;
    const bool lengths_vary = own != Arrangement::dense;
    int64_t filler = 0;
    while (static_cast<int64_t>(batch.size()) + n < size) {
      if (lengths_vary && filler % 3 == 1) {
        batch.push_back(shorter(entries[at(filler % n)], p, dout != nullptr));
      } else if (lengths_vary && filler % 3 == 2) {
        batch.push_back(longer(entries[at(filler % n)], p, own == Arrangement::packed, dout != nullptr));
      } else {
        batch.push_back(entries[at((n - 1 - filler % n + n) % n)]);
      }
      source.push_back(-1);
      ++filler;
    }
    // The case's entries in the middle of the batch, not at its start.
    const std::size_t middle = batch.size() / 2;
    batch.insert(batch.begin() + static_cast<std::ptrdiff_t>(middle), entries.begin(), entries.end());
    std::vector<int64_t> ours(at(n));
    std::iota(ours.begin(), ours.end(), 0);
    source.insert(source.begin() + static_cast<std::ptrdiff_t>(middle), ours.begin(), ours.end());
    const std::size_t before = runs.size();
    add(fmt::format("in a batch of {}", size), batch, source, own, own_page, 11);
    if (runs.size() > before) break;  // the largest that fits the budget
  }
  std::vector<int64_t> identity(at(n));
  std::iota(identity.begin(), identity.end(), 0);
  // Another arrangement of the same entries.
  if (own != Arrangement::packed) add("packed", entries, identity, Arrangement::packed, 16, 5);
  if (own != Arrangement::dense) {
    for (int64_t b = 0; b < std::min<int64_t>(n, 4); ++b) {
      add(fmt::format("dense (entry {})", b), {entries[at(b)]}, {b}, Arrangement::dense, 16, 9);
    }
  }
  if (own != Arrangement::paged) {
    add("paged (pages of 16)", entries, identity, Arrangement::paged, 16, 13);
  } else {
    add("paged at other pages", entries, identity, Arrangement::paged, own_page, 17);
    if (own_page != 1) add("paged (pages of 1)", entries, identity, Arrangement::paged, 1, 19);
  }
  return runs;
}

namespace {

// Where entry e's rows sit in a run's canonical tensors: its first query row
// and first key row along the sequence axis (packed: cu_seqlens; else 0).
struct EntryStarts {
  std::vector<int64_t> q, k;
};
EntryStarts entry_starts(const CaseData& c) {
  const Problem& p = c.problem;
  EntryStarts starts{std::vector<int64_t>(at(p.batch)), std::vector<int64_t>(at(p.batch))};
  for (int64_t b = 0; b < p.batch; ++b) {
    starts.q[at(b)] = p.ragged ? c.cu_seqlens_q[at(b)] : 0;
    starts.k[at(b)] = p.ragged ? c.cu_seqlens_k[at(b)] : 0;
  }
  return starts;
}

// Row index of entry e's query row i of head h in out, lse or dQ ([q_batch, heads_q, seq_q, ...]).
int64_t row_of(const Problem& p, const EntryStarts& starts, int64_t e, int64_t h, int64_t i) {
  return ((p.ragged ? 0 : e) * p.heads_q + h) * p.seq_q + starts.q[at(e)] + i;
}

// Row index of entry e's key j of kv head g in dK or dV ([kv_batch, heads_kv, kv_seq, ...]; not paged).
int64_t key_row_of(const Problem& p, const EntryStarts& starts, int64_t e, int64_t g, int64_t j) {
  return ((p.ragged ? 0 : e) * p.heads_kv + g) * p.seq_k + starts.k[at(e)] + j;
}

// Each entry's query and key counts (what batch_entries would give, without
// copying the entries).
struct EntryLength {
  int64_t q_len = 0, k_len = 0;
};
std::vector<EntryLength> entry_lengths(const CaseData& c) {
  const Problem& p = c.problem;
  std::vector<EntryLength> lengths(at(p.batch));
  for (int64_t b = 0; b < p.batch; ++b) {
    EntryLength& l = lengths[at(b)];
    if (p.ragged) {
      l = {c.cu_seqlens_q[at(b + 1)] - c.cu_seqlens_q[at(b)], c.cu_seqlens_k[at(b + 1)] - c.cu_seqlens_k[at(b)]};
    } else {
      l = {p.seq_q, p.paged() ? c.seq_lens[at(b)] : p.seq_k};
    }
  }
  return lengths;
}

bool same_bits(double a, double b) {
  return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b));
}

// The largest variation over every run, in units of the bound, and where.
class Variations {
 public:
  // Element `x` of a row: `a` in the case's own run, `b` in `run`'s.
  // `where` (called only when it is the largest so far) names it.
  template <typename Where>
  void note(double a, double b, double bound, Where&& where) {
    if (same_bits(a, b)) return;
    varied_ = true;
    const double diff = std::isfinite(a) && std::isfinite(b) ? std::fabs(a - b) : INFINITY;
    const double ratio = bound > 0 ? diff / bound : INFINITY;
    if (ratio > worst_ || worst_where_.empty()) {
      worst_ = ratio;
      worst_diff_ = diff;
      worst_where_ = fmt::format("{}: {} against {}", where(), b, a);
    }
  }
  // After each run: whether it varied.
  void end_run() {
    varied_runs_ += varied_;
    varied_ = false;
  }

  // The verdict over `ran` (and the runs not taken, `skipped`).
  void conclude(Comparison& c, const Backend& backend, const std::vector<std::string>& ran,
                const std::vector<std::string>& skipped) const {
    c.compared = true;
    const std::string skipped_text = skipped.empty() ? "" : fmt::format("; not run: {}", fmt::join(skipped, "; "));
    if (varied_runs_ == 0) {
      if (c.verdict == Verdict::pass) {
        c.reason = fmt::format("INVARIANT: the same bits in {} other batches ({}){}", ran.size(),
                               fmt::join(ran, ", "), skipped_text);
      }
      return;
    }
    const std::string text =
        fmt::format("VARIES in {} of {} other batches: the largest difference, {:.3g} ({:.3g} of the bound), is {}{}",
                    varied_runs_, ran.size(), worst_diff_, worst_, worst_where_, skipped_text);
    if (backend.capabilities().batch_invariant) {
      c.fail(fmt::format("declares batch invariance but {}", text));
    } else if (c.verdict == Verdict::pass) {
      c.verdict = Verdict::differs;
      c.reason = text;
    }
  }

 private:
  double worst_ = 0, worst_diff_ = 0;
  std::string worst_where_;
  bool varied_ = false;
  int64_t varied_runs_ = 0;
};

// The runs `backend` takes (for `direction`), the others named with the reason.
std::vector<const InvarianceRun*> accepted_runs(const Backend& backend, const std::vector<InvarianceRun>& runs,
                                                Direction direction, std::vector<std::string>& skipped) {
  std::vector<const InvarianceRun*> accepted;
  for (const InvarianceRun& run : runs) {
    if (direction == Direction::backward && run.dout.empty()) continue;
    const Status ok = backend_accepts(backend, run.data.problem, direction);
    if (ok) {
      accepted.push_back(&run);
    } else {
      skipped.push_back(fmt::format("{} ({})", run.what, ok.reason));
    }
  }
  return accepted;
}

Comparison none_taken(const std::vector<InvarianceRun>& runs, const std::vector<std::string>& skipped) {
  Comparison c;
  c.verdict = Verdict::skip;
  c.reason = runs.empty() || skipped.empty()
                 ? "no other batch holds this case's entries (within the check's budget, its scales in their shape)"
                 : fmt::format("accepts none of the other batches: {}", fmt::join(skipped, "; "));
  return c;
}

}  // namespace

Comparison judge_batch_invariance(const Backend& backend, const CaseData& data, const std::vector<InvarianceRun>& runs,
                                  const RunOptions& options, const std::function<const BackendRun&()>& own_run) {
  std::vector<std::string> ran, skipped;
  const std::vector<const InvarianceRun*> accepted = accepted_runs(backend, runs, Direction::forward, skipped);
  if (accepted.empty()) return none_taken(runs, skipped);
  Comparison c;
  const Problem& p = data.problem;
  const BackendRun& own = own_run();
  const Bounds bounds = relation_bounds(data, own.out, own.lse ? &*own.lse : nullptr);
  const EntryStarts own_starts = entry_starts(data);
  const std::vector<EntryLength> entries = entry_lengths(data);
  Variations variations;
  for (const InvarianceRun* run : accepted) {
    const BackendRun got = run_backend(backend, run->data, options);
    ran.push_back(run->what);
    const EntryStarts starts = entry_starts(run->data);
    for (int64_t e = 0; e < static_cast<int64_t>(run->source.size()); ++e) {
      const int64_t s = run->source[at(e)];
      if (s < 0) continue;
      for (int64_t h = 0; h < p.heads_q; ++h) {
        for (int64_t i = 0; i < entries[at(s)].q_len; ++i) {
          const int64_t mine = row_of(p, own_starts, s, h, i), theirs = row_of(run->data.problem, starts, e, h, i);
          auto where = [&](std::string what) {
            return [&, what] { return fmt::format("{} of entry {}, head {}, row {} in the run '{}'", what, s, h, i, run->what); };
          };
          for (int64_t x = 0; x < p.head_dim_v; ++x) {
            variations.note(own.out[at(mine * p.head_dim_v + x)], got.out[at(theirs * p.head_dim_v + x)],
                            bounds.out[at(mine * p.head_dim_v + x)], where(fmt::format("out[.., {}]", x)));
          }
          if (own.lse && got.lse) variations.note((*own.lse)[at(mine)], (*got.lse)[at(theirs)], bounds.lse[at(mine)], where("lse"));
        }
      }
    }
    if (!got.guard_damage.empty()) c.fail(fmt::format("batch invariance ({}): {}", run->what, got.guard_damage));
    variations.end_run();
  }
  variations.conclude(c, backend, ran, skipped);
  return c;
}

Comparison judge_batch_invariance_backward(const Backend& backend, const CaseData& data,
                                           const std::vector<InvarianceRun>& runs, bool bias_gradient,
                                           const GradientTruth& truth, const RunOptions& options,
                                           const std::function<const BackwardRun&()>& own_run) {
  std::vector<std::string> ran, skipped;
  const std::vector<const InvarianceRun*> accepted = accepted_runs(backend, runs, Direction::backward, skipped);
  if (accepted.empty()) return none_taken(runs, skipped);
  Comparison c;
  const Problem& p = data.problem;
  const BackwardRun& own = own_run();
  const EntryStarts own_starts = entry_starts(data);
  const std::vector<EntryLength> entries = entry_lengths(data);
  const int64_t d = p.head_dim, dv = p.head_dim_v;
  Variations variations;
  for (const InvarianceRun* run : accepted) {
    const Problem& q = run->data.problem;
    const BackwardRun got = run_backward(backend, run->data, run->dout, bias_gradient && q.bias.present, options);
    ran.push_back(run->what);
    const EntryStarts starts = entry_starts(run->data);
    // One row of a gradient: `width` elements from row `mine` of the case's own and row `theirs` of the run's.
    auto compare = [&](const char* name, const std::vector<double>& mine_values, const std::vector<double>& theirs_values,
                       const std::vector<double>& bound, int64_t mine, int64_t theirs, int64_t width, int64_t s,
                       const char* axis, int64_t head, int64_t index) {
      if (mine_values.empty() || theirs_values.empty()) return;
      for (int64_t x = 0; x < width; ++x) {
        const std::size_t m = at(mine * width + x);
        variations.note(mine_values[m], theirs_values[at(theirs * width + x)], 2 * bound[m], [&] {
          return fmt::format("{}[.., {}] of entry {}, head {}, {} {} in the run '{}'", name, x, s, head, axis, index,
                             run->what);
        });
      }
    };
    for (int64_t e = 0; e < static_cast<int64_t>(run->source.size()); ++e) {
      const int64_t s = run->source[at(e)];
      if (s < 0) continue;
      const EntryLength& entry = entries[at(s)];
      for (int64_t h = 0; h < p.heads_q; ++h) {
        for (int64_t i = 0; i < entry.q_len; ++i) {
          compare("dq", own.got.dq, got.got.dq, truth.bound.dq, row_of(p, own_starts, s, h, i), row_of(q, starts, e, h, i),
                  d, s, "row", h, i);
        }
      }
      for (int64_t g = 0; g < p.heads_kv; ++g) {
        for (int64_t j = 0; j < entry.k_len; ++j) {
          const int64_t mine = key_row_of(p, own_starts, s, g, j), theirs = key_row_of(q, starts, e, g, j);
          compare("dk", own.got.dk, got.got.dk, truth.bound.dk, mine, theirs, d, s, "key", g, j);
          compare("dv", own.got.dv, got.got.dv, truth.bound.dv, mine, theirs, dv, s, "key", g, j);
        }
      }
    }
    variations.end_run();
  }
  variations.conclude(c, backend, ran, skipped);
  return c;
}

}  // namespace attn
