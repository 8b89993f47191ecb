// attn merge SHARD.json...: the verify JSON of shards (from a CI matrix or a
// Slurm array, on one host or many) as one JSON, one JUnit and one exit code.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>

#include "cli/commands.hpp"
#include "attnbench/error.hpp"
#include "core/output_file.hpp"
#include "verify/exit_code.hpp"
#include "verify/merge.hpp"
#include "verify/report.hpp"

namespace attn::cli {

namespace {
struct MergeArgs {
  std::vector<std::string> files;
  std::string json, junit;
  bool allow_mixed = false, allow_all_skipped = false, fail_on_mistrusted = false;
};
}  // namespace

Runner add_merge_command(CLI::App& app) {
  auto args = std::make_shared<MergeArgs>();
  CLI::App* cmd = app.add_subcommand("merge", "Combine the verify --json files of shards (and hosts) into one verdict");
  cmd->add_option("files", args->files, "The --json files of attn verify --shard K/N, every shard of every host")
      ->required();
  cmd->add_option("--json", args->json, "Write the merged results as JSON (schemas/verify.schema.json)");
  cmd->add_option("--junit", args->junit, "Write the merged results as JUnit XML (schemas/junit.xsd)");
  cmd->add_flag("--allow-mixed", args->allow_mixed, "Merge shards of different suites, commits or options anyway");
  cmd->add_flag("--allow-all-skipped", args->allow_all_skipped, "Exit 0 even when every case of every shard was skipped");
  cmd->add_flag("--fail-on-mistrusted", args->fail_on_mistrusted, "Exit 1 when any result is MISTRUSTED");
  cmd->footer("Exit status: attn verify's rule over the union of the shards: 0 when at least one case ran and nothing "
              "failed; 1 when something FAILED, everything was skipped (unless --allow-all-skipped) or, with "
              "--fail-on-mistrusted, a result was MISTRUSTED; 2 when an input error was recorded, or a shard is "
              "missing, given twice, or of another suite, commit or options.");
  return [args]() {
    std::vector<std::filesystem::path> inputs(args->files.begin(), args->files.end());
    check_outputs({args->json, args->junit}, inputs);
    for (const auto& out : {args->json, args->junit}) {
      if (!out.empty()) remove_stale_output(out);
    }
    MergeOptions options;
    options.allow_mixed = args->allow_mixed;
    const Merged merged = merge_shards(inputs, options);
    std::string self = "attn";
    char exe[4096];
    if (ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1); n > 0) self.assign(exe, static_cast<std::size_t>(n));
    print_summary(stdout, merged.summary, self);
    if (!args->json.empty()) {
      write_whole_file(args->json,
                       merged.doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    }
    if (!args->junit.empty()) write_junit(merged.summary, args->junit, self, merged.run);
    fmt::print("merged {} files: {} results\n", inputs.size(), merged.summary.outcomes.size());
    const ExitDecision exit = verification_exit(merged.summary, {args->allow_all_skipped, args->fail_on_mistrusted});
    std::fflush(stdout);  // the summary first, then why it exits
    if (exit.code != 0 && !exit.why.empty()) fmt::print(stderr, "attn merge: {} (exit {})\n", exit.why, exit.code);
    return exit.code;
  };
}

}  // namespace attn::cli
