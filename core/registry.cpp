#include "core/registry.hpp"

#include <filesystem>

#include <fmt/format.h>

#include <mutex>

#include "attnbench/error.hpp"
#include "core/text.hpp"

namespace attn {

namespace {

struct RuntimeEntry {
  std::string name;
  BackendFactory make;
  std::string origin;  // where it came from, for messages
  std::string file;    // the plugin or Python file, absolute, or ""
};

struct RuntimeList {
  std::mutex mutex;
  std::vector<RuntimeEntry> entries;
};

RuntimeList& runtime_list() {
  static RuntimeList list;
  return list;
}

bool valid_backend_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-' || c == '+';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

void add_runtime_backend(const std::string& name, BackendFactory make, const std::string& origin,
                         const std::string& file) {
  if (!valid_backend_name(name)) {
    throw Error(fmt::format("{}: backend name '{}' is not 1 to 64 of [A-Za-z0-9._+-]", origin, printable(name)));
  }
  for (const auto& entry : backend_entries()) {
    if (entry.name == name) {
      throw Error(fmt::format("{}: backend name '{}' is taken by a backend built into attn", origin, name));
    }
  }
  RuntimeList& list = runtime_list();
  std::lock_guard lock(list.mutex);
  for (const auto& entry : list.entries) {
    if (entry.name == name) {
      throw Error(fmt::format("{}: backend name '{}' is taken by {}", origin, name, entry.origin));
    }
  }
  std::error_code ec;
  std::string absolute = file.empty() ? std::string() : std::filesystem::absolute(file, ec).string();
  if (ec) absolute = file;
  list.entries.push_back({name, std::move(make), origin, std::move(absolute)});
}

std::string plugin_arguments(std::string_view backend_name) {
  RuntimeList& list = runtime_list();
  std::lock_guard lock(list.mutex);
  for (const auto& entry : list.entries) {
    if (entry.name == backend_name && !entry.file.empty()) return " --plugin " + shell_quote(entry.file);
  }
  return {};
}

std::vector<std::unique_ptr<Backend>> make_backends(std::span<const std::string> names) {
  RuntimeList& list = runtime_list();
  std::lock_guard lock(list.mutex);
  std::vector<std::unique_ptr<Backend>> backends;
  if (names.empty()) {
    for (const auto& entry : backend_entries()) backends.push_back(entry.make());
    for (const auto& entry : list.entries) backends.push_back(entry.make());
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
    for (const auto& entry : list.entries) {
      if (entry.name == name) {
        backends.push_back(entry.make());
        found = true;
      }
    }
    if (!found) {
      std::vector<std::string> known;
      for (const auto& entry : backend_entries()) known.emplace_back(entry.name);
      for (const auto& entry : list.entries) known.push_back(entry.name);
      throw Error(fmt::format("unknown backend '{}'{} (known: {})", printable(name), did_you_mean(name, known),
                              fmt::join(known, ", ")));
    }
  }
  return backends;
}

}  // namespace attn
