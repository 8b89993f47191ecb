// attn dropout: the dropout mask's tests over many seeds on one backend, to
// measure their false-alarm rate (the backend asked for the p tested) or
// their power (asked for another p): docs/verification/dropout.md.
#include <fmt/format.h>

#include <cmath>

#include "attnbench/error.hpp"
#include "cli/commands.hpp"
#include "core/registry.hpp"
#include "fixtures/suite.hpp"
#include "verify/dropout.hpp"

namespace attn::cli {

Runner add_dropout_command(CLI::App& app) {
  struct Args {
    std::string backend = "naive";
    std::string problem = "dtype=f32,b=2,hq=4,hkv=2,sq=128,sk=128,d=32";
    double p = 0.1, run_p = -1, significance = DropoutConstants::significance;
    std::int64_t seeds = 1000;
    std::uint64_t first_seed = 1;
    int threads = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("dropout", "Run the dropout mask's tests over many seeds: their false-alarm rate, or their power");
  cmd->add_option("-b,--backend", a->backend, "A backend that declares dropout")->capture_default_str();
  cmd->add_option("--problem", a->problem, "The case (a problem string; dense: no ragged or paged batch)")->capture_default_str();
  cmd->add_option("--p", a->p, "The dropout probability the tests expect")->check(CLI::Range(1e-9, 1 - 1e-9))->capture_default_str();
  cmd->add_option("--drop-with", a->run_p, "The probability the backend is asked for (default: --p; another value measures power)")
      ->check(CLI::Range(0.0, 1 - 1e-9));
  cmd->add_option("--seeds", a->seeds, "Runs, one seed each")->check(CLI::Range(std::int64_t{1}, std::int64_t{1000000}))->capture_default_str();
  cmd->add_option("--first-seed", a->first_seed, "The first run's seed; the others follow it")->capture_default_str();
  cmd->add_option("--significance", a->significance, "The tests' false-alarm rate together, per run")
      ->check(CLI::Range(1e-300, 0.5))->capture_default_str();
  cmd->add_option("--threads", a->threads, "Threads, 1 to 256 (default: OMP_NUM_THREADS or all cores)")->check(CLI::Range(1, 256));
  return [a]() {
    const Problem problem = Problem::parse(a->problem);
    if (problem.ragged || problem.paged()) throw InputError("attn dropout: --problem must be a dense batch (no ragged, no page_size)");
    if (problem.quantised()) throw InputError("attn dropout: --problem must not be quantised");
    auto backends = make_backends(std::vector<std::string>{a->backend});
    const Backend& backend = *backends.front();
    if (!backend.capabilities().dropout) throw InputError(fmt::format("attn dropout: {} does not declare dropout", a->backend));
    if (const Status ok = backend_accepts(backend, problem); !ok) {
      throw InputError(fmt::format("attn dropout: {} does not run {}: {}", a->backend, a->problem, ok.reason));
    }
    const CaseData data = generate_inputs(CaseSpec{"attn dropout", "", "", problem.to_string(), {}});
    const double run_p = a->run_p < 0 ? a->p : a->run_p;
    RunOptions options;
    options.threads = a->threads;
    const DropoutCalibration c =
        calibrate_dropout(backend, data, a->p, run_p, a->first_seed, a->seeds, a->significance, options);
    fmt::print("backend {} on {}: {} visible weights a run\n", a->backend, problem.to_string(), c.visible);
    fmt::print("asked for p = {:g}, tested against p = {:g} at significance {:g} ({} tests, each at {:g}), seeds {} to {}\n\n",
               run_p, a->p, a->significance, c.tests.size() - 1, a->significance / static_cast<double>(c.tests.size() - 1),
               a->first_seed, a->first_seed + static_cast<std::uint64_t>(a->seeds) - 1);
    fmt::print("{:<46} {:>8} {:>9}\n", "test", "failed", "rate");
    for (std::size_t t = 0; t < c.tests.size(); ++t) {
      fmt::print("{:<46} {:>8} {:>9.4f}\n", c.tests[t], c.failed_by_test[t],
                 static_cast<double>(c.failed_by_test[t]) / static_cast<double>(c.runs));
    }
    const double rate = static_cast<double>(c.failed) / static_cast<double>(c.runs);
    // Clopper-Pearson's one-sided 95% upper limit where no run failed: 1 - 0.05^(1/n).
    const std::string upper = c.failed == 0 ? fmt::format(" (at most {:.3g} with 95% confidence)",
                                                          1 - std::pow(0.05, 1.0 / static_cast<double>(c.runs)))
                                            : std::string();
    fmt::print("{:<46} {:>8} {:>9.4f}{}\n", "any test (the run's verdict)", c.failed, rate, upper);
    return 0;
  };
}

}  // namespace attn::cli
