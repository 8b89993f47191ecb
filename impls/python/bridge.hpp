// Backends written in Python, run by an embedded CPython (pybind11). A Python
// backend is a file that implements the contract of backends/attn_common.py:
//
//   NAME, DESCRIPTION                     strings; DTYPES optional (all four when absent)
//   available() -> None | str            None, or why it cannot run here
//   supports(problem) -> None | str      None, or why it does not handle it
//   conventions(problem) -> [(code, why)]   optional: known differences from the format
//   prepare(problem, io, threads) -> run  everything untimed; run() is timed
//   HAS_LSE                              optional, default False
//
// io holds zero-copy numpy views of the inputs and the output (bfloat16 as raw
// uint16). The interpreter is the one attn was built with (Debian's python3);
// ATTN_PYTHON_VENV names a virtual environment of the same Python version
// whose packages come first (scripts/install-python-peers makes one).
#pragma once

#include <memory>
#include <string>

#include "attnbench/backend.hpp"
#include "core/plugin.hpp"

namespace attn::python {

// A backend from the Python file `file` (a built-in one is found in the
// installed or source backends folder by its file name).
std::unique_ptr<Backend> make_python_backend(const std::string& file);

// Loads a user's Python backend file; its backend is named by its NAME.
// Throws Error naming the file and the problem.
LoadedBackend load_python_backend_file(const std::string& path);

}  // namespace attn::python
