// Running the attn binary from a test as a user or CI runs it: the exit code
// and everything it printed (stdout and stderr together).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace attn::test {

struct CliRun {
  int code;
  std::string output;
};

inline CliRun run_attn_with(const std::string& environment, const std::string& args) {
  std::string command = (environment.empty() ? "" : "env " + environment + " ") + std::string(ATTN_CLI) + " " + args +
                        " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  std::array<char, 4096> buffer;
  while (std::size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe)) output.append(buffer.data(), n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

inline CliRun run_attn(const std::string& args) { return run_attn_with("", args); }

// The same with variables set for this one command.
inline CliRun run_attn_env(const std::string& environment, const std::string& args) {
  return run_attn_with(environment, args);
}

}  // namespace attn::test
