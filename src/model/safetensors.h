// safetensors reader: an 8-byte header length, a JSON header, then raw row-major tensor data.
// Validated strictly at open (header bounds, dtypes, shape x dtype size == bytes, offsets in
// range and not overlapping). Also reads sharded checkpoints through
// model.safetensors.index.json.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/mmap_file.h"

namespace lychee {

struct SafetensorsTensor {
  std::string name;
  std::string dtype_name;       // as written in the header, e.g. "BF16"
  std::optional<DType> dtype;   // set for the types lychee computes with (F32, F16, BF16, I32)
  std::vector<int64_t> shape;   // outermost first
  const uint8_t* data = nullptr;
  uint64_t n_bytes = 0;
  int64_t n_elems() const;
};

class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);
  // Parses bytes owned by the caller (they must outlive the object); for tests and fuzzing.
  static SafetensorsFile parse(std::span<const uint8_t> bytes, std::string name);

  const std::string& path() const { return name_; }
  const SafetensorsTensor* find(std::string_view name) const;
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  void parse_all(std::span<const uint8_t> bytes);

  std::unique_ptr<MappedFile> file_;
  std::string name_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint directory: model.safetensors, or shards listed by model.safetensors.index.json.
class SafetensorsCheckpoint {
 public:
  static SafetensorsCheckpoint open_dir(const std::string& dir);

  // The tensor and the path of the file that holds it; nullptr if absent.
  const SafetensorsTensor* find(std::string_view name, std::string* file = nullptr) const;
  std::vector<std::string> tensor_names() const;

 private:
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t, std::less<>> where_;  // tensor name -> files_ index
};

// Writes tensors (F32 only) to a safetensors file; used by tests and tools.
struct SafetensorsWriteItem {
  std::string name;
  std::vector<int64_t> shape;
  std::span<const float> data;
};
void write_safetensors_f32(const std::string& path, std::span<const SafetensorsWriteItem> items);

}  // namespace lychee
