// Outputs written whole or not at all. A result file (JSON, JUnit, benchmark
// JSON, a generated fixture) becomes visible under its name only once it is
// complete: it is written to a new file beside it, every write and the close
// checked, synced, and renamed over the name. A failure is an attn::Error
// naming the file (exit 2) and leaves no half file under the name.
#pragma once

#include <filesystem>
#include <string_view>
#include <vector>

namespace attn {

class OutputFile {
 public:
  // Creates the folder and the temporary. When `path` exists and is not a
  // regular file (a device such as /dev/stdout or /dev/full, a FIFO) there is
  // nothing to rename over, and it is written in place.
  explicit OutputFile(std::filesystem::path path);
  ~OutputFile();  // removes the temporary unless committed
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // Where the content goes (for libraries that open a path themselves).
  const std::filesystem::path& temp_path() const { return temp_; }
  void write(std::string_view bytes);  // appends, checking every write
  // Syncs and renames the temporary over the final name.
  void commit();

 private:
  std::filesystem::path path_, temp_;
  int fd_ = -1;
  bool in_place_ = false, committed_ = false;
};

// The whole of `content` under `path`, or an Error and nothing there.
void write_whole_file(const std::filesystem::path& path, std::string_view content);

// An earlier run's result under `path` (a regular file) is removed when a run
// starts, so a run that is interrupted leaves nothing that looks current.
void remove_stale_output(const std::filesystem::path& path);

// Throws Error when two outputs name the same file, or an output is one of
// the inputs, or a .h5 output lies inside an input folder (it would be read
// as a fixture by the next run).
void check_outputs(const std::vector<std::filesystem::path>& outputs, const std::vector<std::filesystem::path>& inputs);

}  // namespace attn
