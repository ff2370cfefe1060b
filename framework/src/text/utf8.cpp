#include "text/utf8.h"

#include <array>

namespace ztrain::text {
namespace {

// The length a lead byte announces (0: not a lead byte).
std::size_t announced(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}

// Valid UTF-8 (no overlong forms, surrogates or code points past U+10FFFF)
// of length n at `at`.
bool valid(std::string_view s, std::size_t at, std::size_t n) {
  if (n == 0 || at + n > s.size()) return false;
  const auto b = [&](std::size_t i) { return static_cast<unsigned char>(s[at + i]); };
  for (std::size_t i = 1; i < n; ++i)
    if ((b(i) & 0xC0) != 0x80) return false;
  if (n == 3 && b(0) == 0xE0 && b(1) < 0xA0) return false;
  if (n == 3 && b(0) == 0xED && b(1) >= 0xA0) return false;
  if (n == 4 && b(0) == 0xF0 && b(1) < 0x90) return false;
  if (n == 4 && b(0) == 0xF4 && b(1) >= 0x90) return false;
  return true;
}

const std::array<char32_t, 256>& byte_chars() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool itself = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      t[static_cast<std::size_t>(b)] = itself ? static_cast<char32_t>(b) : extra++;
    }
    return t;
  }();
  return table;
}

}  // namespace

std::size_t utf8_length(std::string_view s, std::size_t at) {
  const std::size_t n = announced(static_cast<unsigned char>(s[at]));
  return valid(s, at, n) ? n : 1;
}

std::optional<std::size_t> first_invalid_utf8(std::string_view s) {
  for (std::size_t at = 0; at < s.size();) {
    const std::size_t n = announced(static_cast<unsigned char>(s[at]));
    if (!valid(s, at, n)) return at;
    at += n;
  }
  return std::nullopt;
}

char32_t code_point(std::string_view s, std::size_t at) {
  const std::size_t n = announced(static_cast<unsigned char>(s[at]));
  if (!valid(s, at, n)) return 0xFFFD;
  const auto b = [&](std::size_t i) {
    return static_cast<char32_t>(static_cast<unsigned char>(s[at + i]));
  };
  switch (n) {
    case 1:
      return b(0);
    case 2:
      return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3:
      return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default:
      return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// Bytes of the invalid sequence at `at` that one U+FFFD replaces, as
// Rust's from_utf8_lossy counts them: the lead byte and those following
// bytes that could still have continued it (a stray byte is one alone).
std::size_t invalid_prefix(std::string_view s, std::size_t at) {
  const auto c = static_cast<unsigned char>(s[at]);
  const std::size_t n = announced(c);
  std::size_t k = 1;
  for (; k < n && at + k < s.size(); ++k) {
    const auto d = static_cast<unsigned char>(s[at + k]);
    unsigned char lo = 0x80, hi = 0xBF;
    if (k == 1 && c == 0xE0) lo = 0xA0;
    if (k == 1 && c == 0xED) hi = 0x9F;
    if (k == 1 && c == 0xF0) lo = 0x90;
    if (k == 1 && c == 0xF4) hi = 0x8F;
    if (d < lo || d > hi) break;
  }
  return k;
}

std::string lossy_utf8(std::string_view bytes) {
  std::string out;
  for (std::size_t at = 0; at < bytes.size();) {
    const std::size_t n = announced(static_cast<unsigned char>(bytes[at]));
    if (valid(bytes, at, n)) {
      out.append(bytes.substr(at, n));
      at += n;
      continue;
    }
    append_utf8(out, 0xFFFD);
    at += invalid_prefix(bytes, at);
  }
  return out;
}

char32_t byte_char(std::uint8_t b) {
  return byte_chars()[b];
}

int char_byte(char32_t c) {
  static const std::array<int, 324> inverse = [] {
    std::array<int, 324> t{};
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_chars()[static_cast<std::size_t>(b)]] = b;
    return t;
  }();
  return c < inverse.size() ? inverse[c] : -1;
}

std::string byte_level(std::string_view s) {
  std::string out;
  out.reserve(s.size() * 2);
  for (const char c : s) append_utf8(out, byte_char(static_cast<std::uint8_t>(c)));
  return out;
}

}  // namespace ztrain::text
