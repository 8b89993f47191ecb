// The naive backend: the textbook algorithm (materialised score row, softmax
// with max subtraction, P V) in the case's precision, accumulating in float32
// for 16-bit types and float64 for float64. Every rule of the fixture format.
//
// Broken variants for the verifier's own tests are built from this file by
// tests/mutants (a patched copy each); nothing here knows of them.
#pragma once

#include <memory>

#include "attnbench/backend.hpp"

namespace attn {

std::unique_ptr<Backend> make_naive_backend();

}  // namespace attn
