// attn bench: the Google Benchmark suite; --benchmark_* flags pass through.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>

#include "bench/runner.hpp"
#include "fixtures/h5.hpp"
#include "cli/commands.hpp"
#include "core/cpu.hpp"
#include "core/registry.hpp"

namespace attn::cli {

namespace {

std::string read_first(const char* path, const char* key) {
  std::ifstream file(path);
  std::string line;
  while (std::getline(file, line)) {
    if (line.rfind(key, 0) == 0) {
      auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "unknown";
}

// What a reader of the results needs to know about where they came from.
std::vector<std::pair<std::string, std::string>> environment_context(const std::vector<std::unique_ptr<Backend>>& backends) {
  std::vector<std::pair<std::string, std::string>> context;
  context.emplace_back("attn_cpu_model", read_first("/proc/cpuinfo", "model name"));
  std::string flags = read_first("/proc/cpuinfo", "flags"), isa;
  for (const char* f : {"avx2", "fma", "avx512f", "avx512_bf16", "avx512vbmi", "avx512_fp16", "amx_bf16"}) {
    if ((" " + flags + " ").find(std::string(" ") + f + " ") != std::string::npos) isa += std::string(isa.empty() ? "" : " ") + f;
  }
  context.emplace_back("attn_cpu_isa", isa);
  context.emplace_back("attn_cpu_kernels", std::string(cpu_kernel_set()));
  context.emplace_back("attn_bf16_products", fmt::format("{} ({})", bf16_products().dot ? "dot" : "float32", bf16_products().why));
  context.emplace_back("attn_compiler", fmt::format("gcc {}", __VERSION__));
  context.emplace_back("attn_build_type", ATTN_BUILD_TYPE);
  context.emplace_back("attn_git_commit", ATTN_GIT_COMMIT);
  context.emplace_back("attn_hdf5", h5::library_version());
  for (const auto& backend : backends) {
    Status available = backend->available();
    context.emplace_back(fmt::format("attn_backend_{}", backend->name()),
                         available ? std::string(backend->description()) : fmt::format("unavailable: {}", available.reason));
  }
  return context;
}

}  // namespace

Runner add_bench_command(CLI::App& app) {
  auto options = std::make_shared<bench::BenchOptions>();
  auto names = std::make_shared<std::vector<std::string>>();
  CLI::App* cmd = app.add_subcommand("bench", "Time backends over the benchmark matrix (Google Benchmark; --benchmark_* flags pass through)");
  cmd->add_option("--preset", options->preset,
                  "quick (about a minute on 2 cores), standard (about 12 minutes), full, training (backward shapes, timed "
                  "backward unless --direction says otherwise), gpu (for scripts/gpu-check)")
      ->check(CLI::IsMember({"quick", "standard", "full", "training", "gpu"}));
  cmd->add_option("--problem", options->problems,
                  "Time this problem instead of the preset's (repeatable; the fixture catalogue's syntax, e.g. "
                  "dtype=bf16,b=8,hq=32,hkv=8,sq=1,sk=4096,d=128,causal=bottom_right,paged=16x2049)")
      ->allow_extra_args(false);
  cmd->add_option("-b,--backend", *names, "Backends to time, e.g. -b naive,streaming (default: all)")
      ->allow_extra_args(false)
      ->delimiter(',');
  cmd->add_option("--threads", options->threads, "Threads per backend, 1 to 256 (default: OMP_NUM_THREADS or all cores)")
      ->check(CLI::Range(1, 256));
  auto directions = std::make_shared<std::vector<std::string>>();
  cmd->add_option("--direction", *directions,
                  "What to time, comma-separated: forward (default), backward (the backward pass alone, after an untimed "
                  "forward), forward+backward; their FLOPs count 1, 2.5 and 3.5 times the forward's useful FLOPs")
      ->delimiter(',')
      ->check(CLI::IsMember({"forward", "backward", "forward+backward"}));
  cmd->add_option("--out", options->out, "Write Google Benchmark JSON (with the environment context) to this file");
  cmd->add_flag("!--no-peak", options->measure_peak, "Skip measuring the machine's peaks for the context");
  cmd->add_option("--max-seconds", options->max_seconds_per_call, "Skip a case whose estimated time per call is above this (default by preset: 2, 5, 60 s)");
  auto shard = std::make_shared<std::string>();
  cmd->add_option("--shard", *shard,
                  "Time shard K of N (1-based, e.g. 2/4) of the preset's benchmarks; without it, "
                  "GTEST_SHARD_INDEX/GTEST_TOTAL_SHARDS, then SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT, are read. "
                  "attn report pools the shards of one host");
  cmd->allow_extras();
  return [cmd, options, names, shard, directions]() {
    options->shard = shard_from(*shard, &options->shard_source);
    options->directions = bench::preset_directions(options->preset);
    if (!directions->empty()) {
      options->directions.clear();
      for (const std::string& d : *directions) {
        const bench::Direction parsed = bench::parse_direction(d);
        if (std::find(options->directions.begin(), options->directions.end(), parsed) == options->directions.end()) {
          options->directions.push_back(parsed);
        }
      }
    }
    warn_above_cpus(options->threads, "attn bench");
    if (options->measure_peak) options->peak = bench::measure_peak(options->threads);  // before any framework starts
    auto backends = make_backends(*names);
    options->context = environment_context(backends);
    return bench::run_benchmarks(backends, *options, cmd->remaining());
  };
}

}  // namespace attn::cli
