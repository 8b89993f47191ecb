// attn list: every backend in this build, whether it can run here, and what it supports.
#include <fmt/format.h>

#include "cli/commands.hpp"
#include "core/registry.hpp"

namespace attn::cli {

Runner add_list_command(CLI::App& app) {
  app.add_subcommand("list", "List the backends of this build, their availability and what they support");
  return [] {
    auto backends = make_backends();
    fmt::print("{:<14} {:<26} {}\n", "backend", "available", "description");
    for (const auto& backend : backends) {
      Status available = backend->available();
      std::string state = available ? "yes" : fmt::format("no: {}", available.reason);
      fmt::print("{:<14} {:<26} {}\n", backend->name(), state, backend->description());
      fmt::print("{:<14} {:<26} supports: {}\n", "", "", backend->capabilities());
    }
    return 0;
  };
}

}  // namespace attn::cli
