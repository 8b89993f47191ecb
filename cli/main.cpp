// attn: verify and benchmark attention backends. See README.md.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <map>

#include "cli/commands.hpp"
#include "core/error.hpp"
#include "core/text.hpp"

int main(int argc, char** argv) {
  CLI::App app{"attn: verify and benchmark scaled-dot-product attention backends"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "attn (attnbench) " ATTN_VERSION ", commit " ATTN_GIT_COMMIT ", " ATTN_BUILD_TYPE " build");
  std::map<CLI::App*, attn::cli::Runner> runners;
  auto add = [&](attn::cli::Runner (*adder)(CLI::App&)) {
    std::size_t before = app.get_subcommands({}).size();
    attn::cli::Runner runner = adder(app);
    runners[app.get_subcommands({})[before]] = std::move(runner);
  };
  add(attn::cli::add_list_command);
  add(attn::cli::add_verify_command);
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
