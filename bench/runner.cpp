#include "bench/runner.hpp"

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string_view>

#include "bench/alloc_tracker.hpp"
#include "attnbench/error.hpp"
#include "core/output_file.hpp"
#include "bench/matrix.hpp"
#include "bench/peak.hpp"
#include "core/case_data.hpp"
#include "core/quantise.hpp"
#include "core/rng.hpp"
#include "core/thread_pool.hpp"

namespace attn::bench {

const char* direction_name(Direction d) {
  switch (d) {
    case Direction::forward: return "forward";
    case Direction::backward: return "backward";
    case Direction::both: return "forward+backward";
  }
  return "forward";
}

Direction parse_direction(const std::string& text) {
  for (Direction d : {Direction::forward, Direction::backward, Direction::both}) {
    if (text == direction_name(d)) return d;
  }
  throw Error(fmt::format("--direction {}: not one of forward, backward, forward+backward", text));
}

std::vector<Direction> preset_directions(const std::string& preset) {
  if (preset == "training") return {Direction::backward};
  return {Direction::forward};
}

double direction_flops_factor(Direction d) {
  switch (d) {
    case Direction::forward: return 1.0;
    case Direction::backward: return 2.5;
    case Direction::both: return 3.5;
  }
  return 1.0;
}

namespace {

CaseData random_case(const Problem& p) {
  CaseData data;
  data.problem = p;
  Rng rng = Rng::from_name(p.to_string());
  auto fill = [&](std::vector<double>& v, std::int64_t n) {
    v.resize(static_cast<std::size_t>(n));
    for (double& x : v) x = round_to_dtype(rng.normal(), p.dtype);
  };
  fill(data.q, p.q_elements());
  fill(data.k, p.k_elements());
  fill(data.v, p.v_elements());
  const Sequences s = benchmark_sequences(p);
  data.cu_seqlens_q = s.cu_seqlens_q;
  data.cu_seqlens_k = s.cu_seqlens_k;
  data.page_table = s.page_table;
  data.seq_lens = s.seq_lens;
  for (std::int64_t h = 0; h < p.heads_q && p.alibi; ++h) {
    data.alibi_slopes.push_back(round_to_dtype(std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(p.heads_q)), DType::f32));
  }
  for (std::int64_t h = 0; h < p.heads_q && p.sinks; ++h) data.sinks.push_back(round_to_dtype(rng.normal(), DType::f32));
  if (p.quantised()) quantise_case(data);  // the codes, scales and descales the problem declares
  return data;
}

// The problem at most `size` queries and keys long, for timing estimates:
// packed sequences keep their proportions, paged entries their page size.
Problem shrunk(const Problem& p, std::int64_t size) {
  Problem small = p;
  small.seq_q = std::min<std::int64_t>(p.seq_q, size);
  small.seq_k = std::min<std::int64_t>(p.seq_k, size);
  if (p.paged()) {
    small.seq_k = std::max<std::int64_t>(small.seq_k / p.page_size, 1) * p.page_size;
    small.num_pages = small.batch * small.pages_per_entry() + 1;
  }
  small.fit_quant_scales();
  return small;
}

struct Prepared {
  std::shared_ptr<const DeviceReadyInputs> inputs;  // shared by every backend and repetition of the problem
  AttentionIO io;                                    // its views, with this benchmark's own out and lse
  Buffer out;
  std::vector<double> lse;
  std::unique_ptr<Plan> plan;
  // The backward's: dO (random, in dtype), the gradients, and its plan.
  Buffer dout, dq, dk, dv;
  std::vector<double> dsinks;
  BackwardIO backward_io;
  std::unique_ptr<BackwardPlan> backward;

  // One timed call of the direction: the plan's own clock for the forward
  // alone (device backends time their kernels), the wall clock otherwise.
  double call(Direction d) {
    if (d == Direction::forward) return plan->run_timed();
    const auto start = std::chrono::steady_clock::now();
    if (d == Direction::both) plan->run();
    backward->run();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

// The inputs of each problem, drawn once per run: every backend and every
// repetition reads the same (read-only) tensors. Drawing a decode case's 67
// million normals again for each of 5 repetitions of 5 backends took a
// quarter of the quick preset's time.
std::map<std::string, std::shared_ptr<const DeviceReadyInputs>>& input_cache() {
  static std::map<std::string, std::shared_ptr<const DeviceReadyInputs>> cache;
  return cache;
}

std::unique_ptr<Prepared> make_inputs(const Problem& p) {
  auto prepared = std::make_unique<Prepared>();
  auto& cached = input_cache()[p.to_string()];
  if (!cached) cached = std::make_shared<const DeviceReadyInputs>(make_backend_inputs(random_case(p)));
  prepared->inputs = cached;
  prepared->io = cached->io;
  Dims4 shape{p.q_batch(), p.heads_q, p.seq_q, p.head_dim_v};
  prepared->out = Buffer(static_cast<std::size_t>(p.out_elements()) * dtype_size(p.dtype));
  prepared->lse.assign(static_cast<std::size_t>(p.rows()), 0.0);
  prepared->io.out = MutableTensorView{prepared->out.data(), p.dtype, shape, layout_strides(shape, p.layout)};
  prepared->io.lse = prepared->lse.data();
  return prepared;
}

// The gradient buffers and dO of a backward benchmark, allocated before its
// memory is measured (they are the call's outputs and input, not its own).
void make_gradients(Prepared& prepared, const Problem& p) {
  auto tensor = [&](Buffer& buffer, const Dims4& shape) {
    buffer = Buffer(static_cast<std::size_t>(shape[0] * shape[1] * shape[2] * shape[3]) * dtype_size(p.dtype));
    return MutableTensorView{buffer.data(), p.dtype, shape, layout_strides(shape, p.layout)};
  };
  const Dims4 out_shape{p.q_batch(), p.heads_q, p.seq_q, p.head_dim_v};
  const MutableTensorView dout = tensor(prepared.dout, out_shape);
  Rng rng = Rng::from_name("dout " + p.to_string());
  for (std::int64_t e = 0; e < p.out_elements(); ++e) store_from_double(dout.data, e, p.dtype, round_to_dtype(rng.normal(), p.dtype));
  BackwardIO& io = prepared.backward_io;
  io.dout = TensorView{dout.data, p.dtype, dout.shape, dout.strides};
  io.dq = tensor(prepared.dq, {p.q_batch(), p.heads_q, p.seq_q, p.head_dim});
  io.dk = tensor(prepared.dk, {p.kv_batch(), p.heads_kv, p.kv_seq(), p.head_dim});
  io.dv = tensor(prepared.dv, {p.kv_batch(), p.heads_kv, p.kv_seq(), p.head_dim_v});
  prepared.dsinks.assign(p.sinks ? static_cast<std::size_t>(p.heads_q) : 0, 0.0);
  io.dsinks = p.sinks ? prepared.dsinks.data() : nullptr;
}

// The forward plan's untimed run: the out and lse the backward starts from.
void run_forward_for_backward(Prepared& prepared) {
  prepared.plan->run();
  prepared.plan->read_output();
  prepared.backward_io.forward = prepared.io;
  if (!prepared.plan->has_lse()) prepared.backward_io.forward.lse = nullptr;
}

std::unique_ptr<Prepared> prepare(const Backend& backend, const Problem& p, Direction d, const RunOptions& options) {
  auto prepared = make_inputs(p);
  if (d != Direction::forward) make_gradients(*prepared, p);
  prepared->plan = backend.prepare(p, prepared->io, options);
  if (d != Direction::forward) {
    run_forward_for_backward(*prepared);
    prepared->backward = backend.prepare_backward(p, prepared->backward_io, options);
  }
  return prepared;
}

// Seconds per call, extrapolated from runs on at most 256 and 512 rows and
// keys of the problem: t = fixed + per_flop * flops, so backends with a large
// fixed cost per call are not overestimated.
double estimate_seconds(const Backend& backend, const Problem& p, Direction d, const RunOptions& options) {
  auto time_at = [&](std::int64_t size, double& flops) {
    const Problem small = shrunk(p, size);
    flops = useful_flops(small);
    auto prepared = prepare(backend, small, d, options);
    prepared->call(d);  // warm up
    return prepared->call(d);
  };
  double flops_small = 0, flops_large = 0;
  const double t_small = time_at(256, flops_small), t_large = time_at(512, flops_large);
  if (flops_large <= flops_small) return t_large;
  const double per_flop = std::max(0.0, (t_large - t_small) / (flops_large - flops_small));
  const double fixed = std::max(0.0, t_small - per_flop * flops_small);
  return fixed + per_flop * useful_flops(p);
}

// "case n of N, elapsed, about M s left" on stderr when it is a terminal.
struct Progress {
  int total = 0, done = 0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  bool tty = isatty(2) != 0;
  void next(const std::string& name) {
    ++done;
    if (!tty) return;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double left = done > 1 ? elapsed / (done - 1) * (total - done + 1) : 0.0;
    fmt::print(stderr, "\r\033[K[{}/{}] {:.0f} s elapsed, about {:.0f} s left: {}", done, total, elapsed, left,
               name.substr(0, 60));
    if (done == total) fmt::print(stderr, "\n");
  }
};

// Whether a benchmark runs, decided once, before its first repetition, and
// kept for all of them: redone per repetition, a noisy estimate near the limit
// could skip some repetitions and not others (Google Benchmark then aborts).
struct SkipDecision {
  bool decided = false;
  std::string skip;  // the reason; empty when it runs
};

std::string decide_skip(const Backend& backend, const Problem& p, Direction d, const BenchOptions& options) {
  Status ok = backend.available();
  if (ok) ok = backend_accepts(backend, p, d == Direction::forward ? attn::Direction::forward : attn::Direction::backward);
  if (!ok) return fmt::format("SKIP: {}", ok.reason);
  double limit = options.max_seconds_per_call;
  if (limit <= 0) limit = options.preset == "quick" ? 2.0 : options.preset == "full" ? 60.0 : 5.0;
  double estimate = 0;
  try {
    estimate = estimate_seconds(backend, p, d, RunOptions{options.threads});
  } catch (const Unsupported& refused) {  // what prepare refuses (workspace, range) is a reason, not an error
    return fmt::format("SKIP: {}", refused.what());
  }
  if (estimate > limit) return fmt::format("SKIP: about {:.3g} s per call, above the {:.3g} s limit", estimate, limit);
  return {};
}

void run_one(benchmark::State& state, const Backend& backend, const Problem& p, Direction d, const BenchOptions& options,
             const std::string& skip) {
  if (!skip.empty()) {
    state.SkipWithError(skip.c_str());
    return;
  }
  RunOptions run{options.threads};
  // Peak memory of prepare and the first call beyond what the inputs and the
  // output already hold: the backend's own.
  // For the backward alone, beyond the forward's plan as well.
  auto prepared = make_inputs(p);
  if (d != Direction::forward) make_gradients(*prepared, p);
  std::int64_t heap_before = AllocTracker::current_bytes();
  AllocTracker::reset_peak();
  prepared->plan = backend.prepare(p, prepared->io, run);
  if (d != Direction::forward) {
    run_forward_for_backward(*prepared);
    if (d == Direction::backward) {  // the backward's own, from here
      heap_before = AllocTracker::current_bytes();
      AllocTracker::reset_peak();
    }
    prepared->backward = backend.prepare_backward(p, prepared->backward_io, run);
  }
  prepared->call(d);  // first call: page faults, caches
  const double extra = static_cast<double>(AllocTracker::peak_bytes() - heap_before);
  for (auto _ : state) {
    state.SetIterationTime(prepared->call(d));
  }
  prepared->plan->read_output();
  // The direction's useful FLOPs (direction_flops_factor times the forward's).
  const double factor = direction_flops_factor(d);
  state.counters["FLOP/s"] = benchmark::Counter(factor * useful_flops(p), benchmark::Counter::kIsIterationInvariantRate);
  // Per call, for reports: the pairs of packed and paged cases depend on
  // lengths the problem string does not carry.
  state.counters["useful_flops"] = factor * useful_flops(p);
  state.counters["dense_flops"] = factor * dense_flops(p);
  if (p.seq_q == 1 && d == Direction::forward) state.counters["KV_bytes/s"] = benchmark::Counter(kv_bytes(p), benchmark::Counter::kIsIterationInvariantRate);
  if (AllocTracker::available()) state.counters["extra_MiB"] = extra / (1 << 20);
  state.counters["workspace_MiB"] = static_cast<double>(prepared->plan->workspace_bytes()) / (1 << 20);
  state.counters["attn_threads"] = resolve_threads(options.threads);
}

}  // namespace

// A value written as NaN, -nan, Infinity or inf (after a ':', not in a string)
// becomes null: what Google Benchmark writes for 0/0 is not JSON.
static std::string null_for_non_finite(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    out += text[i];
    if (text[i++] != ':') continue;
    std::size_t j = i;
    while (j < text.size() && (text[j] == ' ' || text[j] == '\t')) ++j;
    std::size_t k = j + (j < text.size() && text[j] == '-' ? 1 : 0);
    for (const char* word : {"NaN", "nan", "Infinity", "inf"}) {
      const std::size_t n = std::char_traits<char>::length(word);
      const bool ends = k + n >= text.size() || std::string_view(",}] \n\r\t").find(text[k + n]) != std::string_view::npos;
      if (text.compare(k, n, word) == 0 && ends) {
        out.append(text, i, j - i);
        out += "null";
        i = k + n;
        break;
      }
    }
  }
  return out;
}

// Repetitions of every benchmark unless --benchmark_repetitions says otherwise.
constexpr int kRepetitions = 5;

int run_benchmarks(const std::vector<std::unique_ptr<Backend>>& backends, const BenchOptions& options,
                   std::vector<std::string> benchmark_args) {
  std::vector<char*> argv;
  std::string program = "attn bench";
  argv.push_back(program.data());
  const bool min_time_given = std::any_of(benchmark_args.begin(), benchmark_args.end(),
                                          [](const std::string& a) { return a.rfind("--benchmark_min_time", 0) == 0; });
  // Statistics by default: every preset runs 5 repetitions (enough for a
  // median, an interquartile range, and the regression gate's Mann-Whitney
  // test, which needs at least 4 a side), randomly interleaved with the
  // other benchmarks' so that slow drift of a shared machine hits every
  // backend alike. Each flag given on the command line wins.
  auto given = [&](const char* flag) {
    return std::any_of(benchmark_args.begin(), benchmark_args.end(),
                       [flag](const std::string& a) { return a.rfind(flag, 0) == 0; });
  };
  if (!given("--benchmark_repetitions")) benchmark_args.push_back(fmt::format("--benchmark_repetitions={}", kRepetitions));
  if (!given("--benchmark_enable_random_interleaving")) {
    benchmark_args.push_back("--benchmark_enable_random_interleaving=true");
  }
  if (!min_time_given && options.preset == "quick") benchmark_args.push_back("--benchmark_min_time=0.05");
  if (!min_time_given && (options.preset == "standard" || options.preset == "training")) {
    benchmark_args.push_back("--benchmark_min_time=0.1");
  }
  // Written beside --out and renamed into place once whole (core/output_file.hpp);
  // an earlier run's file goes first, so an interrupted run leaves none.
  std::optional<OutputFile> out;
  if (!options.out.empty()) {
    remove_stale_output(options.out);
    out.emplace(options.out);
    benchmark_args.push_back("--benchmark_out=" + out->temp_path().string());
    benchmark_args.push_back("--benchmark_out_format=json");
  }
  for (auto& a : benchmark_args) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  benchmark::Initialize(&argc, argv.data());
  if (benchmark::ReportUnrecognizedArguments(argc, argv.data())) return 2;
  // Sharded: every (backend, problem) of the preset is a unit, split by its
  // useful flops (plus a fixed part per benchmark), the same way everywhere.
  std::vector<Problem> problems;
  if (options.problems.empty()) problems = benchmark_problems(options.preset);
  for (const std::string& spec : options.problems) problems.push_back(Problem::parse(spec));
  // A benchmark's name: <backend>/<problem>, then /backward or
  // /forward+backward for those directions (the forward's name is unchanged).
  auto bench_name = [](const Backend& b, const Problem& p, Direction d) {
    return d == Direction::forward ? fmt::format("{}/{}", b.name(), p.to_string())
                                   : fmt::format("{}/{}/{}", b.name(), p.to_string(), direction_name(d));
  };
  std::vector<ShardUnit> units;
  for (const Problem& p : problems) {
    for (const auto& backend : backends) {
      for (Direction d : options.directions) {
        units.push_back({bench_name(*backend, p, d), direction_flops_factor(d) * useful_flops(p) + 1e9});
      }
    }
  }
  std::vector<int> owner(units.size(), 1);
  if (options.shard) {
    owner = assign_shards(units, options.shard->count);
    std::vector<std::string> keys;
    for (const auto& u : units) keys.push_back(u.key);
    benchmark::AddCustomContext("attn_shard", options.shard->text());
    benchmark::AddCustomContext("attn_shard_source", options.shard_source);
    benchmark::AddCustomContext("attn_suite", suite_fingerprint(keys));
  }
  benchmark::AddCustomContext("attn_threads", std::to_string(resolve_threads(options.threads)));
  benchmark::AddCustomContext("attn_preset", options.preset);
  std::string repetitions, interleaving;
  for (const std::string& a : benchmark_args) {  // the last of each wins, as in Google Benchmark
    if (a.rfind("--benchmark_repetitions=", 0) == 0) repetitions = a.substr(24);
    if (a.rfind("--benchmark_enable_random_interleaving=", 0) == 0) interleaving = a.substr(39);
  }
  benchmark::AddCustomContext("attn_repetitions", repetitions);
  benchmark::AddCustomContext("attn_random_interleaving", interleaving);
  for (const auto& [key, value] : options.context) benchmark::AddCustomContext(key, value);
  if (options.measure_peak) {
    MachinePeak peak = options.peak ? *options.peak : measure_peak(options.threads);
    benchmark::AddCustomContext("attn_peak_fp32_gflops", fmt::format("{:.1f}", peak.fp32_gflops));
    benchmark::AddCustomContext("attn_peak_bf16_gflops", fmt::format("{:.1f}", peak.bf16_gflops));
    benchmark::AddCustomContext("attn_peak_amx_bf16_gflops", fmt::format("{:.1f}", peak.amx_bf16_gflops));
    benchmark::AddCustomContext("attn_peak_bandwidth_gbs", fmt::format("{:.1f}", peak.bandwidth_gbs));
  }
  static Progress progress;
  progress.total = static_cast<int>(std::count(owner.begin(), owner.end(), options.shard ? options.shard->index : 1));
  std::size_t unit = 0;
  for (const Problem& p : problems) {
    for (const auto& backend : backends) {
      for (Direction d : options.directions) {
        if (owner[unit++] != (options.shard ? options.shard->index : 1)) continue;
        const Backend* b = backend.get();
        std::string name = bench_name(*b, p, d);
        auto decision = std::make_shared<SkipDecision>();
        benchmark::RegisterBenchmark(name.c_str(),
                                     [b, p, d, name, decision, &options](benchmark::State& state) {
                                       if (!decision->decided) {
                                         progress.next(name);
                                         decision->skip = decide_skip(*b, p, d, options);
                                         decision->decided = true;
                                       }
                                       run_one(state, *b, p, d, options, decision->skip);
                                     })
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
  const std::size_t ran = benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  input_cache().clear();
  if (ran == 0 && options.shard) {
    // A shard may own nothing that the filter keeps (or nothing at all): the
    // other shards hold the work; no file is written.
    fmt::print(stderr, "attn bench: shard {} ({}) has no benchmark to time here ({} of the {} units are its own)\n",
               options.shard->text(), options.shard_source, progress.total, units.size());
    return 0;
  }
  if (ran == 0) {
    throw Error(fmt::format("no benchmark of the '{}' preset matches the filter given (--benchmark_filter); "
                            "`attn bench --preset {} --benchmark_list_tests` lists them",
                            options.preset, options.preset));
  }
  if (out) {
    std::ifstream written(out->temp_path());
    std::string text((std::istreambuf_iterator<char>(written)), std::istreambuf_iterator<char>());
    // Google Benchmark writes NaN for an aggregate of a counter that is always
    // zero (its coefficient of variation): not JSON. Such values become null.
    text = null_for_non_finite(text);
    if (!nlohmann::json::accept(text)) {
      throw Error(fmt::format("{}: Google Benchmark did not write whole JSON; nothing was written", options.out));
    }
    out.reset();  // its temporary goes; the checked text is written whole
    write_whole_file(options.out, text);
  }
  return 0;
}

}  // namespace attn::bench
