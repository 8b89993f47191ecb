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

#include "attnbench/dtype.hpp"
#include "attnbench/problem.hpp"
#include "attnbench/sequences.hpp"
#include "attnbench/tensor.hpp"

namespace attn {

class BackendExtensions;  // in-tree only: framework adapters and recorded results (core/extensions.hpp)

// "Yes", or "no" with a reason a person can act on.
struct Status {
  bool ok = true;
  std::string reason;
  static Status yes() { return {}; }
  static Status no(std::string why) { return {false, std::move(why)}; }
  explicit operator bool() const { return ok; }
};

// Dropout on the attention weights (docs/verification/dropout.md): each
// weight p_ij of a visible (query, key) pair is kept with probability 1 - p
// and multiplied by 1 / (1 - p), or dropped (0). The softmax's denominator,
// and lse, are those without dropout. The same (seed, offset) gives the same
// mask bits, in the forward and in the backward, which must use the mask its
// forward drew (replayed from the seed: nothing is stored between them).
struct DropoutView {
  double p = 0;  // in [0, 1); 0: no dropout (every other field unused)
  std::uint64_t seed = 0, offset = 0;
  // Written by the forward when not nullptr: [batch entries, heads_q,
  // seq_q, seq_k] row-major, kept[e, h, i, j] = 1 where the weight of query
  // i of entry e (its position within the entry) for key j (its position
  // within the entry) was kept and 0 where dropped, for every visible pair;
  // other elements are not read. The backward never gets it.
  std::uint8_t* kept = nullptr;
  bool active() const { return p > 0; }
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
  // Format version 2 (docs/format/v2.md); nullptr when absent. With
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
  // Format version 4 (docs/format/v4.md): for each of q, k and v that the
  // problem quantises (Problem::q_quant ...), its codes and what dequantises
  // them; then the TensorView q, k or v keeps its shape and strides but its
  // data is nullptr. Empty for a tensor in dtype.
  QuantView q_codes, k_codes, v_codes;
  // Dropout, for backends whose capabilities declare it; inactive otherwise.
  DropoutView dropout;
  const QuantView& codes(char tensor) const { return tensor == 'q' ? q_codes : tensor == 'k' ? k_codes : v_codes; }
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

// What a backend declares it implements. Every tool asks this before
// supports(): a problem in another dtype, or using a format version 2 addition
// it does not declare, is SKIP naming what is missing, and `attn list` and the
// documentation's support matrix print this (describe_capabilities), so the
// text a user reads cannot disagree with what runs.
// The metamorphic relations (docs/verification/relations.md), as bits of
// Capabilities::bitwise_relations.
enum Relation : unsigned {
  kRelationVScale = 1u << 0,         // V x 2^k: out x 2^k, lse unchanged
  kRelationQScale = 1u << 1,         // Q x 2^k, scale / 2^k: out and lse unchanged
  kRelationHeadPermutation = 1u << 2,  // kv heads with their query groups permuted: results permuted
  kRelationKeyPermutation = 1u << 3,   // keys and values permuted together (unmasked by position): unchanged
  kRelationScoreShift = 1u << 4,     // + c on every score of a row: out unchanged, lse + c
  kRelationLayout = 1u << 5,         // bhsd and bshd: the same results
  kRelationDoutScale = 1u << 6,      // backward: dO x 2^k, every gradient x 2^k
};
inline constexpr unsigned kAllRelations = 0x7f;
// "v_scale", "q_scale", "head_permutation", "key_permutation", "score_shift",
// "layout", "dout_scale" for one bit; "v_scale, layout" for a set of them.
std::string_view relation_name(unsigned relation);
std::string relation_names(unsigned relations);

struct Capabilities {
  unsigned dtypes = kAllDTypes;  // dtype_bit() of each dtype it computes in
  unsigned features = 0;         // Feature bits: the format version 2 additions
  bool lse = false;              // its plans write lse (Plan::has_lse)
  bool backward = false;         // it implements prepare_backward (format version 3)
  // Its dQ may differ between runs (atomic accumulation): reported, not
  // failed. dK, dV, dbias and dsinks must be bitwise identical between runs
  // and thread counts whatever it declares.
  bool nondeterministic_dq = false;
  // RunOptions::threads changes how it computes. A backend that ignores it
  // (single-threaded code) runs the same at every count: the verifier judges
  // it at the first thread count asked for and says so at the others.
  bool uses_threads = true;
  // Format version 4: encoding_bit() of each quantised encoding it reads
  // (AttentionIO::q_codes, k_codes, v_codes); a case with any other is SKIP.
  unsigned encodings = 0;
  // Each batch entry's results are the same bits whatever else is in the
  // batch (alone, among other entries, packed, paged at other pages): the
  // verifier's batch-invariance check FAILs it on any variation instead of
  // reporting it (docs/verification/invariance.md).
  bool batch_invariant = false;
  // The metamorphic relations (kRelation* bits) whose results it gives bit
  // for bit; the verifier FAILs it when one of them is not, and judges the
  // others within the relation's bound (docs/verification/relations.md).
  unsigned bitwise_relations = 0;
  // It implements AttentionIO::dropout in the forward (and in the backward
  // when it declares `backward`): judged statistically and against the
  // float64 attention under the mask it reports (docs/verification/dropout.md).
  bool dropout = false;
};
// "float32, float16, bfloat16; window, softcap; lse; backward"
std::string describe_capabilities(const Capabilities& capabilities);

// Format version 3 (docs/format/v3.md): the backward pass of
// L = sum(dout * out) for the case's inputs.
struct BackwardIO {
  // The case's inputs exactly as the forward gets them, with `out` (and `lse`
  // when this backend's plans write it, else nullptr) holding this backend's
  // own forward results for them: read-only here.
  AttentionIO forward;
  TensorView dout;                // shape of out, in dtype
  MutableTensorView dq, dk, dv;   // shapes of q, k and v, in dtype; every element written
  MutableTensorView dbias;        // the bias's stored shape [bb, bh, bq, seq_k], summed over its
                                  // broadcast axes; empty when the bias needs no gradient
  double* dsinks = nullptr;       // [heads_q] when the case has sinks (float64, as lse)
};

class BackwardPlan {
 public:
  virtual ~BackwardPlan() = default;
  virtual void run() = 0;  // computes every gradient of BackwardIO; the timed part
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual std::string_view description() const = 0;
  virtual Capabilities capabilities() const = 0;
  // Whether the backend can run on this machine at all (e.g. "no CUDA device").
  virtual Status available() const { return Status::yes(); }
  // Whether it handles this problem, which is within capabilities(); no side
  // effects. The reason names what is missing, e.g. "head_dim above 256".
  virtual Status supports(const Problem& problem) const = 0;
  virtual std::unique_ptr<Plan> prepare(const Problem& problem, const AttentionIO& io,
                                        const RunOptions& options) const = 0;
  // Whether it runs the backward pass of this problem, which supports()
  // accepts and whose backward the format defines (backward_defined); asked
  // before anything runs, no side effects. Only asked of a backend whose
  // capabilities() declare `backward`; the default: every such problem.
  virtual Status supports_backward(const Problem& problem) const;
  // The backward pass, for a problem supports_backward accepts; the default
  // throws attn::Unsupported.
  virtual std::unique_ptr<BackwardPlan> prepare_backward(const Problem& problem, const BackwardIO& io,
                                                         const RunOptions& options) const;
  // (optional, in-tree only) What framework adapters and recorded results add:
  // declared conventions, a layer of their own, results read from files. A
  // backend written against this SDK leaves it null.
  virtual const BackendExtensions* extensions() const { return nullptr; }
};

// Which pass of a problem a tool asks for: the forward (out, lse) or the
// backward (format version 3's gradients of sum(dout * out)).
enum class Direction { forward, backward };
inline std::string_view direction_name(Direction direction) {
  return direction == Direction::forward ? "forward" : "backward";
}

// Whether the format defines a backward pass for the problem at all: it
// defines none through a page table (docs/format/v3.md). The one place that
// says so.
Status backward_defined(const Problem& problem);

// What every tool asks before it runs a backend on a problem: capabilities()
// first, then supports(); for the backward, then backward_defined(), the
// declared `backward` and supports_backward(). The first "no" is the reason.
Status backend_accepts(const Backend& backend, const Problem& problem, Direction direction = Direction::forward);

}  // namespace attn
