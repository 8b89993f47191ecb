// The project's exception types. Every error a user can cause (bad input file,
// bad problem, bad option) is an attn::Error with a message that names what
// and where; the CLI turns it into exit code 2.
#pragma once

#include <stdexcept>
#include <string>

namespace attn {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Input data that violates the fixture format or the problem's rules.
class InputError : public Error {
 public:
  using Error::Error;
};

// Thrown by a backend's prepare() when the case's values (not its shape,
// which supports() judges) are beyond what the backend computes right, e.g.
// ALiBi slopes whose scores leave float32's range. The tools report SKIP with
// the message: a refusal, never a silent wrong answer, and not a FAIL.
class Unsupported : public Error {
 public:
  using Error::Error;
};

}  // namespace attn
