#include "attnbench/per_entry.hpp"

#include "attnbench/error.hpp"
#include "attnbench/value_range.hpp"

#include <algorithm>
#include <limits>
#include <vector>

namespace attn {

Problem entry_problem(const Problem& packed, std::int64_t q_len, std::int64_t k_len) {
  Problem p = packed;
  p.ragged = false;
  p.batch = 1;
  p.seq_q = q_len;
  p.seq_k = k_len;
  return p;
}

namespace {

// What an entry's plan holds beyond its workspace (the plan, its problem and
// views, the allocator's share), as measured: 2^22 entries of one query
// each held 3.7 GB at their peak in streaming when 1 KB was counted.
constexpr double kEntryBytes = 4096.0;

template <typename Ptr> BasicTensorView<Ptr> rows_of(const BasicTensorView<Ptr>& view, std::int64_t first, std::int64_t count) {
  BasicTensorView<Ptr> sub = view;
  using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<Ptr>>, const char, char>;
  // A quantised tensor's view has no data (its codes are in a QuantView).
  if (view.data) sub.data = static_cast<Byte*>(view.data) + first * view.strides[2] * static_cast<std::int64_t>(dtype_size(view.dtype));
  sub.shape[2] = count;
  return sub;
}

// Format version 4: the rows of one entry's codes, their scales, and the
// entry's descales (at index 0 of the entry's problem).
QuantView codes_of(const QuantView& codes, std::int64_t first, std::int64_t entry) {
  if (codes.empty()) return codes;
  QuantView sub = codes;
  sub.codes += first * codes.strides[2];
  if (sub.scale) sub.scale += first * codes.scale_strides[2];
  if (sub.zero_point) sub.zero_point += first * codes.scale_strides[2];
  if (sub.descale) sub.descale += entry * codes.descale_batch_stride;
  return sub;
}

class PerEntryPlan final : public Plan {
 public:
  PerEntryPlan(const Problem& p, const AttentionIO& io, const RunOptions& options, const Backend& dense)
      : p_(p), io_(io), options_(options), dense_(dense) {
    has_lse_ = dense.capabilities().lse;
    // Entries are prepared here (not timed) until their plans hold a quarter
    // of what a case may use; the rest, if any, are prepared one at a time as
    // they run, so a batch of millions of entries takes the memory of one.
    const double budget = std::min(case_memory_limit_bytes(), address_space_left()) / 4;
    double held = 0;
    for (std::int64_t e = 0; e < p.batch; ++e) {
      if (io.cu_seqlens_q[e + 1] == io.cu_seqlens_q[e]) continue;  // nothing to compute; its keys are nobody's
      if (held > budget) {
        lazy_from_ = e;
        break;
      }
      Entry entry = make_entry(e);
      held += static_cast<double>(entry.plan->workspace_bytes() + entry.lse.size() * sizeof(double)) + kEntryBytes;
      has_lse_ = has_lse_ && entry.plan->has_lse();
      entries_.push_back(std::move(entry));
    }
  }

  void run() override {
    for (Entry& e : entries_) e.plan->run();
    for (std::int64_t e = lazy_from_; e < p_.batch; ++e) {
      if (io_.cu_seqlens_q[e + 1] == io_.cu_seqlens_q[e]) continue;
      Entry entry = make_entry(e);
      entry.plan->run();
      entry.plan->read_output();
      copy_lse(entry);
    }
    finish(false);
  }

  void read_output() override { finish(true); }

  bool has_lse() const override { return has_lse_; }
  std::size_t workspace_bytes() const override {
    std::size_t bytes = 0;
    for (const Entry& e : entries_) bytes += e.plan->workspace_bytes() + e.lse.size() * sizeof(double);
    return bytes;
  }

 private:
  struct Entry {
    Problem problem;
    std::int64_t q0 = 0;
    std::vector<double> lse;
    std::unique_ptr<Plan> plan;
  };

  Entry make_entry(std::int64_t e) const {
    const std::int64_t q0 = io_.cu_seqlens_q[e], q_len = io_.cu_seqlens_q[e + 1] - q0;
    const std::int64_t k0 = io_.cu_seqlens_k[e], k_len = io_.cu_seqlens_k[e + 1] - k0;
    Entry entry;
    entry.problem = entry_problem(p_, q_len, k_len);
    entry.q0 = q0;
    entry.lse.assign(static_cast<std::size_t>(p_.heads_q * q_len), 0.0);
    AttentionIO sub = io_;
    sub.q = rows_of(io_.q, q0, q_len);
    sub.k = rows_of(io_.k, k0, k_len);
    sub.v = rows_of(io_.v, k0, k_len);
    sub.out = rows_of(io_.out, q0, q_len);
    sub.q_codes = codes_of(io_.q_codes, q0, e);
    sub.k_codes = codes_of(io_.k_codes, k0, e);
    sub.v_codes = codes_of(io_.v_codes, k0, e);
    sub.cu_seqlens_q = sub.cu_seqlens_k = nullptr;
    sub.lse = io_.lse ? entry.lse.data() : nullptr;
    entry.plan = dense_.prepare(entry.problem, sub, options_);
    return entry;
  }

  void copy_lse(const Entry& e) {
    if (!io_.lse) return;
    for (std::int64_t h = 0; h < p_.heads_q; ++h)
      for (std::int64_t i = 0; i < e.problem.seq_q; ++i) {
        io_.lse[h * p_.seq_q + e.q0 + i] = e.lse[static_cast<std::size_t>(h * e.problem.seq_q + i)];
      }
  }

  // The prepared entries' lse into the packed rows, and the rows past the
  // last sequence; after the sub-plans' read_output when `read` is set.
  void finish(bool read) {
    for (Entry& e : entries_) {
      if (read) e.plan->read_output();
      copy_lse(e);
    }
    // Rows past the last sequence belong to none: no key, out 0.
    const std::int64_t used = io_.cu_seqlens_q[p_.batch];
    for (std::int64_t h = 0; h < p_.heads_q; ++h)
      for (std::int64_t i = used; i < p_.seq_q; ++i) {
        for (std::int64_t d = 0; d < p_.head_dim_v; ++d) store_float(io_.out, io_.out.offset(0, h, i, d), 0.0f);
        if (io_.lse) io_.lse[h * p_.seq_q + i] = io_.sinks ? io_.sinks[h] : -std::numeric_limits<double>::infinity();
      }
  }

  Problem p_;
  AttentionIO io_;
  RunOptions options_;
  const Backend& dense_;
  std::vector<Entry> entries_;
  std::int64_t lazy_from_ = std::numeric_limits<std::int64_t>::max();  // entries from here run unprepared
  bool has_lse_ = true;
};

// The backward pass entry by entry: each a dense backward on views into the
// packed tensors, with its rows of lse copied out; dsinks summed over the
// entries in their order. Whatever no entry owns gets zero gradients: query
// rows past the last sequence, and the keys of entries without queries or
// past the last one.
class PerEntryBackwardPlan final : public BackwardPlan {
 public:
  PerEntryBackwardPlan(const Problem& p, const BackwardIO& io, const RunOptions& options, const Backend& dense)
      : p_(p), io_(io), options_(options), dense_(dense) {
    const double budget = std::min(case_memory_limit_bytes(), address_space_left()) / 4;
    double held = 0;
    for (std::int64_t e = 0; e < p.batch; ++e) {
      if (io.forward.cu_seqlens_q[e + 1] == io.forward.cu_seqlens_q[e]) continue;
      if (held > budget) {
        lazy_from_ = e;
        break;
      }
      entries_.push_back(make_entry(e));
      // What a dense backward holds is not declared: count what its views imply.
      const Entry& entry = entries_.back();
      held += 16.0 * static_cast<double>(entry.problem.q_elements() + entry.problem.k_elements()) + kEntryBytes;
    }
  }

  void run() override {
    const AttentionIO& f = io_.forward;
    zero_rows(io_.dq, f.cu_seqlens_q[p_.batch], p_.seq_q, p_.head_dim);
    for (std::int64_t e = 0; e < p_.batch; ++e) {
      if (f.cu_seqlens_q[e + 1] == f.cu_seqlens_q[e]) {
        zero_rows(io_.dk, f.cu_seqlens_k[e], f.cu_seqlens_k[e + 1], p_.head_dim);
        zero_rows(io_.dv, f.cu_seqlens_k[e], f.cu_seqlens_k[e + 1], p_.head_dim_v);
      }
    }
    zero_rows(io_.dk, f.cu_seqlens_k[p_.batch], p_.seq_k, p_.head_dim);
    zero_rows(io_.dv, f.cu_seqlens_k[p_.batch], p_.seq_k, p_.head_dim_v);
    if (io_.dsinks) std::fill_n(io_.dsinks, p_.heads_q, 0.0);
    for (Entry& e : entries_) run_entry(e);
    for (std::int64_t e = lazy_from_; e < p_.batch; ++e) {
      if (f.cu_seqlens_q[e + 1] == f.cu_seqlens_q[e]) continue;
      Entry entry = make_entry(e);
      run_entry(entry);
    }
  }

 private:
  struct Entry {
    Problem problem;
    std::int64_t q0 = 0;
    std::vector<double> lse, dsinks;
    std::unique_ptr<BackwardPlan> plan;
  };

  Entry make_entry(std::int64_t e) const {
    const AttentionIO& f = io_.forward;
    const std::int64_t q0 = f.cu_seqlens_q[e], q_len = f.cu_seqlens_q[e + 1] - q0;
    const std::int64_t k0 = f.cu_seqlens_k[e], k_len = f.cu_seqlens_k[e + 1] - k0;
    Entry entry;
    entry.problem = entry_problem(p_, q_len, k_len);
    entry.q0 = q0;
    entry.lse.assign(static_cast<std::size_t>(p_.heads_q * q_len), 0.0);
    entry.dsinks.assign(io_.dsinks ? static_cast<std::size_t>(p_.heads_q) : 0, 0.0);
    BackwardIO sub = io_;
    sub.forward.q = rows_of(f.q, q0, q_len);
    sub.forward.k = rows_of(f.k, k0, k_len);
    sub.forward.v = rows_of(f.v, k0, k_len);
    sub.forward.out = rows_of(f.out, q0, q_len);
    sub.forward.cu_seqlens_q = sub.forward.cu_seqlens_k = nullptr;
    sub.forward.lse = f.lse ? entry.lse.data() : nullptr;
    sub.dout = rows_of(io_.dout, q0, q_len);
    sub.dq = rows_of(io_.dq, q0, q_len);
    sub.dk = rows_of(io_.dk, k0, k_len);
    sub.dv = rows_of(io_.dv, k0, k_len);
    sub.dsinks = io_.dsinks ? entry.dsinks.data() : nullptr;
    entry.plan = dense_.prepare_backward(entry.problem, sub, options_);
    return entry;
  }

  void run_entry(Entry& e) {
    if (io_.forward.lse) {
      for (std::int64_t h = 0; h < p_.heads_q; ++h)
        for (std::int64_t i = 0; i < e.problem.seq_q; ++i) {
          e.lse[static_cast<std::size_t>(h * e.problem.seq_q + i)] = io_.forward.lse[h * p_.seq_q + e.q0 + i];
        }
    }
    e.plan->run();
    if (io_.dsinks) {
      for (std::int64_t h = 0; h < p_.heads_q; ++h) io_.dsinks[h] += e.dsinks[static_cast<std::size_t>(h)];
    }
  }

  void zero_rows(const MutableTensorView& view, std::int64_t from, std::int64_t to, std::int64_t width) {
    for (std::int64_t h = 0; h < view.shape[1]; ++h)
      for (std::int64_t s = from; s < to; ++s)
        for (std::int64_t d = 0; d < width; ++d) store_float(view, view.offset(0, h, s, d), 0.0f);
  }

  Problem p_;
  BackwardIO io_;
  RunOptions options_;
  const Backend& dense_;
  std::vector<Entry> entries_;
  std::int64_t lazy_from_ = std::numeric_limits<std::int64_t>::max();
};

}  // namespace

namespace {

// An entry's dense problem draws its dropout mask at its own coordinates, not
// the packed batch's (attnbench/dropout.hpp): refused rather than drawn wrong.
void refuse_dropout(const AttentionIO& io) {
  if (io.dropout.active()) {
    throw Unsupported("dropout on packed sequences is not implemented here: they run entry by entry (plan_per_entry), "
                      "each at its own mask coordinates");
  }
}

}  // namespace

std::unique_ptr<BackwardPlan> plan_backward_per_entry(const Problem& problem, const BackwardIO& io,
                                                      const RunOptions& options, const Backend& dense) {
  refuse_dropout(io.forward);
  return std::make_unique<PerEntryBackwardPlan>(problem, io, options, dense);
}

std::unique_ptr<Plan> plan_per_entry(const Problem& problem, const AttentionIO& io, const RunOptions& options,
                                     const Backend& dense) {
  refuse_dropout(io);
  return std::make_unique<PerEntryPlan>(problem, io, options, dense);
}

}  // namespace attn
