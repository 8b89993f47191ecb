// attn: verify and benchmark attention backends. See README.md.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <map>

#include "cli/commands.hpp"
#include "attnbench/error.hpp"
#include "core/plugin.hpp"
#include "core/text.hpp"
#include "core/cpu.hpp"
#ifdef ATTN_HAVE_PYTHON
#include "impls/python/bridge.hpp"
#endif

namespace {

// A plugin is a shared library (include/attnbench/plugin.h) or a Python
// backend file (impls/python/backends/attn_common.py); both add backends.
void load_plugin(const std::string& path) {
  const bool python = path.size() > 3 && path.compare(path.size() - 3, 3, ".py") == 0;
  if (!python) {
    for (auto& b : attn::load_plugin_library(path)) attn::add_runtime_backend(b.name, std::move(b.make), b.origin, path);
    return;
  }
#ifdef ATTN_HAVE_PYTHON
  attn::LoadedBackend b = attn::python::load_python_backend_file(path);
  attn::add_runtime_backend(b.name, std::move(b.make), b.origin, path);
#else
  throw attn::Error(fmt::format("Python backend {}: this attn was built without Python (ATTN_WITH_PYTHON=OFF)",
                                attn::printable(path)));
#endif
}

// ATTN_PLUGINS (':'-separated) first, then every --plugin in order.
void load_plugins(const std::vector<std::string>& flags) {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("ATTN_PLUGINS"); env != nullptr) {
    std::string text = env;
    std::size_t start = 0;
    while (start <= text.size()) {
      std::size_t end = text.find(':', start);
      if (end == std::string::npos) end = text.size();
      if (end > start) paths.push_back(text.substr(start, end - start));
      start = end + 1;
    }
  }
  paths.insert(paths.end(), flags.begin(), flags.end());
  for (const auto& path : paths) load_plugin(path);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"attn: verify and benchmark scaled-dot-product attention backends"};
  app.require_subcommand(1);
  app.footer("Exit status, for every command: 0 success; 1 a verdict failed (a FAIL, a run where everything was "
             "skipped, a regression); 2 a usage or input error; 3 an internal error (a bug of attnbench); 4 report "
             "--compare --fail-on-regression could not judge everything (too few repetitions, or machine limits differing beyond 1.5x) and found no regression.");
  app.set_version_flag("--version", "attn (attnbench) " ATTN_VERSION ", commit " ATTN_GIT_COMMIT ", " ATTN_BUILD_TYPE " build");
  std::vector<std::string> plugins;
  const std::string plugin_help =
      "Load backends from a plugin (a shared library of include/attnbench/plugin.h, or a Python backend file .py); "
      "repeatable; ATTN_PLUGINS (':'-separated) loads more";
  app.add_option("--plugin", plugins, plugin_help)->expected(1)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
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
  add(attn::cli::add_dropout_command);
  add(attn::cli::add_fixtures_command);
  add(attn::cli::add_bench_command);
  add(attn::cli::add_show_command);
  add(attn::cli::add_peak_command);
  add(attn::cli::add_report_command);
  // The commands that run backends take --plugin after their name too.
  for (const char* name : {"list", "verify", "fuzz", "bench", "show"}) {
    app.get_subcommand(name)
        ->add_option("--plugin", plugins, plugin_help)
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // The command that was being parsed, and a near option for a misspelt one.
    CLI::App* command = &app;
    std::string path = "attn";
    for (std::vector<CLI::App*> parsed = app.get_subcommands(); !parsed.empty(); parsed = command->get_subcommands()) {
      command = parsed.front();
      path += " " + command->get_name();
    }
    std::vector<std::string> names;
    for (const CLI::Option* option : command->get_options()) {
      for (const auto& name : option->get_lnames()) names.push_back("--" + name);
      for (const auto& name : option->get_snames()) names.push_back("-" + name);
    }
    for (const CLI::App* sub : command->get_subcommands({})) names.push_back(sub->get_name());
    std::string hint;
    for (const auto& word : command->remaining()) {
      const std::string flag = word.substr(0, word.find('='));
      if (hint.empty()) hint = attn::did_you_mean(flag, names);
    }
    fmt::print(stderr, "attn: error: {}{}\nattn: '{} --help' lists the options\n", attn::printable(e.what()), hint, path);
    return 2;
  }
  try {
    // A kernel set forced by ATTN_CPU_ISA is checked now, not when a kernel first runs.
    if (std::getenv("ATTN_CPU_ISA")) (void)attn::cpu_kernel_set();
    load_plugins(plugins);
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
