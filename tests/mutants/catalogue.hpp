// Every test-side broken backend (tests/mutants/CMakeLists.txt): what it
// breaks, the standard fixture that must catch it, and how to make one. The
// same list is compiled into attn-mutants, so each can be run by name like a
// real backend.
#pragma once

#include <memory>
#include <span>
#include <string_view>

#include "attnbench/backend.hpp"

namespace attn::testing {

struct MutantEntry {
  std::string_view name;
  std::string_view target;     // the real backend it is a copy of, or "flash" (flash_mutant.cpp)
  std::string_view caught_by;  // a fixture of fixtures/golden, without .h5
  std::string_view why;        // the bug, in words
  std::unique_ptr<Backend> (*make)();
};

std::span<const MutantEntry> mutants();

}  // namespace attn::testing
