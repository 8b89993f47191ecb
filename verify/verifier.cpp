#include "verify/verifier.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "core/error.hpp"
#include "fixtures/fixture.hpp"
#include "fixtures/layer.hpp"
#include "reference/layer.hpp"
#include "verify/layer.hpp"
#include "reference/reference.hpp"
#include "verify/run_case.hpp"
#include "verify/tolerance.hpp"

namespace attn {

int VerifySummary::failed() const {
  return static_cast<int>(std::count_if(outcomes.begin(), outcomes.end(),
                                        [](const CaseOutcome& o) { return o.comparison.verdict == Verdict::fail; }));
}

namespace {

bool wanted(const FixtureHeader& header, const std::vector<std::string>& tags) {
  if (tags.empty()) return true;
  return std::any_of(tags.begin(), tags.end(), [&](const std::string& t) { return header.has_tag(t); });
}

Comparison run_one(const Backend& backend, const Fixture& fixture, const ReferenceStats& stats, const Bounds& bounds,
                   const std::vector<double>& golden_lse, const RunOptions& options) {
  try {
    BackendRun run = run_backend(backend, fixture.data, options);
    const std::vector<double>* lse = run.lse ? &*run.lse : nullptr;
    Comparison c = compare_output({fixture.problem(), fixture.out, golden_lse, bounds, stats.visible, run.out, lse});
    if (!run.guard_damage.empty()) {
      c.verdict = Verdict::fail;
      c.reason = run.guard_damage;
    }
    return c;
  } catch (const std::exception& e) {
    Comparison c;
    c.verdict = Verdict::fail;
    c.reason = fmt::format("backend threw: {}", e.what());
    return c;
  }
}

// A layer case: y is compared as a one-head [batch, 1, seq_q, model_dim] tensor.
void verify_layer(const std::filesystem::path& file, const std::vector<std::unique_ptr<Backend>>& backends,
                  const VerifyOptions& options, const OutcomeCallback& on_outcome, VerifySummary& summary) {
  LayerFixture fixture = read_layer_fixture(file);
  if (options.layout) fixture.data.problem.layout = *options.layout;
  const Problem& problem = fixture.data.problem;
  std::vector<Status> support;
  for (const auto& backend : backends) {
    Status s = backend->available();
    support.push_back(s ? backend->supports(problem) : s);
  }
  Problem shape = Problem::parse(fmt::format("dtype=f64,b={},hq=1,hkv=1,sq={},sk=1,d=1,dv={}", problem.batch,
                                             problem.seq_q, fixture.header.model_dim));
  Bounds bounds;
  std::vector<std::int64_t> every_row(static_cast<std::size_t>(problem.batch * problem.seq_q), 1);
  std::vector<double> no_lse;
  if (std::any_of(support.begin(), support.end(), [](const Status& s) { return s.ok; })) {
    LayerReference reference = reference_layer(fixture.data);
    bounds.out = derive_layer_bounds(fixture.header, fixture.data, reference);
    bounds.from_fixture = fixture.header.atol || fixture.header.rtol;
  }
  for (std::size_t b = 0; b < backends.size(); ++b) {
    CaseOutcome outcome{std::string(backends[b]->name()), file, fixture.header.name,
                        fmt::format("{},model={}", problem.to_string(), fixture.header.model_dim), {}, 0};
    if (!support[b].ok) {
      outcome.comparison.verdict = Verdict::skip;
      outcome.comparison.reason = support[b].reason;
    } else {
      auto start = std::chrono::steady_clock::now();
      try {
        LayerRun run = run_layer(*backends[b], fixture.data, options.run);
        outcome.comparison = compare_output({shape, fixture.y, no_lse, bounds, every_row, run.y, nullptr});
        if (!run.guard_damage.empty()) {
          outcome.comparison.verdict = Verdict::fail;
          outcome.comparison.reason = run.guard_damage;
        }
      } catch (const std::exception& e) {
        outcome.comparison.verdict = Verdict::fail;
        outcome.comparison.reason = fmt::format("backend threw: {}", e.what());
      }
      outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    if (on_outcome) on_outcome(outcome);
    summary.outcomes.push_back(std::move(outcome));
  }
}

}  // namespace

VerifySummary verify(const std::vector<std::filesystem::path>& files,
                     const std::vector<std::unique_ptr<Backend>>& backends, const VerifyOptions& options,
                     const OutcomeCallback& on_outcome) {
  VerifySummary summary;
  for (const auto& file : files) {
    Fixture fixture;
    try {
      FixtureHeader header = read_fixture_header(file);
      if (!wanted(header, options.tags)) continue;
      if (header.kind == FixtureKind::mha) {
        verify_layer(file, backends, options, on_outcome, summary);
        continue;
      }
      fixture = read_fixture(file);
    } catch (const Error& e) {
      summary.input_errors.push_back(e.what());
      continue;
    }
    if (options.layout) fixture.data.problem.layout = *options.layout;
    const Problem& problem = fixture.problem();

    // Decide support first: the reference is only computed when someone runs.
    std::vector<Status> support;
    for (const auto& backend : backends) {
      Status s = backend->available();
      support.push_back(s ? backend->supports(problem) : s);
    }
    ReferenceStats stats;
    Bounds bounds;
    std::vector<double> golden_lse;
    if (std::any_of(support.begin(), support.end(), [](const Status& s) { return s.ok; })) {
      ReferenceResult reference = reference_attention(fixture.data, &stats, options.run.threads);
      golden_lse = fixture.lse ? *fixture.lse : reference.lse;
      bounds = derive_bounds(fixture.header, fixture.out, golden_lse, stats);
    }
    for (std::size_t b = 0; b < backends.size(); ++b) {
      CaseOutcome outcome{std::string(backends[b]->name()), file, fixture.header.name, problem.to_string(), {}, 0};
      if (!support[b].ok) {
        outcome.comparison.verdict = Verdict::skip;
        outcome.comparison.reason = support[b].reason;
      } else {
        auto start = std::chrono::steady_clock::now();
        outcome.comparison = run_one(*backends[b], fixture, stats, bounds, golden_lse, options.run);
        outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      if (on_outcome) on_outcome(outcome);
      summary.outcomes.push_back(std::move(outcome));
    }
  }
  return summary;
}

}  // namespace attn
