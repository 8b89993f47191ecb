// Text from untrusted places (fixture names, paths, HDF5 messages) made safe
// for where it goes: a terminal, a shell command line, XML or JSON.
#pragma once

#include <string>
#include <string_view>

namespace attn {

// Bytes that do not form valid UTF-8 become \xNN; valid UTF-8 is kept.
std::string valid_utf8(std::string_view text);

// For a terminal: valid_utf8, and control characters (tab and newline too) and
// DEL as \xNN, so no escape sequence or line break reaches the screen raw.
std::string printable(std::string_view text);

// One shell word: unchanged when it holds only safe characters, otherwise in
// single quotes (printable first, so the command can be pasted).
std::string shell_quote(std::string_view text);

}  // namespace attn
