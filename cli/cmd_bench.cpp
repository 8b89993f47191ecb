// attn bench: the Google Benchmark suite; --benchmark_* flags pass through.
#include <fmt/format.h>

#include "bench/runner.hpp"
#include "cli/commands.hpp"
#include "core/registry.hpp"

namespace attn::cli {

Runner add_bench_command(CLI::App& app) {
  auto options = std::make_shared<bench::BenchOptions>();
  auto names = std::make_shared<std::vector<std::string>>();
  CLI::App* cmd = app.add_subcommand("bench", "Time backends over the benchmark matrix (Google Benchmark; --benchmark_* flags pass through)");
  cmd->add_option("--preset", options->preset, "quick (about a minute), standard (about ten), full, gpu (for scripts/gpu-check)")
      ->check(CLI::IsMember({"quick", "standard", "full", "gpu"}));
  cmd->add_option("--backend", *names, "Backends to time (default: all)");
  cmd->add_option("--threads", options->threads, "Threads per backend (default: OMP_NUM_THREADS or all cores)");
  cmd->add_option("--max-seconds", options->max_seconds_per_call, "Skip a case whose estimated time per call is above this (default by preset: 2, 10, 60 s)");
  cmd->allow_extras();
  return [cmd, options, names]() {
    auto backends = make_backends(*names);
    return bench::run_benchmarks(backends, *options, cmd->remaining());
  };
}

}  // namespace attn::cli
