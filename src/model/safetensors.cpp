#include "model/safetensors.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include <fmt/ranges.h>

#include "core/error.h"

namespace lychee {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference implementation's limit

struct DtypeInfo {
  std::string_view name;
  int size;
  std::optional<DType> dtype;
};

constexpr DtypeInfo kDtypes[] = {
    {"F32", 4, DType::kF32}, {"F16", 2, DType::kF16}, {"BF16", 2, DType::kBF16},
    {"I32", 4, DType::kI32}, {"F64", 8, {}}, {"I64", 8, {}}, {"U64", 8, {}}, {"U32", 4, {}},
    {"I16", 2, {}}, {"U16", 2, {}}, {"I8", 1, {}}, {"U8", 1, {}}, {"BOOL", 1, {}},
    {"F8_E4M3", 1, {}}, {"F8_E5M2", 1, {}},
};

const DtypeInfo* find_dtype(std::string_view name) {
  for (const auto& d : kDtypes)
    if (d.name == name) return &d;
  return nullptr;
}

void read_metadata(const nlohmann::json& v, const std::string& file, std::map<std::string, std::string>& metadata) {
  LY_CHECK(v.is_object(), ErrorCode::kInvalidFile, "{}: __metadata__ is not an object", file);
  for (auto m = v.begin(); m != v.end(); ++m) {
    LY_CHECK(m.value().is_string(), ErrorCode::kInvalidFile,
             "{}: __metadata__ value '{}' is not a string", file, m.key());
    metadata[m.key()] = m.value().get<std::string>();
  }
}

// Appends the dimensions of `shape` to t.shape and returns their product.
uint64_t read_shape(const nlohmann::json& shape, const std::string& file, SafetensorsTensor& t) {
  uint64_t n_elems = 1;
  for (const nlohmann::json& d : shape) {
    LY_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
             ErrorCode::kInvalidFile, "{}: tensor '{}': shape entries must be non-negative integers",
             file, t.name);
    const uint64_t n = d.get<uint64_t>();
    LY_CHECK(n == 0 || n_elems <= (uint64_t(1) << 50) / n, ErrorCode::kInvalidFile,
             "{}: tensor '{}': shape is too large", file, t.name);
    n_elems *= n;
    t.shape.push_back(int64_t(n));
  }
  return n_elems;
}

// One header entry {"dtype", "shape", "data_offsets": [begin, end)}, offsets relative to the data
// section of data_size bytes at `data`.
SafetensorsTensor read_tensor_entry(const std::string& key, const nlohmann::json& v, const uint8_t* data,
                                    uint64_t data_size, const std::string& file) {
  LY_CHECK(v.is_object(), ErrorCode::kInvalidFile, "{}: tensor '{}': entry is not an object", file, key);
  LY_CHECK(v.contains("dtype") && v["dtype"].is_string(), ErrorCode::kInvalidFile,
           "{}: tensor '{}': missing or non-string 'dtype'", file, key);
  LY_CHECK(v.contains("shape") && v["shape"].is_array(), ErrorCode::kInvalidFile,
           "{}: tensor '{}': missing or non-array 'shape'", file, key);
  LY_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
           ErrorCode::kInvalidFile, "{}: tensor '{}': 'data_offsets' must be [begin, end]", file, key);
  SafetensorsTensor t;
  t.name = key;
  t.dtype_name = v["dtype"].get<std::string>();
  const DtypeInfo* info = find_dtype(t.dtype_name);
  LY_CHECK(info != nullptr, ErrorCode::kInvalidFile, "{}: tensor '{}': unknown dtype '{}'", file,
           key, t.dtype_name);
  t.dtype = info->dtype;
  const uint64_t n_elems = read_shape(v["shape"], file, t);
  const nlohmann::json& offs = v["data_offsets"];
  LY_CHECK(offs[0].is_number_unsigned() && offs[1].is_number_unsigned(), ErrorCode::kInvalidFile,
           "{}: tensor '{}': data_offsets must be non-negative integers", file, key);
  const uint64_t begin = offs[0].get<uint64_t>();
  const uint64_t end = offs[1].get<uint64_t>();
  LY_CHECK(begin <= end && end <= data_size, ErrorCode::kInvalidFile,
           "{}: tensor '{}': data_offsets [{}, {}) are outside the data section of {} bytes", file,
           key, begin, end, data_size);
  LY_CHECK(end - begin == n_elems * uint64_t(info->size), ErrorCode::kInvalidFile,
           "{}: tensor '{}': {} bytes for shape [{}] of {} (expected {})", file, key, end - begin,
           fmt::join(t.shape, ", "), t.dtype_name, n_elems * uint64_t(info->size));
  t.data = data + begin;
  t.n_bytes = end - begin;
  return t;
}

// Sorted by start (then length) so that any overlap shows between neighbours.
void check_disjoint(const std::vector<SafetensorsTensor>& tensors, const uint8_t* data, const std::string& file) {
  std::vector<const SafetensorsTensor*> by_offset;
  for (const auto& t : tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) {
    return a->data != b->data ? a->data < b->data : a->n_bytes < b->n_bytes;
  });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const auto* a = by_offset[k - 1];
    const auto* b = by_offset[k];
    LY_CHECK(a->data + a->n_bytes <= b->data, ErrorCode::kInvalidFile,
             "{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", file, a->name, a->data - data,
             a->data - data + a->n_bytes, b->name, b->data - data, b->data - data + b->n_bytes);
  }
}

}  // namespace

int64_t SafetensorsTensor::n_elems() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.file_ = std::make_unique<MappedFile>(path);
  f.name_ = path;
  f.parse_all(f.file_->bytes());
  return f;
}

SafetensorsFile SafetensorsFile::parse(std::span<const uint8_t> bytes, std::string name) {
  SafetensorsFile f;
  f.name_ = std::move(name);
  f.parse_all(bytes);
  return f;
}

void SafetensorsFile::parse_all(std::span<const uint8_t> bytes) {
  using nlohmann::json;
  LY_CHECK(bytes.size() >= 8, ErrorCode::kInvalidFile,
           "{}: truncated: {} bytes, too short for a safetensors header", name_, bytes.size());
  uint64_t n_header = 0;
  std::memcpy(&n_header, bytes.data(), 8);
  LY_CHECK(n_header <= kMaxHeaderBytes, ErrorCode::kInvalidFile,
           "{}: header length {} exceeds the {} byte limit", name_, n_header, kMaxHeaderBytes);
  LY_CHECK(n_header <= bytes.size() - 8, ErrorCode::kInvalidFile,
           "{}: header length {} runs past the end of the file ({} bytes)", name_, n_header,
           bytes.size());
  const auto* header_begin = reinterpret_cast<const char*>(bytes.data() + 8);
  json header = json::parse(header_begin, header_begin + n_header, nullptr, /*allow_exceptions=*/false);
  LY_CHECK(!header.is_discarded(), ErrorCode::kInvalidFile, "{}: header is not valid JSON", name_);
  LY_CHECK(header.is_object(), ErrorCode::kInvalidFile, "{}: header is not a JSON object", name_);

  const uint8_t* data = bytes.data() + 8 + n_header;
  const uint64_t data_size = bytes.size() - 8 - n_header;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    if (key == "__metadata__") {
      read_metadata(v, name_, metadata_);
      continue;
    }
    SafetensorsTensor t = read_tensor_entry(key, v, data, data_size, name_);
    index_.emplace(key, tensors_.size());
    tensors_.push_back(std::move(t));
  }
  check_disjoint(tensors_, data, name_);
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

SafetensorsCheckpoint SafetensorsCheckpoint::open_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  SafetensorsCheckpoint ck;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single_path = fs::path(dir) / "model.safetensors";
  if (fs::exists(index_path)) {
    const std::string text = read_text_file(index_path.string());
    nlohmann::json index = nlohmann::json::parse(text, nullptr, false);
    LY_CHECK(!index.is_discarded() && index.is_object(), ErrorCode::kInvalidFile,
             "{}: not valid JSON", index_path.string());
    LY_CHECK(index.contains("weight_map") && index["weight_map"].is_object(), ErrorCode::kInvalidFile,
             "{}: missing object 'weight_map'", index_path.string());
    std::map<std::string, size_t> shard_ids;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      LY_CHECK(it.value().is_string(), ErrorCode::kInvalidFile,
               "{}: weight_map['{}'] is not a file name", index_path.string(), it.key());
      const std::string shard = it.value().get<std::string>();
      LY_CHECK(shard.find('/') == std::string::npos && shard != ".." && !shard.empty(),
               ErrorCode::kInvalidFile, "{}: weight_map['{}'] names '{}', not a file in the directory",
               index_path.string(), it.key(), shard);
      auto [pos, inserted] = shard_ids.emplace(shard, ck.files_.size());
      if (inserted) ck.files_.push_back(SafetensorsFile::open((fs::path(dir) / shard).string()));
      const SafetensorsFile& f = ck.files_[pos->second];
      LY_CHECK(f.find(it.key()) != nullptr, ErrorCode::kInvalidFile,
               "{}: index says tensor '{}' is in this shard, but it is not", f.path(), it.key());
      ck.where_[it.key()] = pos->second;
    }
  } else {
    LY_CHECK(fs::exists(single_path), ErrorCode::kNotFound,
             "{}: no model.safetensors or model.safetensors.index.json", dir);
    ck.files_.push_back(SafetensorsFile::open(single_path.string()));
    for (const auto& t : ck.files_[0].tensors()) ck.where_[t.name] = 0;
  }
  return ck;
}

const SafetensorsTensor* SafetensorsCheckpoint::find(std::string_view name, std::string* file) const {
  auto it = where_.find(name);
  if (it == where_.end()) return nullptr;
  const SafetensorsFile& f = files_[it->second];
  if (file != nullptr) *file = f.path();
  return f.find(name);
}

std::vector<std::string> SafetensorsCheckpoint::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, _] : where_) names.push_back(name);
  return names;
}

void write_safetensors_f32(const std::string& path, std::span<const SafetensorsWriteItem> items) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& item : items) {
    int64_t n = 1;
    for (int64_t d : item.shape) n *= d;
    LY_CHECK(n == int64_t(item.data.size()), ErrorCode::kInvalidArgument,
             "write_safetensors_f32: '{}' has {} values for a shape of {} elements", item.name,
             item.data.size(), n);
    header[item.name] = {{"dtype", "F32"}, {"shape", item.shape},
                         {"data_offsets", {offset, offset + uint64_t(n) * 4}}};
    offset += uint64_t(n) * 4;
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  std::ofstream out(path, std::ios::binary);
  LY_CHECK(out.good(), ErrorCode::kNotFound, "{}: cannot open for writing", path);
  const uint64_t n_header = text.size();
  out.write(reinterpret_cast<const char*>(&n_header), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (const auto& item : items)
    out.write(reinterpret_cast<const char*>(item.data.data()), std::streamsize(item.data.size() * 4));
  LY_CHECK(out.good(), ErrorCode::kInvalidFile, "{}: write failed", path);
}

}  // namespace lychee
