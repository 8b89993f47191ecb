// attn list: every backend in this build, whether it can run here, and what it supports.
#include <fmt/format.h>

#include <filesystem>

#include "cli/commands.hpp"
#include "core/registry.hpp"

namespace attn::cli {

std::string data_path(const std::string& share_relative, const std::string& source_relative) {
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    std::filesystem::path installed = exe.parent_path().parent_path() / "share" / "attnbench" / share_relative;
    if (std::filesystem::exists(installed, ec)) return installed.string();
  }
  return std::string(ATTN_SOURCE_DIR) + "/" + source_relative;
}

std::string default_fixtures() { return data_path("fixtures/golden", "fixtures/golden"); }

Runner add_list_command(CLI::App& app) {
  app.add_subcommand("list", "List the backends of this build, their availability and what they support");
  return [] {
    auto backends = make_backends();
    fmt::print("{:<14} {:<26} {}\n", "backend", "available", "description");
    for (const auto& backend : backends) {
      Status available = backend->available();
      std::string state = available ? "yes" : fmt::format("no: {}", available.reason);
      fmt::print("{:<14} {:<26} {}\n", backend->name(), state, backend->description());
      fmt::print("{:<14} {:<26} supports: {}\n", "", "", describe_capabilities(backend->capabilities()));
    }
    return 0;
  };
}

}  // namespace attn::cli
