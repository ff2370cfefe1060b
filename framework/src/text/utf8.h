// UTF-8 helpers for the tokenizers: character lengths, code points, and
// Hugging Face's ByteLevel alphabet (each byte as a printable character).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ztrain::text {

// Bytes of the UTF-8 character at `at` (1 for a byte that starts none, so
// invalid input still advances).
std::size_t utf8_length(std::string_view s, std::size_t at);
// The code point at `at` (U+FFFD for an invalid sequence).
char32_t code_point(std::string_view s, std::size_t at);
void append_utf8(std::string& out, char32_t c);
// The offset of the first byte of `s` that is not part of valid UTF-8;
// nullopt when all of it is.
std::optional<std::size_t> first_invalid_utf8(std::string_view s);
// `bytes` as valid UTF-8: each invalid sequence becomes U+FFFD, as Rust's
// String::from_utf8_lossy (and so Hugging Face's decoders) does.
std::string lossy_utf8(std::string_view bytes);

// GPT-2's bytes_to_unicode: bytes 33-126, 161-172 and 174-255 are
// themselves, the others U+0100 on, in byte order.
char32_t byte_char(std::uint8_t b);
// Its inverse; -1 for a character that is not one.
int char_byte(char32_t c);
// Every byte of `s` as its ByteLevel character.
std::string byte_level(std::string_view s);

}  // namespace ztrain::text
