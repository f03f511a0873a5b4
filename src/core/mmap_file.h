// A read-only memory-mapped file. Checkpoints are mapped, never read into buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace lychee {

class MappedFile {
 public:
  // Throws Error(kNotFound) if the file cannot be opened, kInvalidFile if it cannot be mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Reads a whole (small) text file; throws Error(kNotFound) naming the path.
std::string read_text_file(const std::string& path);

}  // namespace lychee
