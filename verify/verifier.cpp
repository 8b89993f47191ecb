#include "verify/verifier.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include "attnbench/error.hpp"
#include "core/extensions.hpp"
#include "core/sandbox.hpp"
#include "core/shard.hpp"
#include "core/text.hpp"
#include "fixtures/fixture.hpp"
#include "fixtures/layer.hpp"
#include "fixtures/suite.hpp"
#include "reference/layer.hpp"
#include "verify/backward.hpp"
#include "verify/baseline.hpp"
#include "attnbench/value_range.hpp"
#include "verify/dropout.hpp"
#include "verify/invariance.hpp"
#include "verify/relations.hpp"
#include "verify/layer.hpp"
#include "verify/layer_backward.hpp"
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

// layer: a layer case, which a backend with its own layer judges by
// supports_layer.
std::vector<Status> support_of(const BackendRefs& backends, const Problem& problem, Direction direction,
                               const LayerData* layer = nullptr) {
  std::vector<Status> support;
  for (const auto& backend : backends) {
    Status s = backend->available();
    if (s) s = backend_accepts(*backend, problem, direction);
    // A framework's own layer (torch.nn.MultiheadAttention, Keras) has its own limits.
    if (s && layer && runs_own_layers(*backend)) s = backend->extensions()->supports_layer(problem, *layer);
    support.push_back(s);
  }
  return support;
}

// A layer's widths as its rows print them: model=64, then kdim/vdim where they differ.
std::string layer_widths_text(const LayerData& layer) {
  std::string text = fmt::format("model={}", layer.model_dim);
  if (layer.k_in() != layer.model_dim) text += fmt::format(",kdim={}", layer.k_in());
  if (layer.v_in() != layer.model_dim) text += fmt::format(",vdim={}", layer.v_in());
  return text;
}

Problem laid_out_as(Problem problem, const RunConfig& config) {
  if (config.layout) problem.layout = *config.layout;
  return problem;
}

// Whether any backend runs the problem under any of the configurations.
bool anyone_runs(const BackendRefs& backends, const Problem& problem,
                 const std::vector<RunConfig>& configs, const LayerData* layer = nullptr) {
  for (const RunConfig& config : configs) {
      const std::vector<Status> support = support_of(backends, laid_out_as(problem, config), Direction::forward, layer);
      if (std::any_of(support.begin(), support.end(), [](const Status& s) { return s.ok; })) return true;
  }
  return false;
}

std::string index_text(const Dims4& shape, std::size_t e) {
  return fmt::format("[{}]", fmt::join(element_coordinates(shape, e), ","));
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

// A backend whose computation the thread count does not reach runs the same at
// every count: judged at the first one asked for, and said so at the others.
std::string judged_elsewhere(const Backend& backend, const RunConfig& config, const std::vector<RunConfig>& configs) {
  if (backend.capabilities().uses_threads || config.threads == configs.front().threads) return {};
  return fmt::format("the thread count does not reach it (it declares no use of threads): judged at {} threads",
                     configs.front().threads);
}

// A case that ran out of memory past the estimate made before reading it
// (fixtures/fixture.cpp): the file's to answer for, as any input too large.
std::string out_of_memory() {
  const double left = address_space_left();
  return fmt::format("ran out of memory verifying this case (std::bad_alloc), though its declared sizes passed the "
                     "estimate made before reading it{}; --memory-limit (ATTN_MAX_CASE_GIB) lowers what a case may take",
                     std::isfinite(left) ? fmt::format("; this process may map {:.2f} GiB more (ulimit -v)", left / (1 << 30))
                                         : std::string());
}

// A verdict reached before anything ran.
Comparison skipped(std::string reason) {
  Comparison c;
  c.verdict = Verdict::skip;
  c.reason = std::move(reason);
  return c;
}

// Runs `work`, which returns the comparison: a backend's Unsupported (values
// it refuses, found only once it saw them) makes it SKIP with the reason, as
// does running out of memory (no answer is not a wrong answer); any other
// exception is a FAIL that names it.
template <typename Work>
Comparison judged(Work&& work) {
  try {
    return work();
  } catch (const Unsupported& e) {
    return skipped(e.what());
  } catch (const std::bad_alloc&) {
    return skipped("ran out of memory on this case (std::bad_alloc): this process may not allocate what it needs "
                   "(ulimit -v, the machine's memory)");
  } catch (const std::exception& e) {
    Comparison c;
    c.fail(fmt::format("backend threw: {}", e.what()));
    return c;
  }
}

// A backend's forward on the case and on its normalisation probe, with the
// conventions it declares applied to rows with no visible key.
// `raw`, when given, receives the case's run as the backend returned it (the
// golden-free checks start from it).
ForwardResult run_forward(const Backend& backend, const CaseData& data, const CaseData& probe, const RunOptions& options,
                          std::optional<BackendRun>* raw = nullptr) {
  ForwardResult r;
  BackendRun run = run_backend(backend, data, options);
  if (raw) *raw = run;
  const std::vector<Convention> conventions = conventions_of(backend, data.problem);
  if (!conventions.empty()) r.conventions = apply_conventions(conventions, data, run.out, run.lse ? &*run.lse : nullptr);
  r.out = std::move(run.out);
  r.lse = std::move(run.lse);
  r.guard_damage = std::move(run.guard_damage);
  BackendRun probed = run_backend(backend, probe, options);
  if (!conventions.empty()) r.probe_conventions_failure = apply_conventions(conventions, probe, probed.out, nullptr).failure;
  r.probe = std::move(probed.out);
  r.probe_guard_damage = std::move(probed.guard_damage);
  return r;
}

// Another tool's forward results: judged by every check that needs no second
// run (the normalisation probe would need the tool to run again, on V = 1).
Comparison recorded_forward(const RecordedOutputs& recorded, const Fixture& fixture, const ForwardTruth& truth) {
  const Problem& p = fixture.problem();
  std::optional<RecordedOutput> r =
      recorded.read(fixture.header.name, "out", {p.q_batch(), p.heads_q, p.seq_q, p.head_dim_v});  // InputError: exit 2
  if (!r) return skipped(fmt::format("no output file {}", printable(recorded.file_for(fixture.header.name).string())));
  ForwardResult result;
  result.out = std::move(r->values);
  result.lse = std::move(r->lse);
  return judge_forward(truth, result);
}

// Another tool's gradients: judged by every check but determinism (one run),
// measured from the plain forward's out.
Comparison recorded_backward(const RecordedOutputs& recorded, const Fixture& fixture, BackwardTruth& truth,
                             const ForwardTruth& forward) {
  const Problem& p = fixture.problem();
  if (!truth.beyond().empty()) return skipped(truth.beyond());
  std::vector<GradientPart> parts = gradient_parts(p);
  std::erase_if(parts, [&](const GradientPart& part) { return ((*fixture.gradients).*part.stored).empty(); });
  std::vector<RecordedGradient> wanted;
  for (const GradientPart& part : parts) {
    std::vector<std::int64_t> dims(part.shape.begin(), part.shape.end());
    if (part.values == &ReferenceGradients::dsinks) dims = {p.heads_q};  // stored as [heads_q]
    wanted.push_back({part.name, dims, {}});
  }
  if (!recorded.read_gradients(fixture.header.name, wanted)) {  // InputError: exit 2
    return skipped(fmt::format("no gradients (dq, dk, dv) in {}", printable(recorded.file_for(fixture.header.name).string())));
  }
  ReferenceGradients got;
  for (std::size_t g = 0; g < parts.size(); ++g) got.*parts[g].values = std::move(wanted[g].values);
  return judge_backward(p, truth.measured_from(forward.baselines.front()), got);
}

void record(CaseOutcome outcome, const OutcomeCallback& on_outcome, VerifySummary& summary) {
  if (on_outcome) on_outcome(outcome);
  summary.outcomes.push_back(std::move(outcome));
}

CaseOutcome outcome_of(const Backend& backend, const FixtureHeader& header, std::string problem, const RunConfig& config,
                       std::string warning, Direction direction) {
  CaseOutcome o{std::string(backend.name()), header.path, header.name, std::move(problem), {}, 0, std::move(warning), config};
  if (const RecordedOutputs* recorded = recorded_outputs_of(backend)) o.arguments = recorded->arguments();
  o.direction = direction;
  return o;
}

// A layer case's gradients (format version 3): the goldens checked against
// the truth, then every backend's layer backward judged, a row per backend
// and configuration.
void verify_layer_backward(const LayerFixture& fixture, const LayerReference& reference, const BackendRefs& backends,
                           const VerifyOptions& options, const OutcomeCallback& on_outcome, VerifySummary& summary) {
  const LayerData& layer = fixture.data;
  const std::vector<RunConfig> configs = run_configs(options);
  const auto empty_rows = std::count(reference.stats.visible.begin(), reference.stats.visible.end(), std::int64_t{0});
  std::optional<LayerGradientTruth> truth;
  auto truth_of = [&]() -> const LayerGradientTruth& {
    if (!truth) truth = layer_gradient_truth(layer, reference, fixture.dout, fixture.bias_requires_grad);
    return *truth;
  };
  {
    // The goldens are checked, not trusted, with the a-priori bounds alone.
    const LayerGradientTruth& t = truth_of();
    for (const LayerGradientPart& part : layer_gradient_parts(layer, fixture.bias_requires_grad)) {
      if (!part.present) continue;
      check_golden(fixture.header, part.name, part.shape, *fixture.gradients.*part.values, t.value.*part.values,
                   t.bound.*part.values, nullptr, "the gradient of sum(dout * y)");
    }
  }
  for (const RunConfig& config : configs) {
    LayerData data = layer;
    data.problem = laid_out_as(data.problem, config);
    // A framework's own layer answers for its backward itself (run_layer_backward).
    const std::vector<Status> forward = support_of(backends, data.problem, Direction::forward, &layer);
    const std::vector<Status> backward = support_of(backends, data.problem, Direction::backward, &layer);
    RunOptions run_options = options.run;
    run_options.threads = config.threads;
    for (std::size_t b = 0; b < backends.size(); ++b) {
      const Backend& backend = *backends[b];
      const std::vector<Status>& support = runs_own_layers(backend) ? forward : backward;
      CaseOutcome outcome = outcome_of(backend, fixture.header, fmt::format("{},{}", data.problem.to_string(), layer_widths_text(data)),
                                       config, {}, Direction::backward);
      const auto start = std::chrono::steady_clock::now();
      const std::string elsewhere = judged_elsewhere(backend, config, configs);
      if (!support[b].ok) {
        outcome.comparison = skipped(support[b].reason);
      } else if (!elsewhere.empty()) {
        outcome.comparison = skipped(elsewhere);
      } else if (recorded_outputs_of(backend)) {
        outcome.comparison = skipped("recorded outputs hold no layer gradients");
      } else if (!truth_of().beyond.empty()) {
        outcome.comparison = skipped(truth_of().beyond);
      } else {
        outcome.comparison = judged([&] {
          const LayerGradients got = run_layer_backward(backend, data, fixture.dout, fixture.bias_requires_grad, run_options);
          Comparison c = judge_layer_backward(data, fixture.bias_requires_grad, truth_of(), got);
          const std::vector<Convention> conventions = conventions_of(backend, data.problem);
          const auto mean_v = std::find_if(conventions.begin(), conventions.end(), [](const Convention& x) {
            return x.kind == ConventionKind::empty_rows_mean_v;
          });
          if (c.verdict == Verdict::fail && empty_rows > 0 && mean_v != conventions.end()) {
            // The gradients as the declaration gives them (a fill, then additive: verify/backward.hpp).
            for (const bool additive : {false, true}) {
              std::int64_t rows = 0;
              const LayerGradientTruth declared = conventional_layer_truth(data, reference, fixture.dout,
                                                                           fixture.bias_requires_grad, truth_of(), additive, rows);
              if (rows == 0) break;
              Comparison as_declared = judge_layer_backward(data, fixture.bias_requires_grad, declared, got);
              if (as_declared.verdict != Verdict::pass && as_declared.verdict != Verdict::mistrusted) continue;
              const std::string differs = fmt::format(
                  "{} attention rows with no visible key are the mean of V (declared: {}): their O reaches dw_o and "
                  "their dO / seq_k the dV of every key{}, through the projections; the format passes them nothing",
                  rows, mean_v->why, additive ? ", and (dP - mean dP) / seq_k dQ and dK" : "");
              as_declared.as_declared(differs);
              return as_declared;
            }
            c.fail(fmt::format("its gradients are neither the format's nor those of its declared convention ({}: {})",
                               "the mean of V", mean_v->why));
            return c;
          }
          if (c.verdict == Verdict::fail && empty_rows > 0 && !conventions.empty()) {
            // Its attention's gradients on those rows are judged on the
            // attention cases, under its declaration (verify/backward.hpp);
            // through the projections every layer gradient carries them.
            return skipped(fmt::format("its gradients are not the format's, and it declares what its attention does on "
                                       "rows with no visible key ({}), which {} rows of this layer are: a layer's "
                                       "gradients under a declared convention are not modelled ({})",
                                       conventions.front().why, empty_rows, c.reason));
          }
          return c;
        });
      }
      outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      record(std::move(outcome), on_outcome, summary);
    }
  }
}

// A layer case: y is compared as a one-head [batch, 1, seq_q, model_dim] tensor.
void verify_layer_case(const LayerFixture& fixture, const BackendRefs& backends, const VerifyOptions& options,
                       const OutcomeCallback& on_outcome, VerifySummary& summary) {
  const std::filesystem::path& file = fixture.header.path;
  const Problem& problem = fixture.data.problem;
  const std::int64_t model_dim = fixture.header.model_dim;
  const std::vector<RunConfig> configs = run_configs(options);
  const LayerReference reference = reference_layer(fixture.data);
  const std::vector<double> bound = derive_layer_bounds(fixture.data, reference);
  TensorTruth y;
  y.name = "y";
  y.dtype = problem.dtype;
  y.shape = {problem.batch, 1, problem.seq_q, model_dim};
  y.value = &reference.y;
  y.bound = &bound;
  check_golden(fixture.header, "y", y.shape, fixture.y, reference.y, bound);
  if (fixture.gradients && options.backward) verify_layer_backward(fixture, reference, backends, options, on_outcome, summary);
  if (!options.forward) return;
  MeasuredLimit measured;
  std::vector<std::vector<double>> baseline;
  std::vector<double> tolerance;
  std::string warning;
  if (anyone_runs(backends, problem, configs, &fixture.data)) {
    const std::vector<char> counts(static_cast<std::size_t>(problem.batch * problem.seq_q), 1);
    // Every plain formulation, as for the attention: the least accurate sets
    // the measured bound (one alone is lucky on a row of a few elements).
    for (const Formulation f : kFormulations) baseline.push_back(baseline_layer(fixture.data, options.run.threads, f));
    // Its floor: y multiplies the attention's output as the dtype holds it,
    // a rounding of each term of O @ w_o (and of b_o), not only of y.
    const LayerData& l = fixture.data;
    const std::vector<double> o = merge_heads(reference.result.out, problem.batch, problem.heads_q, problem.seq_q,
                                              problem.head_dim_v);
    std::vector<double> summed(reference.y.size(), 0.0);
    for (std::int64_t r = 0; r < problem.batch * problem.seq_q; ++r)
      for (std::int64_t col = 0; col < model_dim; ++col) {
        double m = l.b_o.empty() ? 0.0 : std::fabs(l.b_o[static_cast<std::size_t>(col)]);
        for (std::int64_t k = 0; k < l.o_width(); ++k) {
          m += std::fabs(o[static_cast<std::size_t>(r * l.o_width() + k)] * l.w_o[static_cast<std::size_t>(k * model_dim + col)]);
        }
        summed[static_cast<std::size_t>(r * model_dim + col)] = std::max(m, std::fabs(reference.y[static_cast<std::size_t>(r * model_dim + col)]));
      }
    measured = measured_limit(problem.dtype, reference.y, baseline, summed, model_dim, counts,
                              std::max({problem.seq_k, model_dim, fixture.data.k_in(), fixture.data.v_in()}));
    tolerance = fixture_tolerance(fixture.header, fixture.y);
    warning = loose_tolerance_warning(fixture.header, reference.y, tolerance);
    if (!warning.empty()) summary.warnings.push_back(fmt::format("{}: {}", file.string(), warning));
    y.measured = &measured;
    y.baselines = &baseline;
    y.exact_within = subnormal_allowance(problem.dtype, 1.0);
    if (!tolerance.empty()) y.fixture_values = &fixture.y, y.fixture_tolerance = &tolerance;
  }
  for (const RunConfig& config : configs) {
    LayerData data = fixture.data;
    data.problem = laid_out_as(data.problem, config);
    const std::vector<Status> support = support_of(backends, data.problem, Direction::forward, &fixture.data);
    RunOptions run_options = options.run;
    run_options.threads = config.threads;
    for (std::size_t b = 0; b < backends.size(); ++b) {
      const Backend& backend = *backends[b];
      CaseOutcome outcome = outcome_of(backend, fixture.header, fmt::format("{},{}", data.problem.to_string(), layer_widths_text(data)),
                                       config, warning, Direction::forward);
      const auto start = std::chrono::steady_clock::now();
      const RecordedOutputs* recorded = recorded_outputs_of(backend);
      const std::string elsewhere = judged_elsewhere(backend, config, configs);
      outcome.comparison = !support[b].ok ? skipped(support[b].reason) : !elsewhere.empty() ? skipped(elsewhere) : judged([&] {
        LayerRun run;
        if (recorded) {
          std::optional<RecordedOutput> r = recorded->read(fixture.header.name, "y", {problem.batch, problem.seq_q, model_dim});
          if (!r) return skipped(fmt::format("no output file {}", printable(recorded->file_for(fixture.header.name).string())));
          run.y = std::move(r->values);
        } else if (runs_own_layers(backend)) {
          // The framework's own layer: y alone, no guard bands (it returns a new array).
          run.y = backend.extensions()->run_layer(data, run_options);
          if (run.y.size() != reference.y.size()) {
            throw Error(fmt::format("its layer returned {} values of y, not {}", run.y.size(), reference.y.size()));
          }
          const std::vector<Convention> conventions = conventions_of(backend, data.problem);
          if (!conventions.empty()) run.conventions = apply_layer_conventions(conventions, data, reference, bound, run.y);
        } else {
          run = run_layer(backend, data, run_options);
        }
        Comparison c;
        c.add(score_tensor(y, run.y));
        if (!run.guard_damage.empty()) c.fail(run.guard_damage);
        c.conclude(run.conventions);
        return c;
      });
      outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      record(std::move(outcome), on_outcome, summary);
    }
  }
}

// The golden is checked, not trusted: out and lse, and version 3's gradients,
// each element within the a-priori bound of a backend of the case's dtype.
void check_golden_forward(const Fixture& fixture, const ForwardTruth& truth) {
  const Problem& p = fixture.problem();
  check_golden(fixture.header, "out", {p.q_batch(), p.heads_q, p.seq_q, p.head_dim_v}, fixture.out, truth.truth.out,
               truth.bounds.out, &truth.bounds);
  if (fixture.lse) {
    check_golden(fixture.header, "lse", {p.q_batch(), p.heads_q, p.seq_q, 1}, *fixture.lse, truth.truth.lse, truth.bounds.lse);
  }
}

void check_golden_gradients(const Fixture& fixture, const GradientTruth& truth) {
  for (const GradientPart& part : gradient_parts(fixture.problem())) {
    check_golden(fixture.header, part.name, part.shape, fixture.gradients.value().*part.stored, truth.value.*part.values,
                 truth.bound.*part.values, nullptr, "the gradient of sum(dout * out)");
  }
}

// The checks that need no golden, rows of their own per backend at
// `config`: batch invariance (a case with more than one entry) and each
// metamorphic relation the case admits, forward, and backward where
// `gradients` and their a-priori bounds are given.
// A backend that already FAILed the case's comparison with the golden
// (`failed`) gets SKIP rows: its failure is reported once, and nothing runs
// for it again. `golden_runs` (by backend, when given) holds the runs of the
// comparison with the golden at `config`: each check starts from them instead
// of running the case again.
void verify_golden_free(const FixtureHeader& header, const CaseData& case_data, const FixtureGradients* gradients,
                        const GradientTruth* gradient_truth, const BackendRefs& backends, const VerifyOptions& options,
                        const RunConfig& config, const std::string& warning, const OutcomeCallback& on_outcome,
                        VerifySummary& summary, const std::set<const Backend*>& failed = {},
                        std::vector<std::optional<BackendRun>>* golden_runs = nullptr,
                        const FirstBackwards* golden_backwards = nullptr) {
  CaseData data = case_data;
  data.problem = laid_out_as(case_data.problem, config);
  const Problem& problem = data.problem;
  RunOptions run_options = options.run;
  run_options.threads = config.threads;
  const std::vector<Status> forward_support = support_of(backends, problem, Direction::forward);
  const std::vector<double>* dout =
      gradients && gradient_truth && options.backward && !gradients->dout.empty() ? &gradients->dout : nullptr;
  const std::vector<Status> backward_support =
      dout ? support_of(backends, problem, Direction::backward) : std::vector<Status>{};
  auto row = [&](std::size_t b, const std::string& check, Direction direction, const std::vector<Status>& support,
                 auto&& work) {
    const Backend& backend = *backends[b];
    CaseOutcome outcome = outcome_of(backend, header, problem.to_string(), config, warning, direction);
    outcome.check = check;
    const auto start = std::chrono::steady_clock::now();
    if (!support[b].ok) {
      outcome.comparison = skipped(support[b].reason);
    } else if (failed.contains(&backend)) {
      outcome.comparison = skipped("it FAILed the comparison with the golden on this case: not judged again");
    } else if (recorded_outputs_of(backend)) {
      outcome.comparison = skipped("recorded outputs: nothing to run on other inputs");
    } else {
      outcome.comparison = judged(work);
    }
    outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    record(std::move(outcome), on_outcome, summary);
  };
  // Each backend's own results on the case, once for every check: the golden
  // comparison's where it ran them.
  std::vector<std::optional<BackendRun>> own_runs(backends.size());
  std::vector<std::optional<BackendRun>>& own = golden_runs ? *golden_runs : own_runs;
  own.resize(backends.size());
  std::vector<std::optional<BackwardRun>> own_backward(backends.size());
  auto own_of = [&](std::size_t b) -> const BackendRun& {
    if (!own[b]) own[b] = run_backend(*backends[b], data, run_options);
    return *own[b];
  };
  auto own_backward_of = [&](std::size_t b) -> const BackwardRun& {
    if (own_backward[b]) return *own_backward[b];
    if (golden_backwards) {
      if (const auto it = golden_backwards->find({backends[b], problem.layout}); it != golden_backwards->end()) {
        return it->second;
      }
    }
    own_backward[b] = run_backward(*backends[b], data, *dout, gradients->bias_requires_grad, run_options);
    return *own_backward[b];
  };
  if (options.invariance && problem.batch > 1) {
    const bool backward_too = dout && options.backward_invariance && !problem.paged();
    const std::vector<InvarianceRun> others = invariance_runs(data, options.check_budget, backward_too ? dout : nullptr);
    for (std::size_t b = 0; options.forward && b < backends.size(); ++b) {
      row(b, "batch invariance", Direction::forward, forward_support, [&] {
        return judge_batch_invariance(*backends[b], data, others, run_options,
                                      [&]() -> const BackendRun& { return own_of(b); });
      });
    }
    for (std::size_t b = 0; backward_too && b < backends.size(); ++b) {
      row(b, "batch invariance", Direction::backward, backward_support, [&] {
        return judge_batch_invariance_backward(*backends[b], data, others, gradients->bias_requires_grad,
                                               *gradient_truth, run_options,
                                               [&]() -> const BackwardRun& { return own_backward_of(b); });
      });
    }
  }
  if (!options.relations) return;
  // One relation at a time: one transformed copy of the case in memory.
  for (unsigned relation = 1; relation <= kAllRelations; relation <<= 1) {
    if (!((options.forward_relations | (dout ? options.backward_relations : 0u)) & relation)) continue;
    for (const RelationRun& run : relation_runs(data, dout, options.check_budget, nullptr, relation)) {
      const std::string check = fmt::format("relation {}", relation_name(relation));
      if (run.forward && options.forward && (options.forward_relations & relation)) {
        for (std::size_t b = 0; b < backends.size(); ++b) {
          row(b, check, Direction::forward, forward_support,
              [&] { return judge_relation(*backends[b], data, own_of(b), run, run_options); });
        }
      }
      if (run.backward && dout && (options.backward_relations & relation)) {
        for (std::size_t b = 0; b < backends.size(); ++b) {
          row(b, check, Direction::backward, backward_support, [&] {
            return judge_relation_backward(*backends[b], data, *dout, gradients->bias_requires_grad, own_backward_of(b),
                                           *gradient_truth, run, run_options);
          });
        }
      }
    }
  }
}

// A case with dropout_p: a "dropout" row per backend and direction at the
// first run configuration (verify/dropout.hpp). A backend that does not
// declare dropout is SKIP.
void verify_dropout(const Fixture& fixture, const ForwardTruth& forward, const GradientTruth* gradient_truth,
                    const BackendRefs& backends, const VerifyOptions& options, const RunConfig& config,
                    const std::string& warning, const OutcomeCallback& on_outcome, VerifySummary& summary) {
  CaseData data = fixture.data;
  data.problem = laid_out_as(fixture.data.problem, config);
  const Problem& problem = data.problem;
  const double p = *fixture.header.dropout_p;
  RunOptions run_options = options.run;
  run_options.threads = config.threads;
  const std::string beyond = dropout_out_of_reach(problem);
  // The pairs a mask is read at, once for every backend (none beyond reach).
  const std::vector<std::uint8_t> visible = beyond.empty() ? dropout_visible(data) : std::vector<std::uint8_t>{};
  std::vector<Direction> directions;
  if (options.forward) directions.push_back(Direction::forward);
  if (options.backward && fixture.gradients && gradient_truth) directions.push_back(Direction::backward);
  for (const Direction direction : directions) {
    const std::vector<Status> support = support_of(backends, problem, direction);
    for (std::size_t b = 0; b < backends.size(); ++b) {
      const Backend& backend = *backends[b];
      CaseOutcome outcome = outcome_of(backend, fixture.header, problem.to_string(), config, warning, direction);
      outcome.check = "dropout";
      const auto start = std::chrono::steady_clock::now();
      if (!support[b].ok) {
        outcome.comparison = skipped(support[b].reason);
      } else if (!backend.capabilities().dropout) {
        outcome.comparison = skipped("it does not declare dropout");
      } else if (recorded_outputs_of(backend)) {
        outcome.comparison = skipped("recorded outputs: nothing to run with dropout");
      } else if (!beyond.empty()) {
        outcome.comparison = skipped(beyond);
      } else if (direction == Direction::forward) {
        outcome.comparison = judged([&] { return judge_dropout(backend, data, p, visible, forward, run_options); });
      } else {
        outcome.comparison = judged([&] {
          return judge_dropout_backward(backend, data, p, visible, fixture.gradients->dout,
                                        fixture.gradients->bias_requires_grad, forward, *gradient_truth, run_options);
        });
      }
      outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      record(std::move(outcome), on_outcome, summary);
    }
  }
}

// One fixture: its truth once, then every (run configuration, direction,
// backend) unit, each judged by the direction's judge.
void verify_sdpa(const Fixture& fixture, const BackendRefs& backends, const VerifyOptions& options,
                 const OutcomeCallback& on_outcome, VerifySummary& summary, bool trusted_golden = false) {
  const Problem& problem = fixture.problem();
  const std::vector<RunConfig> configs = run_configs(options);
  ForwardTruth forward = forward_truth(fixture.data, options.run.threads);
  if (!trusted_golden) check_golden_forward(fixture, forward);
  const bool runs = anyone_runs(backends, problem, configs);
  std::optional<BackwardTruth> backward;
  if (fixture.gradients && (!trusted_golden || (runs && options.backward))) {
    backward.emplace(fixture.data, *fixture.gradients, forward);
    if (!trusted_golden) check_golden_gradients(fixture, backward->a_priori());
  }
  if (runs) measure_forward(forward, fixture.data, &fixture, options.run.threads);
  // Format version 4: the scale-plumbing probe's cases, and the quantisation's own error.
  const std::vector<ScaleProbe> scale_probed =
      runs && options.forward ? scale_probes(fixture.data, options.run.threads) : std::vector<ScaleProbe>{};
  const std::optional<QuantisationError> quantisation =
      problem.quantised() ? quantisation_error(fixture.data, forward.truth, options.run.threads) : std::nullopt;
  std::string warning = loose_tolerance_warning(fixture.header, forward.truth.out, forward.tolerance);
  if (!warning.empty()) summary.warnings.push_back(fmt::format("{}: {}", fixture.header.path.string(), warning));
  std::vector<Direction> directions;
  if (options.forward) directions.push_back(Direction::forward);
  if (options.backward && backward) directions.push_back(Direction::backward);
  FirstBackwards first;
  std::set<const Backend*> failed_golden;
  std::vector<std::optional<BackendRun>> front_runs(backends.size());  // at configs.front(), for the checks without a golden
  for (const RunConfig& config : configs) {
    CaseData data = fixture.data, probe = forward.probe;
    data.problem = probe.problem = laid_out_as(problem, config);
    std::vector<CaseData> scaled_data;  // the scale probe's cases in this configuration, once for every backend
    for (const ScaleProbe& scaled : scale_probed) {
      scaled_data.push_back(scaled.data);
      scaled_data.back().problem = data.problem;
    }
    RunOptions run_options = options.run;
    run_options.threads = config.threads;
    for (const Direction direction : directions) {
      const std::vector<Status> support = support_of(backends, data.problem, direction);
      for (std::size_t b = 0; b < backends.size(); ++b) {
        const Backend& backend = *backends[b];
        CaseOutcome outcome = outcome_of(backend, fixture.header, data.problem.to_string(), config, warning, direction);
        const RecordedOutputs* recorded = recorded_outputs_of(backend);
        const auto start = std::chrono::steady_clock::now();
        if (!support[b].ok) {
          outcome.comparison = skipped(support[b].reason);
        } else if (const std::string elsewhere = judged_elsewhere(backend, config, configs); !elsewhere.empty()) {
          outcome.comparison = skipped(elsewhere);
        } else if (direction == Direction::forward) {
          outcome.comparison = recorded ? recorded_forward(*recorded, fixture, forward) : judged([&] {
            Comparison c = judge_forward(
                forward, run_forward(backend, data, probe, run_options, &config == &configs.front() ? &front_runs[b] : nullptr));
            for (std::size_t n = 0; n < scale_probed.size(); ++n) {
              const ScaleProbe& scaled = scale_probed[n];
              BackendRun run = run_backend(backend, scaled_data[n], run_options);
              // The conventions the backend declares hold for the probe's
              // rows with no visible key too (the case's own run reports them).
              const std::vector<Convention> conventions = conventions_of(backend, scaled_data[n].problem);
              if (!conventions.empty()) {
                const std::string failure = apply_conventions(conventions, scaled_data[n], run.out, nullptr).failure;
                if (!failure.empty()) c.fail(fmt::format("scale probe ({}): {}", scaled.what, failure));
              }
              judge_scale_probe(c, scaled, run.out);
              if (!run.guard_damage.empty()) c.fail(fmt::format("scale probe ({}): {}", scaled.what, run.guard_damage));
            }
            return c;
          });
        } else {
          outcome.comparison = recorded ? recorded_backward(*recorded, fixture, *backward, forward) : judged([&] {
            if (!backward->beyond().empty()) throw Unsupported(backward->beyond());
            return judge_backend_backward(backend, data, *backward, run_options, first);
          });
        }
        if (direction == Direction::forward) outcome.quantisation = quantisation;
        outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (outcome.comparison.verdict == Verdict::fail) failed_golden.insert(&backend);
        record(std::move(outcome), on_outcome, summary);
      }
    }
  }
  const GradientTruth* gradient_truth =
      backward && backward->beyond().empty() ? &backward->a_priori() : nullptr;
  if (runs) {
    verify_golden_free(fixture.header, fixture.data, fixture.gradients ? &*fixture.gradients : nullptr, gradient_truth,
                       backends, options, configs.front(), warning, on_outcome, summary, failed_golden, &front_runs, &first);
  }
  if (runs && options.dropout && fixture.header.dropout_p) {
    verify_dropout(fixture, forward, gradient_truth, backends, options, configs.front(), warning, on_outcome, summary);
  }
}

}  // namespace

VerifySummary verify_fixture(const Fixture& fixture, const std::vector<const Backend*>& backends,
                             const VerifyOptions& options, bool trusted_golden, const OutcomeCallback& on_outcome) {
  VerifySummary summary;
  verify_sdpa(fixture, backends, options, on_outcome, summary, trusted_golden);
  return summary;
}

VerifySummary verify_layer_fixture(const LayerFixture& fixture, const std::vector<const Backend*>& backends,
                                   const VerifyOptions& options, const OutcomeCallback& on_outcome) {
  VerifySummary summary;
  verify_layer_case(fixture, backends, options, on_outcome, summary);
  return summary;
}

namespace {

// Tags that select nothing are an input error recorded like any other (so the
// JSON and JUnit of the run say why nothing ran), naming the tags there are.
void note_unmatched_tags(const VerifyOptions& options, const std::set<std::string>& seen, bool matched,
                         VerifySummary& summary) {
  if (options.tags.empty() || matched) return;
  summary.input_errors.push_back({"", fmt::format("no fixture has any of the tags {}; the tags there are: {}",
                                             fmt::join(options.tags, ","),
                                                 seen.empty() ? std::string("none") : fmt::format("{}", fmt::join(seen, ",")))});
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
    verify_layer_case(read_layer_fixture(file), backends, options, on_outcome, summary);
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
  if (header.kind == FixtureKind::mha) {
    const double m = d(header.model_dim), mk = d(header.kdim ? header.kdim : header.model_dim),
                 mv = d(header.vdim ? header.vdim : header.model_dim);
    work += 3.0 * d(p.batch) * (d(p.seq_q) * m * m + d(p.seq_k) * (mk + mv) * m);
  }
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
        if (shard.index == 1) summary.input_errors.push_back({file.string(), trouble});
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
      if (shard.index == 1) summary.input_errors.push_back({file.string(), e.what()});
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
      summary.input_errors.push_back({readable[f].file.string(), e.what()});
    } catch (const std::bad_alloc&) {
      summary.input_errors.push_back({readable[f].file.string(), out_of_memory()});
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
        summary.input_errors.push_back({file.string(), trouble});
        continue;
      }
      FixtureHeader header = read_fixture_header(file);
      for (auto& t : header.all_tags()) seen_tags.insert(std::move(t));
      if (!wanted(header, options.tags)) continue;
      matched = true;
      verify_file(file, header, all, options, on_outcome, summary);
    } catch (const Error& e) {  // InputError included
      summary.input_errors.push_back({file.string(), e.what()});
    } catch (const std::bad_alloc&) {
      summary.input_errors.push_back({file.string(), out_of_memory()});
    }
  }
  note_unmatched_tags(options, seen_tags, matched, summary);
  return summary;
}

VerifySummary verify_problems(const std::vector<Problem>& problems, const std::vector<std::unique_ptr<Backend>>& backends,
                              const VerifyOptions& options, const OutcomeCallback& on_outcome) {
  VerifySummary summary;
  const BackendRefs all = refs_of(backends);
  const RunConfig config = run_configs(options).front();
  for (const Problem& problem : problems) {
    CaseSpec spec;
    spec.problem = problem.to_string();
    spec.name = "problem " + spec.problem;  // the generator's seed
    FixtureHeader header;
    header.name = spec.problem;
    header.problem = problem;
    header.path = "--problem";
    const CaseData data = generate_inputs(spec);
    verify_golden_free(header, data, nullptr, nullptr, all, options, config, "", on_outcome, summary);
  }
  return summary;
}

}  // namespace attn
