// Backends from shared libraries loaded at run time, through the C ABI of
// include/attnbench/plugin.h. Each backend a plugin provides is added to the
// registry (core/registry.hpp) after the compiled-in ones.
#pragma once

#include <string>
#include <vector>

#include "core/registry.hpp"

namespace attn {

struct LoadedBackend {
  std::string name;
  BackendFactory make;
  std::string origin;  // "plugin PATH", for messages
};

// Loads PATH (dlopen), checks its ABI version and what it declares, and
// returns its backends for add_runtime_backend(). Throws Error naming the file
// and the problem (not found, not a plugin, another ABI version, a malformed
// declaration).
std::vector<LoadedBackend> load_plugin_library(const std::string& path);

}  // namespace attn
