#include "core/backend.hpp"

#include <chrono>

namespace attn {

double Plan::run_timed() {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace attn
