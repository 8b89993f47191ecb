// A backend from a Python object in a running interpreter (the attnbench
// extension module): the object follows the contract of a Python backend file
// (backends/attn_common.py), so `attnbench.verify` and `attn verify --plugin`
// judge a kernel through one and the same path.
#pragma once

#include <pybind11/pytypes.h>

#include <memory>

#include "attnbench/backend.hpp"
#include "attnbench/problem.hpp"

namespace attn::python {

// The problem as a backend's supports() and prepare() see it (a
// types.SimpleNamespace; attn_common.py documents its fields). The caller holds the GIL.
pybind11::object problem_object(const Problem& p);

// The caller holds the GIL. Throws Error when the object lacks the contract.
std::unique_ptr<Backend> make_python_backend_from_object(pybind11::object backend);

}  // namespace attn::python
