// GGUF (v2/v3) reader: metadata key/values and tensor infos, validated strictly at open.
// Tensor data stay in the mapping; dims are kept in ggml order (ne[0] is the innermost).
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

enum class GgufType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

std::string_view gguf_type_name(GgufType t);

struct GgufValue {
  GgufType type = GgufType::kU8;
  // Scalars (set according to type).
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0.0;
  std::string_view str;  // kString: points into the mapping
  // Arrays: element type and elements (scalars widened, strings as views).
  GgufType elem_type = GgufType::kU8;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string_view> strs;
  uint64_t count = 0;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> ne;  // ggml order: ne[0] innermost (contiguous)
  DType dtype = DType::kF32;
  uint64_t offset = 0;       // relative to the data section
  const uint8_t* data = nullptr;
  uint64_t n_bytes = 0;
  int64_t n_elems() const;
};

class GgufFile {
 public:
  // Maps and parses a file. Throws Error naming the file and the field on any problem.
  static GgufFile open(const std::string& path);
  // Parses bytes owned by the caller (they must outlive the object); for tests and fuzzing.
  static GgufFile parse(std::span<const uint8_t> bytes, std::string name);

  const std::string& path() const { return name_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }

  bool has(std::string_view key) const;
  const GgufValue* find(std::string_view key) const;
  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return kv_; }

  // Typed getters; they throw Error(kInvalidFile) naming the key when the type does not fit,
  // and Error(kNotFound) when a required key is missing.
  uint64_t get_uint(std::string_view key) const;
  std::optional<uint64_t> get_uint_opt(std::string_view key) const;
  double get_float(std::string_view key) const;
  std::optional<double> get_float_opt(std::string_view key) const;
  std::optional<bool> get_bool_opt(std::string_view key) const;
  std::string_view get_string(std::string_view key) const;
  std::optional<std::string_view> get_string_opt(std::string_view key) const;
  const std::vector<std::string_view>& get_string_array(std::string_view key) const;
  const std::vector<int64_t>& get_int_array(std::string_view key) const;
  const std::vector<double>& get_float_array(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;

 private:
  GgufFile() = default;
  void parse_all(std::span<const uint8_t> bytes);

  std::unique_ptr<MappedFile> file_;
  std::string name_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  std::map<std::string, GgufValue, std::less<>> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace lychee
