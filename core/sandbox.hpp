// Running untrusted work (reading a fixture with libhdf5) where it cannot take
// the process down: in a forked child with limits on address space, CPU time
// and wall time. A crash, a limit or a timeout comes back as a message.
#pragma once

#include <functional>
#include <string>

namespace attn {

struct SandboxLimits {
  double wall_seconds = 60;   // ATTN_READ_SECONDS
  double memory_gib = 8;      // ATTN_READ_MEMORY_GIB: address space the child may map beyond its parent's (not under ASan)
  static SandboxLimits from_environment();  // defaults, overridden by the variables above
};

// Runs `work` in a child process. Returns "" when it returned normally;
// otherwise what went wrong: the message of the exception it threw, the
// signal that killed it, or the limit it ran into.
std::string run_sandboxed(const std::function<void()>& work, const SandboxLimits& limits);

}  // namespace attn
