// Randomised differential testing: random attention problems from the
// portable RNG (the same seed draws the same cases on every machine), each
// judged exactly as `attn verify` judges a fixture, and every failure shrunk
// to a smallest case that still fails and written as a standard fixture.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnbench/backend.hpp"
#include "fixtures/suite.hpp"
#include "verify/verifier.hpp"

namespace attn {

// One drawn case: the problem and recipe of its inputs (the standard suite's
// generator, seeded by spec.name), and the run configuration it is judged in.
struct FuzzCase {
  CaseSpec spec;
  bool default_scale = true;  // scale is 1/sqrt(head_dim), also after head_dim shrinks
  int threads = 1;
  Layout layout = Layout::bhsd;
  std::string describe() const;  // problem, recipe and configuration in one line
  bool layer() const { return spec.model_dim > 0; }  // a whole layer (kind = mha) around the attention
  // The thread counts it is judged at: its own, and for an attention case
  // with gradients at more than one thread, 1 besides (the gradients must
  // keep their bits whatever the thread count; the checks without a golden
  // run at the first).
  std::vector<int> thread_counts() const;
};

// Case `index` of `seed`: depends on nothing else. One case in 16 is a whole
// layer (kind = mha), from a stream of its own.
FuzzCase draw_fuzz_case(std::uint64_t seed, std::int64_t index);
// Case `index` of `seed` drawn as a layer, whatever that stream says (attn
// fuzz --layers): the layer case draw_fuzz_case gives where it gives one.
FuzzCase draw_layer_fuzz_case(std::uint64_t seed, std::int64_t index);

// The inputs of an attention case (values clamped into the dtype's finite
// range) and the float64 reference as its golden. (A layer case's fixture is
// generate_layer_fixture(c.spec).)
Fixture fuzz_fixture(const FuzzCase& c);

// Every case one step simpler than c: each size lowered toward its minimum
// (to it, by halves of the distance, and by one), one feature dropped (mask,
// bias, kv_len, causal, special values) or a broadcast axis collapsed, fewer
// threads, the canonical layout. Shrinking stops when none of these fails, so
// a shrunk case has no size larger than its failure needs.
std::vector<FuzzCase> simpler_fuzz_cases(const FuzzCase& c);

// Whether `backend` fails case c (FAIL under verify's checks; SKIP is not a
// failure), and in which check ("" the golden comparison, "batch
// invariance", "relation NAME"). With `only`, only that check's failures
// count and the golden-free checks of other kinds are not run (a shrink keeps
// the failure it started from, at the cost of that check alone).
struct FuzzJudgement {
  bool failed = false;
  std::string reason;
  std::string check;
};
FuzzJudgement judge_fuzz_case(const Backend& backend, const FuzzCase& c, const std::string* only = nullptr);

struct ShrinkResult {
  FuzzCase smallest;
  std::string reason;      // why the smallest case fails
  int steps = 0;           // simplifications accepted
  int evaluations = 0;     // cases judged
  bool minimal = false;    // stopped because nothing simpler fails (not for lack of budget)
};
ShrinkResult shrink_fuzz_case(const Backend& backend, const FuzzCase& failing, std::string reason,
                              int max_evaluations = 400, const std::string& check = "");

struct FuzzOptions {
  std::uint64_t seed = 1;
  std::int64_t cases = 200;
  double minutes = 0;  // > 0: stop drawing once this much time has passed
  std::filesystem::path out_dir = "fuzz-failures";
  int max_shrink_evaluations = 600;
  bool layers_only = false;  // draw_layer_fuzz_case instead of draw_fuzz_case
};

struct FuzzFailure {
  std::string backend;
  std::int64_t index = 0;  // the case that first failed
  FuzzCase found;
  std::string check;  // the check that failed ("" the golden comparison)
  ShrinkResult shrunk;
  std::filesystem::path file;  // the shrunk case as a fixture
};

struct FuzzSummary {
  std::int64_t cases = 0;  // drawn and judged
  std::vector<FuzzFailure> failures;
  std::vector<std::string> backends;
  std::vector<std::int64_t> passed, skipped;  // per backend
};

// Draws cases 0, 1, ... and judges every backend that has not failed yet; a
// backend's first failure is shrunk and written to options.out_dir. `progress`
// gets a line for each failure and one every so often.
FuzzSummary run_fuzz(const std::vector<std::unique_ptr<Backend>>& backends, const FuzzOptions& options,
                     const std::function<void(const std::string&)>& progress = {});

}  // namespace attn
