// attn: verify and benchmark attention backends. See README.md.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <map>

#include "cli/commands.hpp"
#include "core/error.hpp"
#include "core/text.hpp"
#include "impls/cpu_kernels/kernels.hpp"

int main(int argc, char** argv) {
  CLI::App app{"attn: verify and benchmark scaled-dot-product attention backends"};
  app.require_subcommand(1);
  app.footer("Exit status, for every command: 0 success; 1 a verdict failed (a FAIL, a run where everything was "
             "skipped, a regression); 2 a usage or input error; 3 an internal error (a bug of attnbench); 4 report "
             "--compare --fail-on-regression could not judge everything (too few repetitions) and found no regression.");
  app.set_version_flag("--version", "attn (attnbench) " ATTN_VERSION ", commit " ATTN_GIT_COMMIT ", " ATTN_BUILD_TYPE " build");
  std::map<CLI::App*, attn::cli::Runner> runners;
  auto add = [&](attn::cli::Runner (*adder)(CLI::App&)) {
    std::size_t before = app.get_subcommands({}).size();
    attn::cli::Runner runner = adder(app);
    runners[app.get_subcommands({})[before]] = std::move(runner);
  };
  add(attn::cli::add_list_command);
  add(attn::cli::add_verify_command);
  add(attn::cli::add_merge_command);
  add(attn::cli::add_fuzz_command);
  add(attn::cli::add_fixtures_command);
  add(attn::cli::add_bench_command);
  add(attn::cli::add_show_command);
  add(attn::cli::add_peak_command);
  add(attn::cli::add_report_command);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    // A kernel set forced by ATTN_CPU_ISA is checked now, not when a kernel first runs.
    if (std::getenv("ATTN_CPU_ISA")) (void)attn::cpu::best_kernels();
    for (auto& [command, runner] : runners) {
      if (command->parsed()) return runner();
    }
  } catch (const attn::Error& e) {
    fmt::print(stderr, "attn: error: {}\n", attn::printable(e.what()));
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "attn: internal error: {}\n", attn::printable(e.what()));
    return 3;
  }
  return 2;
}
