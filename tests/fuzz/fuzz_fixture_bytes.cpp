// libFuzzer target, raw bytes: any file at all given to the fixture reader,
// which must read it or refuse it with an InputError. Debian 12's
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
#include "tests/fuzz/scratch_file.hpp"
#include "fixtures/fixture.hpp"

// attn verify reads a fixture in a child whose address space is limited
// (core/sandbox.cpp), so a size read from a damaged file (libhdf5's H5C_protect
// asks malloc for 20 GB on one) makes libhdf5's malloc return NULL and the file
// an input error. Under ASan no address-space limit works (its shadow takes
// terabytes), and a huge allocation touches its shadow (2.5 GB for 20 GB) before
// libFuzzer's malloc limit sees it: capping one allocation at 1 GiB and letting
// malloc return NULL gives the reader what the sandbox gives it. operator new
// still aborts past the cap, so an allocation of attnbench's own is a crash.
extern "C" const char* __asan_default_options() { return "max_allocation_size_mb=1024:allocator_may_return_null=1"; }

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const attn::fuzzing::ScratchFile scratch("attn_fuzz_bytes_");
  const std::filesystem::path& path = scratch.path();
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    attn::read_fixture(path);
  } catch (const attn::InputError&) {
  }
  return 0;
}
