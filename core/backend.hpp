// The one interface every attention backend implements.
//
// A backend answers `supports(problem)` without side effects, then
// `prepare(problem, io, options)` does everything that must not be timed
// (allocation, packing, upload) and returns a Plan whose `run()` is the only
// thing a benchmark times. `read_output()` makes the results visible in the
// host buffers named in `io` (a no-op for CPU backends that write them in
// `run`; a download for device backends).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/problem.hpp"
#include "core/sequences.hpp"
#include "core/tensor.hpp"

namespace attn {

struct LayerData;  // core/layer_data.hpp

// "Yes", or "no" with a reason a person can act on.
struct Status {
  bool ok = true;
  std::string reason;
  static Status yes() { return {}; }
  static Status no(std::string why) { return {false, std::move(why)}; }
  explicit operator bool() const { return ok; }
};

// Inputs and outputs of one call, all in the problem's dtype except where said.
// Views are logical [batch, heads, seq, dim]; their strides follow
// `problem.layout` but a backend must honour whatever strides it is given.
struct AttentionIO {
  TensorView q;  // [batch, heads_q,  seq_q, head_dim]
  TensorView k;  // [batch, heads_kv, seq_k, head_dim]
  TensorView v;  // [batch, heads_kv, seq_k, head_dim_v]
  // Non-zero = attend; seen as [batch, heads_q, seq_q, seq_k] with stride 0 on
  // broadcast axes. data == nullptr when the problem has no mask.
  MaskView mask;
  // Same broadcast convention, in dtype; -inf hides the key. Empty when absent.
  TensorView bias;
  const std::int64_t* kv_len = nullptr;  // [batch], or nullptr
  MutableTensorView out;                 // [batch, heads_q, seq_q, head_dim_v]
  // Format version 2 (docs/fixture-format-v2.md); nullptr when absent. With
  // problem.ragged, q and out are [1, heads_q, seq_q, .] and k, v [1,
  // heads_kv, seq_k, .] holding the packed sequences; when paged, k and v are
  // [num_pages, heads_kv, page_size, .]. sequences() says where everything is.
  const float* alibi_slopes = nullptr;         // [heads_q]
  const float* sinks = nullptr;                // [heads_q], natural-log units like the scores
  const std::int64_t* cu_seqlens_q = nullptr;  // [batch + 1]
  const std::int64_t* cu_seqlens_k = nullptr;  // [batch + 1]
  const std::int64_t* page_table = nullptr;    // [batch, seq_k / page_size]
  const std::int64_t* seq_lens = nullptr;      // [batch]
  SequenceMap sequences(const Problem& p) const {
    return {&p, kv_len, cu_seqlens_q, cu_seqlens_k, page_table, seq_lens};
  }
  // Natural-log sum of exp of the visible scores (and of the sink) per row,
  // [batch, heads_q, seq_q] contiguous ([1, heads_q, seq_q] when ragged), -inf
  // for rows with no visible key (the sink when there is one). nullptr when the caller does
  // not want it; only written by backends whose Plan::has_lse() is true.
  double* lse = nullptr;
};

// A documented convention of a backend's framework that differs from the
// fixture format on rows with no visible key (where frameworks disagree most).
// The verifier models it: such rows must follow it exactly, everything else is
// judged as usual, and the verdict is DIFFERS (with `why`) instead of FAIL.
enum class ConventionKind : std::uint8_t {
  empty_rows_mean_v,    // the mean of V over all seq_k keys (a -1e9 fill: every score equal)
  empty_rows_nan,       // NaN (softmax of a row of -inf)
  empty_rows_unmasked,  // the attention of the row with nothing hidden (s - 1e9 exact in float64)
};
std::string_view convention_name(ConventionKind kind);
struct Convention {
  ConventionKind kind;
  std::string why;  // what the framework does, e.g. "masked_fill(mask == 0, -1e9)"
};

struct RunOptions {
  int threads = 0;  // 0: the backend's default (OMP_NUM_THREADS or all cores)
};

class Plan {
 public:
  virtual ~Plan() = default;
  virtual void run() = 0;
  // run(), timed: wall-clock seconds by default; device backends override it
  // with their own clock (CUDA events), so benchmarks time the kernels.
  virtual double run_timed();
  virtual void read_output() {}
  virtual bool has_lse() const { return false; }
  // Bytes this plan holds beyond the inputs and outputs (scratch, packed copies).
  virtual std::size_t workspace_bytes() const { return 0; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual std::string_view description() const = 0;
  // Whether the backend can run on this machine at all (e.g. "no CUDA device").
  virtual Status available() const { return Status::yes(); }
  // Whether it handles this problem; no side effects.
  virtual Status supports(const Problem& problem) const = 0;
  // One line summarising what `supports` accepts, for `attn list`.
  virtual std::string_view capabilities() const = 0;
  // The format version 2 additions (Feature bits) this backend implements.
  // A problem using any other is SKIP before supports() is asked, so a
  // backend written before version 2 (a plugin of ABI 1 too) never sees one.
  virtual unsigned features() const { return 0; }
  // Conventions of this backend's framework that differ from the format on
  // this problem (see Convention); none for a backend that follows the format.
  virtual std::vector<Convention> conventions(const Problem& /*problem*/) const { return {}; }
  virtual std::unique_ptr<Plan> prepare(const Problem& problem, const AttentionIO& io,
                                        const RunOptions& options) const = 0;

  // Whole layers (fixtures of kind mha). A backend whose framework has its own
  // layer (torch.nn.MultiheadAttention, Keras MultiHeadAttention) answers true
  // and implements the two below; otherwise the verifier computes the
  // projections itself and calls the backend's attention (verify/layer.hpp).
  virtual bool runs_layers() const { return false; }
  virtual Status supports_layer(const Problem& problem, std::int64_t model_dim) const;
  // y [batch, seq_q, model_dim], widened to float64. Not timed.
  virtual std::vector<double> run_layer(const LayerData& layer, const RunOptions& options) const;
};

// features() first, then supports(): what every tool asks before it runs a
// backend on a problem.
Status backend_accepts(const Backend& backend, const Problem& problem);

}  // namespace attn
