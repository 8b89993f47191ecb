// Text from untrusted places (fixture names, paths, HDF5 messages) made safe
// for where it goes: a terminal, a shell command line, XML or JSON.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace attn {

// Bytes that do not form valid UTF-8 become \xNN; valid UTF-8 is kept.
std::string valid_utf8(std::string_view text);

// For a terminal: valid_utf8, and control characters (tab and newline too) and
// DEL as \xNN, so no escape sequence or line break reaches the screen raw.
std::string printable(std::string_view text);

// One shell word: unchanged when it holds only safe characters, otherwise in
// single quotes (printable first, so the command can be pasted).
std::string shell_quote(std::string_view text);

// " (did you mean 'X'?)" for the candidate nearest to a misspelt word (at most
// a third of its letters edited, and two at least), or "" when none is close.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

// Splits text into lines of at most `width` characters at spaces (a word
// longer than the width gets a line of its own); at least one line.
std::vector<std::string> wrap_words(std::string_view text, std::size_t width);

}  // namespace attn
