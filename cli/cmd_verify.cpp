// attn verify: every backend against every fixture, a table, and an exit code for CI.
#include <fmt/format.h>

#include <cstdlib>
#include <unistd.h>

#include <algorithm>

#include "cli/commands.hpp"
#include "verify/recorded.hpp"
#include "attnbench/error.hpp"
#include "core/output_file.hpp"
#include "core/registry.hpp"
#include "verify/exit_code.hpp"
#include "fixtures/fixture.hpp"
#include "verify/report.hpp"

namespace attn::cli {

namespace {
struct VerifyArgs {
  std::vector<std::string> paths;
  std::vector<std::string> backends;
  std::vector<std::string> tags;
  std::string json, junit;
  std::vector<int> threads;
  std::vector<std::string> layouts;
  bool quiet = false;
  bool allow_all_skipped = false;
  bool fail_on_mistrusted = false;
  std::string shard;
  std::string outputs, outputs_name = "outputs";
  std::vector<std::string> directions;
  std::vector<std::string> problems;
  std::vector<std::string> skip_checks;
  double memory_limit_gib = 0;
};
}  // namespace

Runner add_verify_command(CLI::App& app) {
  auto args = std::make_shared<VerifyArgs>();
  CLI::App* cmd = app.add_subcommand("verify", "Run backends on golden fixtures and compare with the float64 truth");
  cmd->add_option("paths", args->paths, "Fixture files or folders (default: the standard fixtures, " + default_fixtures() + ")");
  // One value per flag (repeat it, or give a comma-separated list): a flag never
  // takes the paths after it.
  cmd->add_option("-b,--backend", args->backends, "Backends to run, e.g. -b naive,streaming (default: all)")
      ->allow_extra_args(false)
      ->delimiter(',');
  cmd->add_option("-t,--tag", args->tags,
                  "Only fixtures that have any of these tags, e.g. --tag smoke,edge (smoke, full, long, edge, ...)")
      ->allow_extra_args(false)
      ->delimiter(',');
  cmd->add_option("--json", args->json, "Write the results as JSON to this file");
  cmd->add_option("--junit", args->junit, "Write the results as JUnit XML to this file");
  cmd->add_option("--threads", args->threads,
                  "Threads per backend, 1 to 256 (default: the backend's own); a comma-separated list runs every backend at "
                  "each; more than the CPUs is allowed (it reaches the split-K paths) and not warned about")
      ->allow_extra_args(false)
      ->delimiter(',')
      ->check(CLI::Range(1, 256));
  cmd->add_option("--layout", args->layouts,
                  "Feed the backends this layout instead of bhsd; a comma-separated list (bhsd,bshd) runs each")
      ->allow_extra_args(false)
      ->delimiter(',')
      ->check(CLI::IsMember({"bhsd", "bshd"}));
  cmd->add_flag("-q,--quiet", args->quiet, "Print only failures and the summary");
  cmd->add_flag("--allow-all-skipped", args->allow_all_skipped,
                "Exit 0 even when every backend skipped every case (by default such a run exits 1: nothing was verified)");
  cmd->add_flag("--fail-on-mistrusted", args->fail_on_mistrusted, "Exit 1 when any result is MISTRUSTED");
  cmd->add_option("--shard", args->shard,
                  "Run shard K of N (1-based, e.g. 2/4) of the (fixture, backend) units; without it, "
                  "GTEST_SHARD_INDEX/GTEST_TOTAL_SHARDS, then SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT, are read. "
                  "attn merge combines the shards' --json files");
  cmd->add_option("--outputs", args->outputs,
                  "Judge results another tool wrote: DIR/<fixture name>.h5 holding `out` (and optionally `lse`), or `y` "
                  "for a layer case, and for a version 3 case `dq`, `dk`, `dv` (`dbias`, `dsinks` where it has them), in "
                  "the fixture format's conventions; a missing file is SKIP. Alone it judges only these; with -b, those "
                  "backends too")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--direction", args->directions,
                  "Judge these directions: forward (out, lse, y) and backward (the gradients of format version 3 cases); "
                  "default both where a fixture has them")
      ->allow_extra_args(false)
      ->delimiter(',')
      ->check(CLI::IsMember({"forward", "backward"}));
  cmd->add_option("--outputs-name", args->outputs_name, "The name the --outputs results carry (default: outputs)");
  cmd->add_option("--problem", args->problems,
                  "Judge this problem instead of fixtures (repeatable; the fixture catalogue's syntax, e.g. "
                  "b=1,hq=8,hkv=1,sq=1,sk=131072,d=128,dtype=bf16): inputs drawn by the suite's generator, no golden, "
                  "only the checks that need none (batch invariance, the metamorphic relations), at any size")
      ->allow_extra_args(false);
  cmd->add_option("--skip-check", args->skip_checks,
                  "Leave out the checks that need no golden: invariance (batch invariance), relations (the metamorphic "
                  "relations); comma-separated")
      ->allow_extra_args(false)
      ->delimiter(',')
      ->check(CLI::IsMember({"invariance", "relations"}));
  cmd->add_option("--memory-limit", args->memory_limit_gib,
                  "GiB one case may take, estimated from its declared sizes before any work (default 2, or "
                  "ATTN_MAX_CASE_GIB; never more than the memory available or the address space left under ulimit -v); "
                  "a case beyond it is an input error naming the estimate")
      ->check(CLI::PositiveNumber);
  cmd->footer("Exit status: 0 when at least one case ran and nothing failed; 1 when something FAILED, when every "
              "case was skipped (unless --allow-all-skipped) or, with --fail-on-mistrusted, when a result was "
              "MISTRUSTED; 2 on a usage error or an input error (an unreadable or hostile fixture, a golden that is "
              "not the attention of its inputs), which every output still records.");
  return [args, argv0 = std::string("attn")]() {
    // Read wherever a case's memory is bounded (the loader, require_workspace, packed plans).
    if (args->memory_limit_gib > 0) ::setenv("ATTN_MAX_CASE_GIB", fmt::format("{}", args->memory_limit_gib).c_str(), 1);
    std::vector<std::filesystem::path> roots(args->paths.begin(), args->paths.end());
    if (!args->problems.empty() && (!roots.empty() || !args->outputs.empty())) {
      throw Error("--problem judges problems without fixtures: give no fixture paths and no --outputs with it");
    }
    std::vector<Problem> problems;
    for (const auto& text : args->problems) problems.push_back(Problem::parse(text));  // InputError: exit 2
    if (roots.empty()) roots.emplace_back(default_fixtures());
    check_outputs({args->json, args->junit}, roots);
    // An earlier run's results go now: a run that is interrupted leaves none that look current.
    for (const auto& out : {args->json, args->junit}) {
      if (!out.empty()) remove_stale_output(out);
    }
    RunInfo run = this_run(ATTN_VERSION, ATTN_GIT_COMMIT);
    auto files = problems.empty() ? find_fixture_files(roots) : std::vector<std::filesystem::path>{};
    if (files.empty() && problems.empty()) {
      std::vector<std::string> where;
      for (const auto& root : roots) where.push_back(printable(root.string()));
      throw Error(fmt::format("no fixture files (*.h5, *.hdf5) in {}", fmt::join(where, ", ")));
    }
    std::vector<std::unique_ptr<Backend>> backends;
    if (args->outputs.empty()) {
      backends = make_backends(args->backends);
    } else {
      if (args->threads.size() > 1 || args->layouts.size() > 1) {
        throw Error("--outputs judges results already computed: they have one thread count and one layout, so "
                    "--threads and --layout take one value at most here");
      }
      std::vector<std::string> names;
      for (const auto& n : args->backends) {
        if (n != args->outputs_name) names.push_back(n);
      }
      if (!names.empty()) backends = make_backends(names);
      backends.push_back(std::make_unique<RecordedOutputs>(args->outputs, args->outputs_name));
    }
    VerifyOptions options;
    std::string shard_source;
    options.shard = shard_from(args->shard, &shard_source);
    options.tags = args->tags;
    if (!args->directions.empty()) {
      const auto& d = args->directions;
      options.forward = std::find(d.begin(), d.end(), "forward") != d.end();
      options.backward = std::find(d.begin(), d.end(), "backward") != d.end();
    }
    options.invariance = options.relations = true;
    for (const auto& check : args->skip_checks) (check == "invariance" ? options.invariance : options.relations) = false;
    if (!problems.empty()) options.check_budget = 0;  // asked for by name, at any size
    options.thread_counts = args->threads;
    for (const auto& layout : args->layouts) options.layouts.push_back(layout == "bshd" ? Layout::bshd : Layout::bhsd);
    if (!args->quiet) print_outcome_header(stdout);
    const OutcomeCallback show = [&](const CaseOutcome& o) {
      if (!args->quiet || o.comparison.verdict == Verdict::fail) print_outcome(stdout, o);
      std::fflush(stdout);
    };
    VerifySummary summary =
        problems.empty() ? verify(files, backends, options, show) : verify_problems(problems, backends, options, show);
    std::string self = "build/bin/attn";
    char exe[4096];
    if (ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1); n > 0) self.assign(exe, static_cast<std::size_t>(n));
    print_summary(stdout, summary, self);
    describe_run(run, options, backends);
    run.shard_source = shard_source;
    if (!args->json.empty()) write_json(summary, args->json, run);
    if (!args->junit.empty()) write_junit(summary, args->junit, self, run);
    if (summary.shard) {
      fmt::print("shard {} ({}): {} of the suite's {} (fixture, backend) units\n", summary.shard->text(), shard_source,
                 summary.units_run, summary.units);
    }
    const ExitDecision exit = verification_exit(summary, {args->allow_all_skipped, args->fail_on_mistrusted,
                                                          summary.shard.has_value()});
    std::fflush(stdout);  // the summary first, then why it exits
    if (exit.code != 0 && !exit.why.empty()) fmt::print(stderr, "attn verify: {} (exit {})\n", exit.why, exit.code);
    return exit.code;
  };
}

}  // namespace attn::cli
