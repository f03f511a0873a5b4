// Unicode helpers for the tokenizer: strict UTF-8 decoding, the GPT-2 byte-level alphabet,
// normalisation through utf8proc, and the whitespace sets of Rust (char::is_whitespace) and
// Python (str.isspace) that HF tokenizers and Jinja's `trim` use.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace lychee::unicode {

// Decodes the code point at s[i]. Returns its length in bytes (1..4), or 0 when the bytes at i
// are not well-formed UTF-8 (overlong forms, surrogates, > U+10FFFF, truncated sequences), in
// which case *cp is left alone. Precondition: i < s.size().
int utf8_decode(std::string_view s, size_t i, uint32_t* cp);

// Appends the UTF-8 encoding of cp (cp <= U+10FFFF).
void utf8_append(std::string& out, uint32_t cp);

// Byte length of the code point at s[i], or 1 for a byte that starts no valid sequence.
inline size_t utf8_step(std::string_view s, size_t i) {
  uint32_t cp;
  const int n = utf8_decode(s, i, &cp);
  return n > 0 ? size_t(n) : 1;
}

// GPT-2's byte-to-unicode table: bytes 0x21..0x7E, 0xA1..0xAC and 0xAE..0xFF stand for
// themselves; the other 68 bytes map in order to U+0100, U+0101, ... (a fact of the format).
uint32_t byte_to_code_point(uint8_t b);
// The inverse, or -1 when cp is not one of the 256 symbols.
int code_point_to_byte(uint32_t cp);
// UTF-8 of the symbol of each byte.
const std::array<std::string, 256>& byte_symbols();
// The byte-level form of raw bytes: each byte replaced by the UTF-8 of its symbol.
std::string bytes_to_symbols(std::string_view bytes);

enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };
std::string_view normal_form_name(NormalForm form);

// Normalises the well-formed runs of s; bytes that are not valid UTF-8 pass through unchanged
// (HF never sees them: a Python str is always valid).
std::string normalize(std::string_view s, NormalForm form);

// Rust char::is_whitespace: the Unicode White_Space property.
bool is_white_space(uint32_t cp);
// Python str.isspace (White_Space plus U+001C..U+001F), for Jinja's `trim`.
bool is_python_space(uint32_t cp);
// Letters and numbers (\p{L}, \p{N}) plus '_', for added tokens marked single_word.
bool is_word_char(uint32_t cp);

// s without leading and trailing characters for which is_python_space holds.
std::string_view python_strip(std::string_view s);

}  // namespace lychee::unicode
