#include "core/sandbox.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>

#include "attnbench/error.hpp"

namespace attn {

namespace {

double positive_env(const char* name, double fallback) {
  const char* text = std::getenv(name);
  if (!text) return fallback;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(value > 0)) {
    throw InputError(fmt::format("{}={}: expected a positive number", name, text));
  }
  return value;
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressLimitWorks = false;  // ASan reserves terabytes of shadow memory
#else
constexpr bool kAddressLimitWorks = true;
#endif

// The address space this process maps now (libraries, stacks, heaps, and
// what a framework in the same process reserved: PyTorch and JAX together
// reserve several GiB they never touch); 0 when /proc cannot tell.
double mapped_bytes() {
  double pages = 0;
  std::ifstream statm("/proc/self/statm");  // first field: pages mapped
  if (!(statm >> pages)) return 0;
  return pages * static_cast<double>(sysconf(_SC_PAGESIZE));
}

[[noreturn]] void child(const std::function<void()>& work, const SandboxLimits& limits, int fd) {
  if (kAddressLimitWorks) {
    // The reader may map memory_gib more than the process it was forked
    // from holds: a limit on the total would leave nothing to a reader
    // forked from a Python process with torch and JAX loaded.
    rlimit as{};
    getrlimit(RLIMIT_AS, &as);
    const double wanted = mapped_bytes() + limits.memory_gib * 1024.0 * 1024.0 * 1024.0;
    const auto bytes = static_cast<rlim_t>(std::min(wanted, 1.8e19));
    if (as.rlim_cur == RLIM_INFINITY || bytes < as.rlim_cur) {
      as.rlim_cur = bytes;
      as.rlim_max = bytes;
      setrlimit(RLIMIT_AS, &as);
    }
  }
  const auto cpu = static_cast<rlim_t>(limits.wall_seconds + 1);
  rlimit seconds{cpu, cpu};
  setrlimit(RLIMIT_CPU, &seconds);
  std::string message;
  try {
    work();
  } catch (const std::bad_alloc&) {
    message = fmt::format("needed more than the {} GiB of memory a reader may use (ATTN_READ_MEMORY_GIB raises it)",
                          limits.memory_gib);
  } catch (const std::exception& e) {
    message = e.what();
    if (message.empty()) message = "failed";
  } catch (...) {
    message = "failed";
  }
  std::size_t done = 0;
  while (done < message.size()) {
    const ssize_t n = ::write(fd, message.data() + done, message.size() - done);
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  ::_exit(message.empty() ? 0 : 3);
}

}  // namespace

SandboxLimits SandboxLimits::from_environment() {
  SandboxLimits limits;
  limits.wall_seconds = positive_env("ATTN_READ_SECONDS", limits.wall_seconds);
  limits.memory_gib = positive_env("ATTN_READ_MEMORY_GIB", limits.memory_gib);
  return limits;
}

std::string run_sandboxed(const std::function<void()>& work, const SandboxLimits& limits) {
  int fds[2];
  if (::pipe(fds) != 0) throw Error(fmt::format("cannot create a pipe: {}", std::strerror(errno)));
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw Error(fmt::format("cannot start a reader process: {}", std::strerror(errno)));
  }
  if (pid == 0) {
    ::close(fds[0]);
    child(work, limits, fds[1]);
  }
  ::close(fds[1]);
  std::string message;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(limits.wall_seconds);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    char buffer[4096];
    const ssize_t n = ::read(fds[0], buffer, sizeof buffer);
    if (n <= 0) break;  // the child closed its end: it is done
    if (message.size() < 65536) message.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return fmt::format("did not finish within {} s (ATTN_READ_SECONDS raises the limit)", limits.wall_seconds);
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    if (sig == SIGXCPU) return fmt::format("used more than {} s of CPU time", limits.wall_seconds + 1);
    return fmt::format("crashed the reader (signal {}, {})", sig, strsignal(sig));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {};
  return message.empty() ? fmt::format("the reader exited with status {}", WEXITSTATUS(status)) : message;
}

}  // namespace attn
