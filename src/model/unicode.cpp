#include "model/unicode.h"

#include <cstdlib>
#include <memory>

#include <utf8proc.h>

#include "core/error.h"

namespace lychee::unicode {

int utf8_decode(std::string_view s, size_t i, uint32_t* cp) {
  const auto b0 = uint8_t(s[i]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  int n;
  uint32_t c, min;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2, c = b0 & 0x1F, min = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3, c = b0 & 0x0F, min = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4, c = b0 & 0x07, min = 0x10000;
  } else {
    return 0;  // a continuation byte, C0/C1 (always overlong) or F5..FF
  }
  if (i + n > s.size()) return 0;
  for (int k = 1; k < n; ++k) {
    const auto b = uint8_t(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    c = (c << 6) | (b & 0x3F);
  }
  if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
  *cp = c;
  return n;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

namespace {

bool byte_is_printable(uint32_t b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct ByteTables {
  std::array<uint32_t, 256> to_cp{};
  std::array<std::string, 256> symbols;
  ByteTables() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      to_cp[b] = byte_is_printable(b) ? b : next++;
      utf8_append(symbols[b], to_cp[b]);
    }
  }
};

const ByteTables& byte_tables() {
  static const ByteTables tables;
  return tables;
}

}  // namespace

uint32_t byte_to_code_point(uint8_t b) { return byte_tables().to_cp[b]; }

int code_point_to_byte(uint32_t cp) {
  if (cp < 256) return byte_is_printable(cp) ? int(cp) : -1;
  if (cp >= 256 + 68) return -1;
  // U+0100 + k is the k-th non-printable byte.
  uint32_t k = cp - 256;
  for (uint32_t b = 0; b < 256; ++b) {
    if (byte_is_printable(b)) continue;
    if (k == 0) return int(b);
    --k;
  }
  return -1;
}

const std::array<std::string, 256>& byte_symbols() { return byte_tables().symbols; }

std::string bytes_to_symbols(std::string_view bytes) {
  const auto& sym = byte_symbols();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += sym[uint8_t(c)];
  return out;
}

std::string_view normal_form_name(NormalForm form) {
  switch (form) {
    case NormalForm::kNFC: return "NFC";
    case NormalForm::kNFD: return "NFD";
    case NormalForm::kNFKC: return "NFKC";
    case NormalForm::kNFKD: return "NFKD";
  }
  return "?";
}

namespace {

void normalize_valid_run(std::string_view run, NormalForm form, std::string& out) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNFC: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::kNFD: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::kNFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::kNFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(run.data()),
                   utf8proc_ssize_t(run.size()), &dst, utf8proc_option_t(options));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(dst, &std::free);
  LY_CHECK(n >= 0, ErrorCode::kInternal, "utf8proc {} failed on a valid UTF-8 run: {}",
           normal_form_name(form), utf8proc_errmsg(n));
  out.append(reinterpret_cast<const char*>(dst), size_t(n));
}

}  // namespace

std::string normalize(std::string_view s, NormalForm form) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    // A maximal well-formed run, normalised as a whole, then the invalid bytes after it.
    size_t j = i;
    uint32_t cp;
    for (int n; j < s.size() && (n = utf8_decode(s, j, &cp)) > 0;) j += size_t(n);
    if (j > i) normalize_valid_run(s.substr(i, j - i), form, out);
    for (; j < s.size() && utf8_decode(s, j, &cp) == 0; ++j) out += s[j];
    i = j;
  }
  return out;
}

bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

bool is_python_space(uint32_t cp) { return is_white_space(cp) || (cp >= 0x1C && cp <= 0x1F); }

bool is_word_char(uint32_t cp) {
  if (cp == '_') return true;
  switch (utf8proc_category(utf8proc_int32_t(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

std::string_view python_strip(std::string_view s) {
  size_t begin = 0;
  uint32_t cp;
  for (int n; begin < s.size() && (n = utf8_decode(s, begin, &cp)) > 0 && is_python_space(cp);)
    begin += size_t(n);
  size_t end = s.size();
  while (end > begin) {
    // Step back to the start of the last code point (at most 4 bytes).
    size_t start = end - 1;
    while (start > begin && end - start < 4 && (uint8_t(s[start]) & 0xC0) == 0x80) --start;
    const int n = utf8_decode(s, start, &cp);
    if (n <= 0 || start + size_t(n) != end || !is_python_space(cp)) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

}  // namespace lychee::unicode
