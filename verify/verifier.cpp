#include "verify/verifier.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>

#include "attnbench/error.hpp"
#include "core/extensions.hpp"
#include "core/sandbox.hpp"
#include "core/shard.hpp"
#include "core/text.hpp"
#include "fixtures/fixture.hpp"
#include "fixtures/layer.hpp"
#include "reference/layer.hpp"
#include "verify/backward.hpp"
#include "verify/baseline.hpp"
#include "verify/layer.hpp"
#include "reference/reference.hpp"
#include "verify/recorded.hpp"
#include "verify/run_case.hpp"
#include "verify/tolerance.hpp"

namespace attn {

std::string RunConfig::label() const {
  if (threads == 0 && !layout) return {};
  std::string text = threads > 0 ? fmt::format("t{}", threads) : "t-";
  return layout ? fmt::format("{}/{}", text, layout_name(*layout)) : text;
}

std::string RunConfig::arguments() const {
  std::string text;
  if (threads > 0) text += fmt::format(" --threads {}", threads);
  if (layout) text += fmt::format(" --layout {}", layout_name(*layout));
  return text;
}

std::vector<RunConfig> run_configs(const VerifyOptions& options) {
  std::vector<int> threads = options.thread_counts;
  if (threads.empty()) threads.push_back(options.run.threads);
  std::vector<std::optional<Layout>> layouts(options.layouts.begin(), options.layouts.end());
  if (layouts.empty()) layouts.push_back(options.layout);
  std::vector<RunConfig> configs;
  for (int t : threads)
    for (const auto& l : layouts) configs.push_back({t, l});
  return configs;
}

int VerifySummary::failed() const {
  return static_cast<int>(std::count_if(outcomes.begin(), outcomes.end(),
                                        [](const CaseOutcome& o) { return o.comparison.verdict == Verdict::fail; }));
}

namespace {

// The backends a piece of work runs (all of them, or a shard's share).
using BackendRefs = std::vector<const Backend*>;

BackendRefs refs_of(const std::vector<std::unique_ptr<Backend>>& backends) {
  BackendRefs refs;
  for (const auto& b : backends) refs.push_back(b.get());
  return refs;
}

bool wanted(const FixtureHeader& header, const std::vector<std::string>& tags) {
  if (tags.empty()) return true;
  return std::any_of(tags.begin(), tags.end(), [&](const std::string& t) { return header.has_tag(t); });
}

// model_dim > 0: a layer case, which a backend with its own layer judges by
// supports_layer.
std::vector<Status> support_of(const BackendRefs& backends, const Problem& problem, std::int64_t model_dim = 0) {
  std::vector<Status> support;
  for (const auto& backend : backends) {
    Status s = backend->available();
    if (s) s = backend_accepts(*backend, problem);
    // A framework's own layer (torch.nn.MultiheadAttention, Keras) has its own limits.
    if (s && model_dim > 0 && runs_own_layers(*backend)) s = backend->extensions()->supports_layer(problem, model_dim);
    support.push_back(s);
  }
  return support;
}

Problem laid_out_as(Problem problem, const RunConfig& config) {
  if (config.layout) problem.layout = *config.layout;
  return problem;
}

// Whether any backend runs the problem under any of the configurations.
bool anyone_runs(const BackendRefs& backends, const Problem& problem,
                 const std::vector<RunConfig>& configs, std::int64_t model_dim = 0) {
  for (const RunConfig& config : configs) {
      const std::vector<Status> support = support_of(backends, laid_out_as(problem, config), model_dim);
      if (std::any_of(support.begin(), support.end(), [](const Status& s) { return s.ok; })) return true;
  }
  return false;
}

std::string index_text(const Dims4& shape, std::size_t e) {
  Dims4 c{};
  for (int axis = 3; axis >= 0; --axis) {
    const auto extent = static_cast<std::size_t>(std::max<std::int64_t>(shape[static_cast<std::size_t>(axis)], 1));
    c[static_cast<std::size_t>(axis)] = static_cast<std::int64_t>(e % extent);
    e /= extent;
  }
  return fmt::format("[{}]", fmt::join(c, ","));
}

// The golden is checked, not trusted: what the fixture stores must be the
// float64 attention of its own inputs, within what the verifier would allow
// a backend of the case's dtype. Otherwise the fixture, not every backend,
// is at fault.
// An infinity (lse -inf on a row with no visible key) must be matched exactly:
// a bound derived from it is infinite too, and any finite number would be
// within it. A bound that is not a number accepts nothing. `hull`: for `out`,
// the range no weighted mean of the visible values can leave.
void check_golden(const FixtureHeader& header, std::string_view what, const Dims4& shape,
                  const std::vector<double>& stored, const std::vector<double>& truth, const std::vector<double>& bound,
                  const Bounds* hull = nullptr, std::string_view of = "the attention") {
  for (std::size_t e = 0; e < stored.size(); ++e) {
    const double x = stored[e], t = truth[e];
    if (std::isinf(t) || std::isinf(x) || std::isnan(x)) {
      if (x == t) continue;
    } else if (std::fabs(x - t) <= bound[e] && (!hull || hull->in_hull(e, x))) {
      continue;
    }
    throw InputError(fmt::format(
        "{}: its `{}` is not {} of its own inputs: {} holds {:.17g}, the float64 reference gives {:.17g} "
        "(a {} case may differ by at most {:.3g}); the golden is wrong or corrupt",
        header.path.string(), what, of, index_text(shape, e), x, t, dtype_name(header.problem.dtype), bound[e]));
  }
}

// A fixture tolerance that would accept an error of a tenth of the output is
// worth a loud warning even though the verifier's own policy still applies.
std::string loose_tolerance_warning(const FixtureHeader& header, const std::vector<double>& truth,
                                    const std::vector<double>& tolerance) {
  double scale = 0;
  for (double t : truth) scale = std::max(scale, std::fabs(t));
  if (tolerance.empty() || scale == 0) return {};
  const auto worst = std::max_element(tolerance.begin(), tolerance.end());
  if (*worst < ToleranceConstants::loose_tolerance_share * scale) return {};
  return fmt::format("LOOSE TOLERANCE: the fixture's own atol={} rtol={} accepts an error of {:.3g}, {:.0f}% of its "
                     "largest |out| ({:.3g}); a wrong answer would pass it (the verifier's own checks still apply)",
                     header.atol.value_or(0.0), header.rtol.value_or(0.0), *worst, 100.0 * *worst / scale, scale);
}

CaseData ones_probe(const CaseData& data) {
  CaseData probe = data;
  std::fill(probe.v.begin(), probe.v.end(), 1.0);
  return probe;
}

// Everything the checks of one SDPA fixture need, computed once for all backends.
struct Judgement {
  ReferenceResult truth;
  ReferenceStats stats;
  Bounds bounds;
  MeasuredLimit measured;
  std::vector<std::vector<double>> baselines;  // the plain formulations' outs (verify/baseline.hpp)
  std::vector<double> tolerance;  // the fixture's own, or empty
  std::vector<double> probe_bounds;
  std::vector<double> probe_want; // per row, what V = 1 gives: 1, less the sink's share (empty: 1)
  CaseData probe;                 // V replaced by ones
  std::vector<std::vector<double>> probe_baselines;
  // Version 3: the float64 gradients and their bounds, computed once per fixture.
  std::optional<GradientTruth> gradients;
};

// Runs `work`, which fills `c`: a backend's Unsupported (values it refuses,
// found only once it saw them) makes it SKIP with the reason, any other
// exception a FAIL that names it.
template <typename Work>
void judge(Comparison& c, Work&& work) {
  try {
    work();
  } catch (const Unsupported& e) {
    c = Comparison{};
    c.verdict = Verdict::skip;
    c.reason = e.what();
  } catch (const std::exception& e) {
    c.fail(fmt::format("backend threw: {}", e.what()));
  }
}

Comparison run_one(const Backend& backend, const Fixture& fixture, const Judgement& j, const CaseData& probe_case,
                   const RunOptions& options) {
  Comparison c;
  if (const RecordedOutputs* recorded = recorded_outputs_of(backend)) {
    // Another tool's result: judged by every check that needs no second run
    // (the normalisation probe would need the tool to run again, on V = 1).
    const Problem& p = fixture.problem();
    std::optional<RecordedOutput> r =
        recorded->read(fixture.header.name, "out", {p.q_batch(), p.heads_q, p.seq_q, p.head_dim_v});  // InputError: exit 2
    if (!r) {
      c.verdict = Verdict::skip;
      c.reason = fmt::format("no output file {}", printable(recorded->file_for(fixture.header.name).string()));
      return c;
    }
    return compare_output({p, j.truth.out, j.truth.lse, j.bounds, j.stats.visible, r->values, r->lse ? &*r->lse : nullptr,
                           &j.measured, &j.baselines, j.tolerance.empty() ? nullptr : &fixture.out,
                           j.tolerance.empty() ? nullptr : &j.tolerance});
  }
  judge(c, [&] {
    BackendRun run = run_backend(backend, fixture.data, options);
    const std::vector<Convention> conventions = conventions_of(backend, fixture.problem());
    ConventionOutcome followed;
    if (!conventions.empty()) followed = apply_conventions(conventions, fixture.data, run.out, run.lse ? &*run.lse : nullptr);
    const std::vector<double>* lse = run.lse ? &*run.lse : nullptr;
    c = compare_output({fixture.problem(), j.truth.out, j.truth.lse, j.bounds, j.stats.visible, run.out, lse,
                        &j.measured, &j.baselines, j.tolerance.empty() ? nullptr : &fixture.out,
                        j.tolerance.empty() ? nullptr : &j.tolerance});
    if (!run.guard_damage.empty()) c.fail(run.guard_damage);
    BackendRun probe = run_backend(backend, probe_case, options);
    if (!conventions.empty()) {
      ConventionOutcome probed = apply_conventions(conventions, probe_case, probe.out, nullptr);
      if (!probed.failure.empty()) c.fail("normalisation probe: " + probed.failure);
    }
    check_probe(c, fixture.problem(), j.stats.visible, j.probe_bounds, probe.out, j.probe_baselines, j.truth.out,
                j.probe_want);
    if (!probe.guard_damage.empty()) c.fail("normalisation probe: " + probe.guard_damage);
    c.conclude(followed);
  });
  return c;
}

void record(CaseOutcome outcome, const OutcomeCallback& on_outcome, VerifySummary& summary) {
  if (on_outcome) on_outcome(outcome);
  summary.outcomes.push_back(std::move(outcome));
}

// A layer case: y is compared as a one-head [batch, 1, seq_q, model_dim] tensor.
void verify_layer(const std::filesystem::path& file, const BackendRefs& backends,
                  const VerifyOptions& options, const OutcomeCallback& on_outcome, VerifySummary& summary) {
  LayerFixture fixture = read_layer_fixture(file);
  const Problem& problem = fixture.data.problem;
  const std::vector<RunConfig> configs = run_configs(options);
  Problem shape = Problem::parse(fmt::format("dtype={},b={},hq=1,hkv=1,sq={},sk=1,d=1,dv={}", dtype_short_name(problem.dtype),
                                             problem.batch, problem.seq_q, fixture.header.model_dim));
  Bounds bounds;
  std::vector<std::int64_t> every_row(static_cast<std::size_t>(problem.batch * problem.seq_q), 1);
  std::vector<double> no_lse;
  LayerReference reference;
  MeasuredLimit measured;
  std::vector<std::vector<double>> baseline;
  std::vector<double> tolerance;
  std::string warning;
  reference = reference_layer(fixture.data);
  bounds.out = derive_layer_bounds(fixture.data, reference);
  check_golden(fixture.header, "y", {problem.batch, 1, problem.seq_q, fixture.header.model_dim}, fixture.y, reference.y,
               bounds.out);
  if (!options.forward) return;  // a layer case has no backward here
  if (anyone_runs(backends, problem, configs, fixture.header.model_dim)) {
    const std::vector<char> counts(every_row.size(), 1);
    baseline = {baseline_layer(fixture.data, options.run.threads)};
    const std::int64_t longest = std::max(problem.seq_k, fixture.header.model_dim);
    measured = measured_limit(problem.dtype, reference.y, baseline, reference.y, fixture.header.model_dim, counts,
                              longest);
    tolerance = fixture_tolerance(fixture.header, fixture.y);
    warning = loose_tolerance_warning(fixture.header, reference.y, tolerance);
    if (!warning.empty()) summary.warnings.push_back(fmt::format("{}: {}", file.string(), warning));
  }
  for (const RunConfig& config : configs) {
    LayerData data = fixture.data;
    data.problem = laid_out_as(data.problem, config);
    const std::vector<Status> support = support_of(backends, data.problem, fixture.header.model_dim);
    RunOptions run_options = options.run;
    run_options.threads = config.threads;
    for (std::size_t b = 0; b < backends.size(); ++b) {
      CaseOutcome outcome{std::string(backends[b]->name()), file, fixture.header.name,
                          fmt::format("{},model={}", data.problem.to_string(), fixture.header.model_dim), {}, 0, warning,
                          config};
      const RecordedOutputs* recorded = recorded_outputs_of(*backends[b]);
      if (recorded) outcome.arguments = recorded->arguments();
      if (!support[b].ok) {
        outcome.comparison.verdict = Verdict::skip;
        outcome.comparison.reason = support[b].reason;
      } else {
        auto start = std::chrono::steady_clock::now();
        if (recorded) {
          std::optional<RecordedOutput> r =
              recorded->read(fixture.header.name, "y", {problem.batch, problem.seq_q, fixture.header.model_dim});
          if (!r) {
            outcome.comparison.verdict = Verdict::skip;
            outcome.comparison.reason =
                fmt::format("no output file {}", printable(recorded->file_for(fixture.header.name).string()));
          } else {
            outcome.comparison = compare_output({shape, reference.y, no_lse, bounds, every_row, r->values, nullptr,
                                                 &measured, &baseline, tolerance.empty() ? nullptr : &fixture.y,
                                                 tolerance.empty() ? nullptr : &tolerance});
          }
          record(std::move(outcome), on_outcome, summary);
          continue;
        }
        judge(outcome.comparison, [&] {
          LayerRun run;
          if (runs_own_layers(*backends[b])) {
            // The framework's own layer: y alone, no guard bands (it returns a new array).
            run.y = backends[b]->extensions()->run_layer(data, run_options);
            if (run.y.size() != reference.y.size()) {
              throw Error(fmt::format("its layer returned {} values of y, not {}", run.y.size(), reference.y.size()));
            }
            const std::vector<Convention> conventions = conventions_of(*backends[b], data.problem);
            if (!conventions.empty()) {
              run.conventions = apply_layer_conventions(conventions, data, reference, bounds.out, run.y);
            }
          } else {
            run = run_layer(*backends[b], data, run_options);
          }
          outcome.comparison = compare_output({shape, reference.y, no_lse, bounds, every_row, run.y, nullptr, &measured,
                                               &baseline, tolerance.empty() ? nullptr : &fixture.y,
                                               tolerance.empty() ? nullptr : &tolerance});
          if (!run.guard_damage.empty()) outcome.comparison.fail(run.guard_damage);
          outcome.comparison.conclude(run.conventions);
        });
        outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      record(std::move(outcome), on_outcome, summary);
    }
  }
}

// Version 3: the golden gradients are checked like `out`, each element within
// the a-priori bound of a backward in the case's dtype.
void check_golden_gradients(const Fixture& fixture, const GradientTruth& truth) {
  for (const GradientPart& part : gradient_parts(fixture.problem())) {
    check_golden(fixture.header, part.name, part.shape, fixture.gradients.value().*part.stored, truth.value.*part.values,
                 truth.bound.*part.values, nullptr, "the gradient of sum(dout * out)");
  }
}

void verify_sdpa(const Fixture& fixture, const BackendRefs& backends,
                 const VerifyOptions& options, const OutcomeCallback& on_outcome, VerifySummary& summary,
                 bool trusted_golden = false) {
  const Problem& problem = fixture.problem();
  const std::vector<RunConfig> configs = run_configs(options);
  Judgement j;
  std::string warning;
  // Every selected fixture's golden is checked, whoever runs it.
  j.truth = reference_attention(fixture.data, &j.stats, options.run.threads);
  j.bounds = derive_bounds(problem, j.truth.out, j.truth.lse, j.stats);
  if (!trusted_golden) {
    check_golden(fixture.header, "out", {problem.q_batch(), problem.heads_q, problem.seq_q, problem.head_dim_v},
                 fixture.out, j.truth.out, j.bounds.out, &j.bounds);
  }
  if (fixture.lse && !trusted_golden) {
    check_golden(fixture.header, "lse", {problem.q_batch(), problem.heads_q, problem.seq_q, 1}, *fixture.lse, j.truth.lse,
                 j.bounds.lse);
  }
  // The float64 gradients, once: for the golden check, and for every backend that runs the backward.
  auto gradient_truth_of = [&]() -> const GradientTruth& {
    if (!j.gradients) {
      j.gradients = gradient_truth(fixture.data, fixture.gradients->dout, fixture.gradients->bias_requires_grad, j.truth,
                                   j.stats);
    }
    return *j.gradients;
  };
  if (fixture.gradients && !trusted_golden) check_golden_gradients(fixture, gradient_truth_of());
  // And, for the backends that run the backward, the plain backwards' errors
  // (the measured bound): from the plain forward's out for recorded gradients,
  // and for a backend's own run from the out its backward was given (D =
  // rowsum(dO o O) starts there, so its forward's error, judged on its own,
  // is not charged twice), once per distinct out.
  auto measured_gradient_truth = [&]() -> const GradientTruth& {
    gradient_truth_of();
    if (j.gradients->measured.empty()) {
      measure_gradients(*j.gradients, fixture.data, fixture.gradients->dout, j.baselines.front(),
                        fixture.gradients->bias_requires_grad);
    }
    return *j.gradients;
  };
  std::vector<std::pair<std::vector<double>, GradientTruth>> measured_by_out;
  auto measured_from = [&](const std::vector<double>& out) -> const GradientTruth& {
    for (const auto& [seen, truth] : measured_by_out) {
      if (seen == out) return truth;
    }
    GradientTruth truth = gradient_truth_of();
    measure_gradients(truth, fixture.data, fixture.gradients->dout, out, fixture.gradients->bias_requires_grad);
    return measured_by_out.emplace_back(out, std::move(truth)).second;
  };
  // The rest is only computed when someone runs.
  if (anyone_runs(backends, problem, configs)) {
    std::vector<char> counts(j.stats.visible.size());
    for (std::size_t r = 0; r < counts.size(); ++r) counts[r] = j.stats.visible[r] > 0;
    BaselineFamily family = baseline_family(fixture.data, options.run.threads);
    j.baselines = std::move(family.out);
    j.probe_baselines = std::move(family.probe);
    const std::int64_t longest = *std::max_element(j.stats.visible.begin(), j.stats.visible.end());
    j.measured = measured_limit(problem.dtype, j.truth.out, j.baselines, forward_floor_magnitude(problem, j.stats),
                                problem.head_dim_v, counts, longest);
    j.tolerance = fixture_tolerance(fixture.header, fixture.out);
    warning = loose_tolerance_warning(fixture.header, j.truth.out, j.tolerance);
    if (!warning.empty()) summary.warnings.push_back(fmt::format("{}: {}", fixture.header.path.string(), warning));
    if (problem.sinks) {
      // The visible keys share 1 - exp(sink - lse) of the weight; the sink the rest.
      j.probe_want.resize(j.truth.lse.size());
      for (std::size_t r = 0; r < j.probe_want.size(); ++r) {
        const double sink = fixture.data.sinks[(r / static_cast<std::size_t>(problem.seq_q)) % static_cast<std::size_t>(problem.heads_q)];
        j.probe_want[r] = -std::expm1(sink - j.truth.lse[r]);
      }
    }
    j.probe_bounds = probe_bounds(problem, j.stats, j.probe_want);
    j.probe = ones_probe(fixture.data);
  }
  // Version 3: each backend's first backward per layout, which every later
  // run (another thread count) must match bit for bit.
  std::map<std::pair<std::size_t, int>, BackwardRun> first_backward;
  for (const RunConfig& config : configs) {
    Fixture laid_out = fixture;
    laid_out.data.problem = laid_out_as(problem, config);
    CaseData probe = j.probe;  // V = 1, in this run's layout
    probe.problem = laid_out_as(probe.problem, config);
    const std::vector<Status> support = support_of(backends, laid_out.problem());
    RunOptions run_options = options.run;
    run_options.threads = config.threads;
    for (std::size_t b = 0; b < backends.size() && options.forward; ++b) {
      CaseOutcome outcome{std::string(backends[b]->name()), fixture.header.path, fixture.header.name,
                          laid_out.problem().to_string(), {}, 0, warning, config};
      if (const RecordedOutputs* recorded = recorded_outputs_of(*backends[b])) outcome.arguments = recorded->arguments();
      if (!support[b].ok) {
        outcome.comparison.verdict = Verdict::skip;
        outcome.comparison.reason = support[b].reason;
      } else {
        auto start = std::chrono::steady_clock::now();
        outcome.comparison = run_one(*backends[b], laid_out, j, probe, run_options);
        outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      record(std::move(outcome), on_outcome, summary);
    }
    if (!fixture.gradients || !options.backward) continue;
    // Version 3: each backend's gradients, after its forward results, in the same run configuration.
    for (std::size_t b = 0; b < backends.size(); ++b) {
      CaseOutcome outcome{std::string(backends[b]->name()), fixture.header.path, fixture.header.name,
                          laid_out.problem().to_string(), {}, 0, warning, config};
      outcome.direction = "backward";
      const RecordedOutputs* recorded = recorded_outputs_of(*backends[b]);
      if (recorded) outcome.arguments = recorded->arguments();
      if (!support[b].ok) {
        outcome.comparison.verdict = Verdict::skip;
        outcome.comparison.reason = support[b].reason;
      } else if (recorded) {
        // Another tool's gradients: judged by every check but determinism (one run).
        std::vector<GradientPart> parts = gradient_parts(problem);
        std::erase_if(parts, [&](const GradientPart& part) { return ((*fixture.gradients).*part.stored).empty(); });
        std::vector<RecordedGradient> wanted;
        for (const GradientPart& part : parts) {
          std::vector<std::int64_t> dims(part.shape.begin(), part.shape.end());
          if (part.values == &ReferenceGradients::dsinks) dims = {problem.heads_q};  // stored as [heads_q]
          wanted.push_back({part.name, dims, {}});
        }
        if (const std::string beyond = gradients_beyond(problem, measured_gradient_truth().value); !beyond.empty()) {
          outcome.comparison.verdict = Verdict::skip;
          outcome.comparison.reason = beyond;
        } else if (!recorded->read_gradients(fixture.header.name, wanted)) {  // InputError: exit 2
          outcome.comparison.verdict = Verdict::skip;
          outcome.comparison.reason = fmt::format("no gradients (dq, dk, dv) in {}",
                                                  printable(recorded->file_for(fixture.header.name).string()));
        } else {
          BackwardRun run;
          for (std::size_t g = 0; g < parts.size(); ++g) run.got.*parts[g].values = std::move(wanted[g].values);
          outcome.comparison = compare_gradients(problem, measured_gradient_truth(), run);
        }
      } else if (!backends[b]->capabilities().backward) {
        outcome.comparison.verdict = Verdict::skip;
        outcome.comparison.reason = "does not implement the backward pass (format version 3)";
      } else {
        const auto start = std::chrono::steady_clock::now();
        judge(outcome.comparison, [&] {
          if (const std::string beyond = gradients_beyond(problem, gradient_truth_of().value); !beyond.empty()) {
            throw Unsupported(beyond);
          }
          const BackwardRun run = run_backward(*backends[b], laid_out.data, fixture.gradients->dout,
                                               fixture.gradients->bias_requires_grad, run_options);
          const GradientTruth& truth = measured_from(run.out);
          outcome.comparison = compare_gradients(problem, truth, run);
          if (outcome.comparison.verdict == Verdict::fail) {
            // A declared convention on rows with no visible key: DIFFERS when the gradients are its.
            const std::vector<Convention> conventions = conventions_of(*backends[b], problem);
            for (bool additive : {false, true}) {  // the second only when the first does not explain the gradients
              const ConventionalGradients conventional =
                  conventional_gradients(conventions, laid_out.data, fixture.gradients->dout, truth, additive);
              if (conventional.rows == 0) break;
              Comparison as_declared = compare_gradients(problem, conventional.truth, run);
              if (as_declared.verdict != Verdict::pass) continue;
              as_declared.verdict = Verdict::differs;
              as_declared.reason = fmt::format(
                  "{} rows with no visible key weigh every key 1/seq_k, so their dO / seq_k reaches dV of every key{} "
                  "(declared: {}); the format passes them nothing",
                  conventional.rows, conventional.additive ? " and (dP - mean dP) / seq_k reaches dQ and dK" : "",
                  conventional.why);
              outcome.comparison = std::move(as_declared);
              break;
            }
          }
          // Determinism, a verdict of its own: the same run again, and the
          // first run of this layout at another thread count, bit for bit.
          const BackwardRun again = run_backward(*backends[b], laid_out.data, fixture.gradients->dout,
                                                 fixture.gradients->bias_requires_grad, run_options);
          const bool dq_may_vary = backends[b]->capabilities().nondeterministic_dq;
          // Gradients are compared bit for bit only between runs whose
          // forward gave the same out (a forward may differ between thread
          // counts; its backward then starts elsewhere).
          if (again.out != run.out) {
            outcome.comparison.reason += fmt::format("{}its forward's out differs between two runs at {} threads, so its "
                                                     "gradients were not compared between them",
                                                     outcome.comparison.reason.empty() ? "" : "; ", config.threads);
          } else if (std::string why = backward_differences(problem, run, again, dq_may_vary); !why.empty()) {
            outcome.comparison.fail(fmt::format("not deterministic: {} between two runs at {} threads", why, config.threads));
          } else if (dq_may_vary) {
            // Declared: reported, not failed.
            if (std::string dq = backward_differences(problem, run, again, false); !dq.empty()) {
              outcome.comparison.reason += fmt::format("{}{} between two runs (declared non-deterministic dQ accumulation)",
                                                       outcome.comparison.reason.empty() ? "" : "; ", dq);
            }
          }
          const auto key = std::make_pair(b, static_cast<int>(laid_out.problem().layout));
          if (const auto first = first_backward.find(key); first == first_backward.end()) {
            first_backward.emplace(key, run);
          } else if (first->second.out != run.out) {
            outcome.comparison.reason += fmt::format("{}its forward's out at {} threads differs from the first thread "
                                                     "count's, so its gradients were not compared with those",
                                                     outcome.comparison.reason.empty() ? "" : "; ", config.threads);
          } else if (std::string why = backward_differences(problem, first->second, run, dq_may_vary); !why.empty()) {
            const std::string declared = thread_dependent_gradients_of(*backends[b]);
            if (declared.empty() || outcome.comparison.verdict == Verdict::fail) {
              outcome.comparison.fail(fmt::format("not deterministic: {} at {} threads against the first thread count",
                                                  why, config.threads));
            } else {
              // Declared by the framework's adapter: shown, not failed.
              outcome.comparison.verdict = Verdict::differs;
              outcome.comparison.reason += fmt::format("{}{} at {} threads against the first thread count (declared: {})",
                                                       outcome.comparison.reason.empty() ? "" : "; ", why, config.threads,
                                                       declared);
            }
          }
        });
        outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      record(std::move(outcome), on_outcome, summary);
    }
  }
}

}  // namespace

VerifySummary verify_fixture(const Fixture& fixture, const std::vector<const Backend*>& backends,
                             const VerifyOptions& options, bool trusted_golden, const OutcomeCallback& on_outcome) {
  VerifySummary summary;
  verify_sdpa(fixture, backends, options, on_outcome, summary, trusted_golden);
  return summary;
}

namespace {

// Tags that select nothing are an input error recorded like any other (so the
// JSON and JUnit of the run say why nothing ran), naming the tags there are.
void note_unmatched_tags(const VerifyOptions& options, const std::set<std::string>& seen, bool matched,
                         VerifySummary& summary) {
  if (options.tags.empty() || matched) return;
  summary.input_errors.push_back(fmt::format("no fixture has any of the tags {}; the tags there are: {}",
                                             fmt::join(options.tags, ","),
                                             seen.empty() ? std::string("none") : fmt::format("{}", fmt::join(seen, ","))));
}

// A damaged file can crash or hang libhdf5 itself: it is read first in a
// child process with limits, and only then for real (the same library on the
// same bytes does the same thing twice). The message when it failed.
std::string sandboxed_read(const std::filesystem::path& file, const VerifyOptions& options,
                           const SandboxLimits& limits) {
  const std::string trouble = run_sandboxed(
      [&] {
        const FixtureHeader h = read_fixture_header(file);
        if (!wanted(h, options.tags)) return;
        if (h.kind == FixtureKind::mha) read_layer_fixture(file);
        else read_fixture(file);
      },
      limits);
  if (trouble.empty()) return {};
  return trouble.rfind(file.string() + ":", 0) == 0 ? trouble : fmt::format("{}: reading it {}", file.string(), trouble);
}

void verify_file(const std::filesystem::path& file, const FixtureHeader& header, const BackendRefs& backends,
                 const VerifyOptions& options, const OutcomeCallback& on_outcome, VerifySummary& summary) {
  if (header.kind == FixtureKind::mha) {
    verify_layer(file, backends, options, on_outcome, summary);
    return;
  }
  Fixture fixture = read_fixture(file);
  verify_sdpa(fixture, backends, options, on_outcome, summary);
}

// What one (fixture, backend) unit costs, roughly: its multiply-adds under
// every run configuration, plus a fixed part for the reference and the checks.
double unit_cost(const FixtureHeader& header, std::size_t configs) {
  const Problem& p = header.problem;
  auto d = [](std::int64_t x) { return static_cast<double>(x); };
  double work = d(p.batch) * d(p.heads_q) * d(p.seq_q) * d(p.seq_k) * d(p.head_dim + p.head_dim_v);
  if (header.kind == FixtureKind::mha) work += 3.0 * d(p.batch) * d(p.seq_q + 2 * p.seq_k) * d(header.model_dim) * d(header.model_dim);
  return (work + 1e5) * static_cast<double>(configs);
}

// Sharded: every fixture's header is read (safely) first, so that every shard
// sees every (fixture, backend) unit and splits them the same way; then this
// shard's units run. A fixture that cannot be read is shard 1's input error.
VerifySummary verify_shard(const std::vector<std::filesystem::path>& files, const BackendRefs& backends,
                           const VerifyOptions& options, const OutcomeCallback& on_outcome) {
  VerifySummary summary;
  const Shard shard = *options.shard;
  summary.shard = shard;
  const SandboxLimits limits = SandboxLimits::from_environment();
  const std::size_t configs = run_configs(options).size();
  struct Readable {
    std::filesystem::path file;
    FixtureHeader header;
  };
  std::vector<Readable> readable;
  std::vector<ShardUnit> units;
  std::set<std::string> seen_tags;
  bool matched = false;
  for (const auto& file : files) {
    try {
      const std::string trouble = sandboxed_read(file, options, limits);
      if (!trouble.empty()) {
        if (shard.index == 1) summary.input_errors.push_back(trouble);
        continue;
      }
      FixtureHeader header = read_fixture_header(file);
      for (auto& t : header.all_tags()) seen_tags.insert(std::move(t));
      if (!wanted(header, options.tags)) continue;
      matched = true;
      for (const Backend* b : backends) {
        units.push_back({fmt::format("{}|{}|{}", b->name(), header.name, header.problem.to_string()),
                         unit_cost(header, configs)});
      }
      readable.push_back({file, std::move(header)});
    } catch (const Error& e) {
      if (shard.index == 1) summary.input_errors.push_back(e.what());
    }
  }
  if (shard.index == 1) note_unmatched_tags(options, seen_tags, matched, summary);
  std::vector<std::string> keys;
  for (const auto& u : units) keys.push_back(u.key);
  summary.suite = suite_fingerprint(keys);
  summary.units = units.size();
  const std::vector<int> owner = assign_shards(units, shard.count);
  for (std::size_t f = 0; f < readable.size(); ++f) {
    BackendRefs mine;
    for (std::size_t b = 0; b < backends.size(); ++b) {
      if (owner[f * backends.size() + b] == shard.index) mine.push_back(backends[b]);
    }
    if (mine.empty()) continue;
    summary.units_run += mine.size();
    try {
      verify_file(readable[f].file, readable[f].header, mine, options, on_outcome, summary);
    } catch (const Error& e) {
      summary.input_errors.push_back(e.what());
    }
  }
  return summary;
}

}  // namespace

VerifySummary verify(const std::vector<std::filesystem::path>& files,
                     const std::vector<std::unique_ptr<Backend>>& backends, const VerifyOptions& options,
                     const OutcomeCallback& on_outcome) {
  if (options.shard) return verify_shard(files, refs_of(backends), options, on_outcome);
  VerifySummary summary;
  const SandboxLimits limits = SandboxLimits::from_environment();
  const BackendRefs all = refs_of(backends);
  std::set<std::string> seen_tags;
  bool matched = false;
  for (const auto& file : files) {
    try {
      const std::string trouble = sandboxed_read(file, options, limits);
      if (!trouble.empty()) {
        summary.input_errors.push_back(trouble);
        continue;
      }
      FixtureHeader header = read_fixture_header(file);
      for (auto& t : header.all_tags()) seen_tags.insert(std::move(t));
      if (!wanted(header, options.tags)) continue;
      matched = true;
      verify_file(file, header, all, options, on_outcome, summary);
    } catch (const Error& e) {  // InputError included
      summary.input_errors.push_back(e.what());
    }
  }
  note_unmatched_tags(options, seen_tags, matched, summary);
  return summary;
}

}  // namespace attn
