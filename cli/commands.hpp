// The `attn` subcommands. Each registers itself on the CLI11 app and returns
// the process exit code from its run function: 0 success, 1 verification
// failure, 2 usage or input error.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace attn::cli {

using Runner = std::function<int()>;

Runner add_list_command(CLI::App& app);
Runner add_verify_command(CLI::App& app);
Runner add_fixtures_command(CLI::App& app);
Runner add_bench_command(CLI::App& app);
Runner add_show_command(CLI::App& app);
Runner add_peak_command(CLI::App& app);
Runner add_report_command(CLI::App& app);
Runner add_fuzz_command(CLI::App& app);
Runner add_merge_command(CLI::App& app);
Runner add_dropout_command(CLI::App& app);

// A data file of attnbench: under <prefix>/share/attnbench/ when this attn is
// installed (found from the executable's own path), else in the source tree.
std::string data_path(const std::string& share_relative, const std::string& source_relative);
// The standard fixtures (fixtures/golden), installed or in the source tree.
std::string default_fixtures();

// A measurement with more threads than CPUs times the oversubscription, not
// the backend: says so on stderr (threads 0 = the default, never warned).
void warn_above_cpus(int threads, const char* command);

}  // namespace attn::cli
