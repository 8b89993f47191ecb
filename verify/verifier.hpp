// Cross-checks backends against golden fixtures: for each fixture, computes
// the bounds once (from the float64 reference's statistics), runs every
// backend that supports the case and compares.
#pragma once

#include "core/shard.hpp"

#include <filesystem>
#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "attnbench/backend.hpp"
#include "fixtures/fixture.hpp"
#include "fixtures/layer.hpp"
#include "verify/compare.hpp"
#include "verify/quantised.hpp"

namespace attn {

struct VerifyOptions {
  std::vector<std::string> tags;  // keep fixtures carrying any of these (all when empty)
  RunOptions run;
  std::optional<Layout> layout;   // feed backends this layout instead of the canonical one
  // Every backend runs each case under every (threads, layout) pair of these
  // lists, so paths that depend on the thread count (split-K with several
  // chunks) and on strides run whatever the host. Empty: `run.threads` and
  // `layout` alone.
  std::vector<int> thread_counts;
  std::vector<Layout> layouts;
  // Run only this shard's (fixture, backend) units (core/shard.hpp).
  std::optional<Shard> shard;
  // Which directions to judge (attn verify --direction): forward (out, lse,
  // y) and backward (the gradients of version 3 cases). The golden files are
  // checked either way.
  bool forward = true, backward = true;
  // The checks that need no golden, each a row of its own per backend at the
  // first run configuration: batch invariance (verify/invariance.hpp), each
  // case's entries run again in other batches, and the metamorphic relations
  // (verify/relations.hpp), the case transformed. A run whose q, k or v
  // exceeds `check_budget` elements is left out (0: no limit). Off unless
  // asked for: attn verify and the fuzzer turn them on, a caller that judges
  // only the golden comparison (the Python package's check) leaves them off.
  bool invariance = false, relations = false;
  unsigned forward_relations = kAllRelations;   // those judged on the forward (the fuzzer: two a case)
  unsigned backward_relations = kAllRelations;  // those judged on the backward too (the fuzzer: one a case)
  bool backward_invariance = true;              // batch invariance of the gradients too (the fuzzer: some cases)
  std::int64_t check_budget = std::int64_t{1} << 22;
  // Cases with dropout_p: their "dropout" rows (verify/dropout.hpp).
  bool dropout = true;
};

// One (threads, layout) pair of a run.
struct RunConfig {
  int threads = 0;               // 0: the backend's default
  std::optional<Layout> layout;  // empty: the fixture's own (bhsd)
  std::string label() const;     // "" for the default, else e.g. "t8/bshd"
  std::string arguments() const; // the attn verify options that select it, e.g. " --threads 8 --layout bshd"
};
std::vector<RunConfig> run_configs(const VerifyOptions& options);

struct CaseOutcome {
  std::string backend;
  std::filesystem::path file;
  std::string fixture;  // the fixture's name
  std::string problem;  // canonical problem string
  Comparison comparison;
  double seconds = 0;
  std::string warning;  // about the fixture (e.g. a loose tolerance of its own); empty when none
  RunConfig config;     // the threads and layout it ran with
  std::string arguments;  // more attn verify options that select the backend again (recorded outputs: --outputs DIR)
  Direction direction = Direction::forward;  // backward: the gradients of a version 3 case
  // Which check the row is: empty for the comparison with the golden, else a
  // check of its own that needs none ("batch invariance"), never mixed into it.
  std::string check;
  // Format version 4 with original values: the quantisation's own error
  // (reported beside the verdict, never in it).
  std::optional<QuantisationError> quantisation;
};

// A fixture that could not be judged (unreadable, hostile, or a golden that is
// not the attention of its own inputs): its file ("" when the error concerns
// no single file, such as tags that select nothing) and the message.
struct InputErrorRecord {
  std::string file;
  std::string message;
  bool operator==(const InputErrorRecord&) const = default;
};

struct VerifySummary {
  std::vector<CaseOutcome> outcomes;
  std::vector<InputErrorRecord> input_errors;
  std::vector<std::string> warnings;      // fixtures that were run but deserve a look
  // Sharded runs: which shard, the fingerprint of every unit of the suite
  // (the same in every shard), and how many units the suite and this shard have.
  std::optional<Shard> shard;
  std::string suite;
  std::size_t units = 0, units_run = 0;
  int failed() const;
};

using OutcomeCallback = std::function<void(const CaseOutcome&)>;

VerifySummary verify(const std::vector<std::filesystem::path>& files,
                     const std::vector<std::unique_ptr<Backend>>& backends, const VerifyOptions& options,
                     const OutcomeCallback& on_outcome = {});

// One attention fixture already in memory, judged exactly as `verify` judges a
// file (every check, every run configuration). With trusted_golden the
// fixture's out and lse are not checked against the reference (a caller that
// has no golden, such as the fuzzer, passes an empty out).
VerifySummary verify_fixture(const Fixture& fixture, const std::vector<const Backend*>& backends,
                             const VerifyOptions& options, bool trusted_golden = false,
                             const OutcomeCallback& on_outcome = {});

// One layer fixture (kind = mha) already in memory, judged as `verify`
// judges its file: y and, where it has them, the layer's gradients (its
// golden checked against the reference, as a file's is).
VerifySummary verify_layer_fixture(const LayerFixture& fixture, const std::vector<const Backend*>& backends,
                                   const VerifyOptions& options, const OutcomeCallback& on_outcome = {});

// Problems given on the command line (attn verify --problem): inputs drawn
// by the standard suite's generator (seeded by the problem's text), no
// golden, only the checks that need none (batch invariance and the forward
// relations) for every backend; a problem no backend runs is SKIP.
VerifySummary verify_problems(const std::vector<Problem>& problems, const std::vector<std::unique_ptr<Backend>>& backends,
                              const VerifyOptions& options, const OutcomeCallback& on_outcome = {});

}  // namespace attn
