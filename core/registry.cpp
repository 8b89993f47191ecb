#include "core/registry.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace attn {

std::vector<std::unique_ptr<Backend>> make_backends(std::span<const std::string> names) {
  std::vector<std::unique_ptr<Backend>> backends;
  if (names.empty()) {
    for (const auto& entry : backend_entries()) backends.push_back(entry.make());
    return backends;
  }
  for (const auto& name : names) {
    bool found = false;
    for (const auto& entry : backend_entries()) {
      if (entry.name == name) {
        backends.push_back(entry.make());
        found = true;
      }
    }
    if (!found) {
      std::vector<std::string_view> known;
      for (const auto& entry : backend_entries()) known.push_back(entry.name);
      throw Error(fmt::format("unknown backend '{}' (known: {})", name, fmt::join(known, ", ")));
    }
  }
  return backends;
}

}  // namespace attn
