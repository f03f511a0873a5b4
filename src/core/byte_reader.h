// Bounds-checked little-endian reads from a byte span, for the strict file parsers. Every read
// names the file and the field it was reading when it runs past the end.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "core/error.h"

namespace lychee {

class ByteReader {
 public:
  ByteReader(std::span<const uint8_t> bytes, std::string_view file) : bytes_(bytes), file_(file) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }

  template <typename T>
  T read(std::string_view what) {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string_view read_bytes(uint64_t n, std::string_view what) {
    need(n, what);
    std::string_view s(reinterpret_cast<const char*>(bytes_.data() + pos_), size_t(n));
    pos_ += size_t(n);
    return s;
  }

  void skip(uint64_t n, std::string_view what) {
    need(n, what);
    pos_ += size_t(n);
  }

 private:
  void need(uint64_t n, std::string_view what) const {
    LY_CHECK(n <= remaining(), ErrorCode::kInvalidFile,
             "{}: truncated while reading {} at byte {} (needs {} bytes, {} left)", file_, what,
             pos_, n, remaining());
  }

  std::span<const uint8_t> bytes_;
  std::string_view file_;
  size_t pos_ = 0;
};

}  // namespace lychee
