// attn fuzz: random problems judged as attn verify judges fixtures; each
// backend's first failure is shrunk and written as a fixture.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include "cli/commands.hpp"
#include "attnbench/error.hpp"
#include "core/registry.hpp"
#include "core/text.hpp"
#include "verify/fuzz.hpp"

namespace attn::cli {

namespace {
struct FuzzArgs {
  std::uint64_t seed = 1;
  std::int64_t cases = 200;
  double minutes = 0;
  std::vector<std::string> backends;
  std::string out = "fuzz-failures";
  int max_shrink = 600;
  bool layers = false;
};

std::string self_path() {
  char exe[4096];
  if (ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1); n > 0) return std::string(exe, static_cast<std::size_t>(n));
  return "attn";
}
}  // namespace

Runner add_fuzz_command(CLI::App& app) {
  auto args = std::make_shared<FuzzArgs>();
  CLI::App* cmd = app.add_subcommand(
      "fuzz", "Random problems (every dtype, shape, mask, layout, thread count), judged as verify judges fixtures");
  cmd->add_option("--seed", args->seed, "Seed of the draw: the same seed gives the same cases on every machine")
      ->capture_default_str();
  cmd->add_option("--cases", args->cases, "How many cases to draw")->capture_default_str()->check(CLI::Range(1, 100000000));
  cmd->add_option("--minutes", args->minutes, "Stop drawing after this long (0: no limit)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("-b,--backend", args->backends, "Backends to fuzz, e.g. -b streaming,blocked (default: all)")
      ->allow_extra_args(false)
      ->delimiter(',');
  cmd->add_flag("--layers", args->layers,
               "Draw only whole multi-head attention layers (kind mha: projections, masks, key padding, own key and "
               "value widths, mixed precision, the layer's gradients); without it, 1 case in 16 is one");
  cmd->add_option("--out", args->out, "Folder for the shrunk failing cases (fixture files)")->capture_default_str();
  cmd->add_option("--max-shrink", args->max_shrink, "Cases judged at most while shrinking one failure")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));
  cmd->footer("Exit status: 0 when no backend failed a case; 1 when one did (each failure is shrunk and written "
              "under --out with the command that reproduces it); 2 on a usage error.");
  return [args]() {
    auto backends = make_backends(args->backends);
    FuzzOptions options;
    options.seed = args->seed;
    options.cases = args->cases;
    options.minutes = args->minutes;
    options.out_dir = args->out;
    options.max_shrink_evaluations = args->max_shrink;
    options.layers_only = args->layers;
    std::vector<std::string> names;
    for (const auto& b : backends) names.emplace_back(b->name());
    fmt::print("attn fuzz: seed {}, up to {}{} cases{}, backends: {}\n", options.seed, options.cases,
               options.layers_only ? " layer" : "", options.minutes > 0 ? fmt::format(" or {} minutes", options.minutes) : "",
               fmt::join(names, ", "));
    std::fflush(stdout);
    FuzzSummary summary = run_fuzz(backends, options, [](const std::string& line) {
      fmt::print("{}\n", line);
      std::fflush(stdout);
    });
    fmt::print("\n{:<24} {:>7} {:>7} {:>7}\n", "backend", "PASS", "SKIP", "FAIL");
    for (std::size_t b = 0; b < summary.backends.size(); ++b) {
      bool failed = false;
      for (const auto& f : summary.failures) failed = failed || f.backend == summary.backends[b];
      fmt::print("{:<24} {:>7} {:>7} {:>7}\n", summary.backends[b], summary.passed[b], summary.skipped[b],
                 failed ? "yes" : "-");
    }
    fmt::print("{} cases drawn (seed {})\n", summary.cases, options.seed);
    if (summary.failures.empty()) return 0;
    const std::string self = self_path();
    fmt::print("\nTo reproduce a failure:\n");
    for (const auto& f : summary.failures) {
      const FuzzCase& c = f.shrunk.smallest;
      const std::string plugin = plugin_arguments(f.backend);  // a plugin's backend needs its --plugin again
      fmt::print("  {} verify {} --backend {} --threads {} --layout {}{}\n", self,
                 shell_quote(std::filesystem::absolute(f.file).string()), shell_quote(f.backend),
                 fmt::join(c.thread_counts(), ","), layout_name(c.layout), plugin);
      fmt::print("  {} fuzz --seed {} --cases {}{} --backend {}{}   (draws it again)\n", self, args->seed, f.index + 1,
                 args->layers ? " --layers" : "", shell_quote(f.backend), plugin);
    }
    return 1;
  };
}

}  // namespace attn::cli
