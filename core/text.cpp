#include "core/text.hpp"

#include <fmt/format.h>

namespace attn {

std::string valid_utf8(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const std::size_t length = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = length > 0 && i + length <= text.size() && !(length == 2 && c < 0xc2);
    for (std::size_t k = 1; ok && k < length; ++k) ok = (static_cast<unsigned char>(text[i + k]) >> 6) == 0x2;
    if (ok) {
      out.append(text.substr(i, length));
      i += length;
    } else {
      out += fmt::format("\\x{:02x}", c);
      ++i;
    }
  }
  return out;
}

std::string printable(std::string_view text) {
  std::string out;
  for (char ch : valid_utf8(text)) {
    const auto byte = static_cast<unsigned char>(ch);
    if (byte < 0x20 || byte == 0x7f) out += fmt::format("\\x{:02x}", byte);
    else out += ch;
  }
  return out;
}

std::string shell_quote(std::string_view raw) {
  const std::string text = printable(raw);
  bool safe = !text.empty();
  for (char ch : text) {
    const bool plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                       std::string_view("_-+./,:=@%").find(ch) != std::string_view::npos;
    if (!plain) safe = false;
  }
  if (safe) return text;
  std::string out = "'";
  for (char ch : text) {
    if (ch == '\'') out += "'\\''";
    else out += ch;
  }
  return out + "'";
}

}  // namespace attn
