// libFuzzer target, raw bytes: any file at all given to the fixture reader,
// which must read it or refuse it with an InputError. Not in CI: Debian 12's
// libhdf5 1.10.8 itself crashes or hangs on some damaged files (a global heap,
// issue 13), which `attn verify` contains by reading each fixture first in a
// limited child process (core/sandbox.cpp); this target finds those too.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "attnbench/error.hpp"
#include "fixtures/fixture.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("attn_fuzz_bytes_" + std::to_string(::getpid()) + ".h5");
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    attn::read_fixture(path);
  } catch (const attn::InputError&) {
  }
  return 0;
}
