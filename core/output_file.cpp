#include "core/output_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "attnbench/error.hpp"

namespace attn {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const fs::path& path, const char* what, int error) {
  throw Error(fmt::format("{}: cannot {}: {}", path.string(), what, std::strerror(error)));
}

mode_t default_mode() {
  const mode_t mask = ::umask(0);
  ::umask(mask);
  return 0666 & ~mask;
}

// The absolute, normalised form of a path whose last parts may not exist yet.
fs::path canonical_as_possible(const fs::path& p) {
  std::error_code ec;
  fs::path weak = fs::weakly_canonical(fs::absolute(p, ec), ec);
  return ec ? fs::absolute(p).lexically_normal() : weak;
}

}  // namespace

OutputFile::OutputFile(fs::path path) : path_(std::move(path)) {
  std::error_code ec;
  const fs::file_status status = fs::status(path_, ec);
  if (fs::is_directory(status)) throw Error(fmt::format("{}: is a folder, not a file to write", path_.string()));
  if (fs::exists(status) && !fs::is_regular_file(status)) {
    in_place_ = true;
    temp_ = path_;
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd_ < 0) fail(path_, "open it for writing", errno);
    return;
  }
  const fs::path folder = path_.has_parent_path() ? path_.parent_path() : fs::path(".");
  fs::create_directories(folder, ec);
  if (ec) throw Error(fmt::format("{}: cannot create its folder: {}", path_.string(), ec.message()));
  std::string pattern = (folder / fmt::format(".{}.tmp-XXXXXX", path_.filename().string())).string();
  fd_ = ::mkstemp(pattern.data());
  if (fd_ < 0) fail(path_, "create a file in its folder", errno);
  temp_ = pattern;
  ::fchmod(fd_, default_mode());
  ::fcntl(fd_, F_SETFD, FD_CLOEXEC);
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !in_place_ && !temp_.empty()) ::unlink(temp_.c_str());
}

void OutputFile::write(std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(path_, "write", n < 0 ? errno : ENOSPC);
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

void OutputFile::commit() {
  // A library may have written the temporary through its own descriptor:
  // reopen-free fsync of ours covers the same file.
  if (!in_place_ && ::fsync(fd_) != 0) fail(path_, "sync", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail(path_, "close", errno);
  if (in_place_) {
    committed_ = true;
    return;
  }
  if (::rename(temp_.c_str(), path_.c_str()) != 0) fail(path_, "rename the finished file into place", errno);
  committed_ = true;
  const fs::path folder = path_.has_parent_path() ? path_.parent_path() : fs::path(".");
  if (int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

void write_whole_file(const fs::path& path, std::string_view content) {
  OutputFile file(path);
  file.write(content);
  file.commit();
}

void remove_stale_output(const fs::path& path) {
  std::error_code ec;
  if (fs::is_regular_file(fs::symlink_status(path, ec))) fs::remove(path, ec);
}

void check_outputs(const std::vector<fs::path>& outputs, const std::vector<fs::path>& inputs) {
  std::vector<fs::path> seen;
  for (const fs::path& out : outputs) {
    if (out.empty()) continue;
    const fs::path o = canonical_as_possible(out);
    for (const fs::path& s : seen) {
      if (s == o) throw Error(fmt::format("{}: named as two outputs; give each output its own file", out.string()));
    }
    for (const fs::path& in : inputs) {
      const fs::path i = canonical_as_possible(in);
      if (o == i) {
        throw Error(fmt::format("{}: is the input {}; write outputs elsewhere", out.string(), in.string()));
      }
      // Inside an input folder, a .h5 output would be read as a fixture next time.
      const auto [end, rest] = std::mismatch(i.begin(), i.end(), o.begin(), o.end());
      if (end == i.end() && o.extension() == ".h5") {
        throw Error(fmt::format("{}: is inside the input folder {}, where it would be read as a fixture",
                                out.string(), in.string()));
      }
    }
    seen.push_back(o);
    // Found now rather than after a long run: the nearest existing folder
    // (or the existing non-regular target, such as a device) must be writable.
    std::error_code ec;
    fs::path target = fs::absolute(out, ec);
    const auto status = fs::status(target, ec);
    if (fs::exists(status) && !fs::is_regular_file(status) && !fs::is_directory(status)) {
      if (::access(target.c_str(), W_OK) != 0) {
        throw Error(fmt::format("{}: cannot write it: {}", out.string(), std::strerror(errno)));
      }
      continue;
    }
    fs::path folder = target.parent_path();
    while (!folder.empty() && !fs::exists(folder, ec) && folder != folder.parent_path()) folder = folder.parent_path();
    if (!fs::is_directory(folder, ec)) {
      throw Error(fmt::format("{}: cannot create it: {} is not a folder", out.string(), folder.string()));
    }
    if (::access(folder.c_str(), W_OK | X_OK) != 0) {
      throw Error(fmt::format("{}: cannot create it in {}: {}", out.string(), folder.string(), std::strerror(errno)));
    }
  }
}

}  // namespace attn
