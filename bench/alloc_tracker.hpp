// Counts the bytes the process holds on the heap (every malloc, including
// those of OpenBLAS and oneDNN), so a benchmark can report the peak extra
// memory of a call. Active only in the attn binary, and not in sanitizer
// builds (which own malloc themselves): there `available()` is false.
#pragma once

#include <cstdint>

namespace attn::bench {

struct AllocTracker {
  static bool available();
  static std::int64_t current_bytes();
  static void reset_peak();  // peak := current
  static std::int64_t peak_bytes();
};

}  // namespace attn::bench
