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

}  // namespace attn
