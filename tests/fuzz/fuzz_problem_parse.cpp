// libFuzzer target: the problem-string parser. Any text either parses to a
// valid problem whose canonical string parses back to the same problem, or
// is refused with an InputError; nothing else may happen.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "attnbench/error.hpp"
#include "attnbench/problem.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const attn::Problem p = attn::Problem::parse(text);
    if (!(attn::Problem::parse(p.to_string()) == p)) std::abort();  // the canonical string must round-trip
  } catch (const attn::InputError&) {
  }
  return 0;
}
