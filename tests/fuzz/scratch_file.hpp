// A fuzz target's scratch file: <temp>/<prefix><pid>.h5, one per process,
// removed when the process exits (left behind only by a crash, with the
// input that caused it).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace attn::fuzzing {

class ScratchFile {
 public:
  explicit ScratchFile(const char* prefix)
      : path_(std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()) + ".h5")) {}
  ~ScratchFile() {
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace attn::fuzzing
