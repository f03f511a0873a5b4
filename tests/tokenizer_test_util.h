// Helpers shared by the tokenizer and chat-template tests: golden paths, the default model's
// location, Rust's from_utf8_lossy (what HF's decode returns), and a writer of tiny GGUF files.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace lychee::test {

inline std::string golden_path(std::string_view rel) {
  return std::string(LYCHEE_TEST_DATA_DIR) + "/golden/" + std::string(rel);
}

// The default model's GGUF, or nullopt when it has not been fetched.
inline std::optional<std::string> smollm2_gguf() {
  std::string p = default_model_or_empty();
  if (p.empty()) return std::nullopt;
  return p;
}

// Rust's String::from_utf8_lossy: each maximal ill-formed subpart becomes one U+FFFD.
inline std::string utf8_lossy(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto b0 = uint8_t(s[i]);
    if (b0 < 0x80) {
      out += char(b0);
      ++i;
      continue;
    }
    int need = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) need = 1;
    else if (b0 == 0xE0) need = 2, lo = 0xA0;
    else if (b0 == 0xED) need = 2, hi = 0x9F;
    else if (b0 >= 0xE1 && b0 <= 0xEF) need = 2;
    else if (b0 == 0xF0) need = 3, lo = 0x90;
    else if (b0 == 0xF4) need = 3, hi = 0x8F;
    else if (b0 >= 0xF1 && b0 <= 0xF3) need = 3;
    size_t j = i + 1;
    bool ok = need > 0;
    for (int k = 0; k < need; ++k) {
      const uint8_t lo_k = k == 0 ? lo : 0x80, hi_k = k == 0 ? hi : 0xBF;
      if (j >= s.size() || uint8_t(s[j]) < lo_k || uint8_t(s[j]) > hi_k) {
        ok = false;
        break;
      }
      ++j;
    }
    if (ok) out.append(s.substr(i, j - i));
    else out += "\xEF\xBF\xBD";
    i = j;
  }
  return out;
}

// Writes GGUF v3 metadata (no tensors) for tests.
class GgufWriter {
 public:
  void add_string(std::string_view key, std::string_view value) {
    put_key(key, 8);
    put_str(value);
    ++n_kv_;
  }
  void add_u32(std::string_view key, uint32_t value) {
    put_key(key, 4);
    put_raw(value);
    ++n_kv_;
  }
  void add_bool(std::string_view key, bool value) {
    put_key(key, 7);
    body_ += char(value ? 1 : 0);
    ++n_kv_;
  }
  void add_strings(std::string_view key, const std::vector<std::string>& values) {
    put_key(key, 9);
    put_raw(uint32_t(8));
    put_raw(uint64_t(values.size()));
    for (const auto& v : values) put_str(v);
    ++n_kv_;
  }
  void add_i32s(std::string_view key, const std::vector<int32_t>& values) {
    put_key(key, 9);
    put_raw(uint32_t(5));
    put_raw(uint64_t(values.size()));
    for (int32_t v : values) put_raw(v);
    ++n_kv_;
  }
  void add_f32s(std::string_view key, const std::vector<float>& values) {
    put_key(key, 9);
    put_raw(uint32_t(6));
    put_raw(uint64_t(values.size()));
    for (float v : values) put_raw(v);
    ++n_kv_;
  }
  std::vector<uint8_t> bytes() const {
    std::string head = "GGUF";
    append_raw(head, uint32_t(3));
    append_raw(head, uint64_t(0));  // tensors
    append_raw(head, uint64_t(n_kv_));
    const std::string all = head + body_;
    return std::vector<uint8_t>(all.begin(), all.end());
  }

 private:
  template <typename T>
  static void append_raw(std::string& s, T v) {
    char buf[sizeof(T)];
    std::memcpy(buf, &v, sizeof(T));
    s.append(buf, sizeof(T));
  }
  template <typename T>
  void put_raw(T v) {
    append_raw(body_, v);
  }
  void put_str(std::string_view s) {
    put_raw(uint64_t(s.size()));
    body_.append(s);
  }
  void put_key(std::string_view key, uint32_t type) {
    put_str(key);
    put_raw(type);
  }
  std::string body_;
  uint64_t n_kv_ = 0;
};

}  // namespace lychee::test
