#include "model/gguf.h"

#include <algorithm>
#include <limits>

#include "core/byte_reader.h"
#include "core/error.h"

namespace lychee {

namespace {

constexpr int kMaxDims = 4;  // GGML_MAX_DIMS

// Size of a scalar GGUF value; 0 for strings and arrays.
size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kBool: return 1;
    case GgufType::kU16: case GgufType::kI16: return 2;
    case GgufType::kU32: case GgufType::kI32: case GgufType::kF32: return 4;
    case GgufType::kU64: case GgufType::kI64: case GgufType::kF64: return 8;
    default: return 0;
  }
}

bool is_integer(GgufType t) {
  return t == GgufType::kU8 || t == GgufType::kI8 || t == GgufType::kU16 || t == GgufType::kI16 ||
         t == GgufType::kU32 || t == GgufType::kI32 || t == GgufType::kU64 || t == GgufType::kI64;
}

// ggml_type ids of the tensor types we dequantise.
std::optional<DType> ggml_type_to_dtype(uint32_t t) {
  switch (t) {
    case 0: return DType::kF32;
    case 1: return DType::kF16;
    case 2: return DType::kQ4_0;
    case 3: return DType::kQ4_1;
    case 8: return DType::kQ8_0;
    case 12: return DType::kQ4_K;
    case 13: return DType::kQ5_K;
    case 14: return DType::kQ6_K;
    case 15: return DType::kQ8_K;
    case 30: return DType::kBF16;
    default: return std::nullopt;
  }
}

std::string ggml_type_label(uint32_t t) {
  static constexpr const char* kNames[] = {
      "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
      "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
      "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M", "BF16"};
  if (t < std::size(kNames)) return fmt::format("{} ({})", kNames[t], t);
  return fmt::format("type {}", t);
}

struct Parser {
  ByteReader r;
  const std::string& file;

  std::string_view read_string(std::string_view what) {
    const uint64_t n = r.read<uint64_t>(what);
    return r.read_bytes(n, what);
  }

  void read_scalar(GgufType t, GgufValue& v, std::string_view what) {
    switch (t) {
      case GgufType::kU8: v.u = r.read<uint8_t>(what); v.i = int64_t(v.u); break;
      case GgufType::kI8: v.i = r.read<int8_t>(what); v.u = uint64_t(v.i); break;
      case GgufType::kU16: v.u = r.read<uint16_t>(what); v.i = int64_t(v.u); break;
      case GgufType::kI16: v.i = r.read<int16_t>(what); v.u = uint64_t(v.i); break;
      case GgufType::kU32: v.u = r.read<uint32_t>(what); v.i = int64_t(v.u); break;
      case GgufType::kI32: v.i = r.read<int32_t>(what); v.u = uint64_t(v.i); break;
      case GgufType::kU64: v.u = r.read<uint64_t>(what); v.i = int64_t(v.u); break;
      case GgufType::kI64: v.i = r.read<int64_t>(what); v.u = uint64_t(v.i); break;
      case GgufType::kF32: v.f = r.read<float>(what); break;
      case GgufType::kF64: v.f = r.read<double>(what); break;
      case GgufType::kBool: {
        const uint8_t b = r.read<uint8_t>(what);
        LY_CHECK(b <= 1, ErrorCode::kInvalidFile, "{}: {} has bool value {}", file, what, b);
        v.u = b;
        v.i = b;
        break;
      }
      case GgufType::kString: v.str = read_string(what); break;
      default: LY_ASSERT(false);
    }
  }

  GgufType read_type(std::string_view what) {
    const uint32_t t = r.read<uint32_t>(what);
    LY_CHECK(t <= uint32_t(GgufType::kF64), ErrorCode::kInvalidFile, "{}: {} has unknown value type {}",
             file, what, t);
    return GgufType(t);
  }

  GgufValue read_value(GgufType t, const std::string& key) {
    GgufValue v;
    v.type = t;
    const std::string what = fmt::format("metadata '{}'", key);
    if (t != GgufType::kArray) {
      read_scalar(t, v, what);
      return v;
    }
    v.elem_type = read_type(what + " (array type)");
    LY_CHECK(v.elem_type != GgufType::kArray, ErrorCode::kUnsupported,
             "{}: {} is a nested array, which lychee does not read", file, what);
    v.count = r.read<uint64_t>(what + " (array length)");
    // Every element takes at least one byte (8 for a string's length): bound the count by the
    // bytes left before allocating anything.
    const size_t min_elem = v.elem_type == GgufType::kString ? 8 : scalar_size(v.elem_type);
    LY_CHECK(v.count <= r.remaining() / min_elem, ErrorCode::kInvalidFile,
             "{}: {} claims {} elements, more than the {} bytes left", file, what, v.count,
             r.remaining());
    GgufValue e;
    if (v.elem_type == GgufType::kString) {
      v.strs.reserve(v.count);
      for (uint64_t k = 0; k < v.count; ++k) v.strs.push_back(read_string(what));
    } else if (v.elem_type == GgufType::kF32 || v.elem_type == GgufType::kF64) {
      v.floats.reserve(v.count);
      for (uint64_t k = 0; k < v.count; ++k) {
        read_scalar(v.elem_type, e, what);
        v.floats.push_back(e.f);
      }
    } else {
      v.ints.reserve(v.count);
      for (uint64_t k = 0; k < v.count; ++k) {
        read_scalar(v.elem_type, e, what);
        v.ints.push_back(e.i);
      }
    }
    return v;
  }

  // Tensor info #k: name, shape (ne[0] innermost), ggml type and data offset; the offset is
  // relative to the data section, which is not known until every info has been read.
  GgufTensorInfo read_tensor_info(uint64_t k, uint32_t alignment) {
    GgufTensorInfo t;
    t.name = std::string(read_string(fmt::format("name of tensor #{}", k)));
    const std::string what = fmt::format("tensor '{}'", t.name);
    const uint32_t n_dims = r.read<uint32_t>(what + " n_dims");
    LY_CHECK(n_dims >= 1 && n_dims <= kMaxDims, ErrorCode::kInvalidFile,
             "{}: {} has {} dimensions (expected 1..{})", file, what, n_dims, kMaxDims);
    int64_t n_elems = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = r.read<uint64_t>(what + " shape");
      LY_CHECK(ne >= 1 && ne <= (uint64_t(1) << 40) && uint64_t(n_elems) <= (uint64_t(1) << 50) / ne,
               ErrorCode::kInvalidFile, "{}: {} has an invalid dimension {}", file, what, ne);
      t.ne.push_back(int64_t(ne));
      n_elems *= int64_t(ne);
    }
    const uint32_t ggml_type = r.read<uint32_t>(what + " type");
    const auto dtype = ggml_type_to_dtype(ggml_type);
    LY_CHECK(dtype.has_value(), ErrorCode::kUnsupported,
             "{}: {} has unsupported type {} (lychee reads F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, "
             "Q5_K, Q6_K, Q8_K)", file, what, ggml_type_label(ggml_type));
    t.dtype = *dtype;
    LY_CHECK(t.ne[0] % dtype_block_elems(t.dtype) == 0, ErrorCode::kInvalidFile,
             "{}: {} has row length {}, not a multiple of the {} block size {}", file, what,
             t.ne[0], dtype_name(t.dtype), dtype_block_elems(t.dtype));
    t.n_bytes = uint64_t(dtype_bytes(t.dtype, n_elems));
    t.offset = r.read<uint64_t>(what + " offset");
    LY_CHECK(t.offset % alignment == 0, ErrorCode::kInvalidFile,
             "{}: {} offset {} is not a multiple of the alignment {}", file, what, t.offset,
             alignment);
    return t;
  }
};

// Points every tensor at its bytes once the header is read, rejecting tensors that run past the
// end of the file or overlap one another.
void place_tensors(std::span<const uint8_t> bytes, uint64_t header_end, uint32_t alignment,
                   std::vector<GgufTensorInfo>& tensors, const std::string& file) {
  // The data section starts at the next multiple of the alignment after the header.
  const uint64_t data_start = (header_end + alignment - 1) / alignment * alignment;
  LY_CHECK(data_start <= bytes.size() || tensors.empty(), ErrorCode::kInvalidFile,
           "{}: data section would start at byte {}, past the end of the file ({} bytes)", file,
           data_start, bytes.size());
  const uint64_t data_size = data_start <= bytes.size() ? bytes.size() - data_start : 0;

  std::vector<const GgufTensorInfo*> by_offset;
  for (GgufTensorInfo& t : tensors) {
    LY_CHECK(t.offset <= data_size && t.n_bytes <= data_size - t.offset, ErrorCode::kInvalidFile,
             "{}: tensor '{}' spans bytes [{}, {}) of the data section, which has {} bytes", file,
             t.name, t.offset, t.offset + t.n_bytes, data_size);
    t.data = bytes.data() + data_start + t.offset;
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const auto* a = by_offset[k - 1];
    const auto* b = by_offset[k];
    LY_CHECK(a->offset + a->n_bytes <= b->offset, ErrorCode::kInvalidFile,
             "{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", file, a->name, a->offset,
             a->offset + a->n_bytes, b->name, b->offset, b->offset + b->n_bytes);
  }
}

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  static constexpr const char* kNames[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                           "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = uint32_t(t);
  return i < std::size(kNames) ? kNames[i] : "?";
}

int64_t GgufTensorInfo::n_elems() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

GgufFile GgufFile::open(const std::string& path) {
  GgufFile g;
  g.file_ = std::make_unique<MappedFile>(path);
  g.name_ = path;
  g.parse_all(g.file_->bytes());
  return g;
}

GgufFile GgufFile::parse(std::span<const uint8_t> bytes, std::string name) {
  GgufFile g;
  g.name_ = std::move(name);
  g.parse_all(bytes);
  return g;
}

void GgufFile::parse_all(std::span<const uint8_t> bytes) {
  Parser p{ByteReader(bytes, name_), name_};
  const std::string_view magic = p.r.read_bytes(4, "magic");
  LY_CHECK(magic == "GGUF", ErrorCode::kInvalidFile, "{}: not a GGUF file (magic is not 'GGUF')",
           name_);
  version_ = p.r.read<uint32_t>("version");
  LY_CHECK(version_ == 2 || version_ == 3, ErrorCode::kUnsupported,
           "{}: GGUF version {} is not supported (expected 2 or 3)", name_, version_);
  const uint64_t n_tensors = p.r.read<uint64_t>("tensor count");
  const uint64_t n_kv = p.r.read<uint64_t>("metadata count");
  // A key/value takes at least 8 + 4 + 1 bytes and a tensor info at least 8 + 4 + 8 + 4 + 8.
  LY_CHECK(n_kv <= p.r.remaining() / 13, ErrorCode::kInvalidFile,
           "{}: header claims {} metadata entries, more than the file can hold", name_, n_kv);
  LY_CHECK(n_tensors <= p.r.remaining() / 32, ErrorCode::kInvalidFile,
           "{}: header claims {} tensors, more than the file can hold", name_, n_tensors);

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key(p.read_string(fmt::format("metadata key #{}", k)));
    const GgufType t = p.read_type(fmt::format("type of metadata '{}'", key));
    GgufValue v = p.read_value(t, key);
    LY_CHECK(!kv_.contains(key), ErrorCode::kInvalidFile, "{}: duplicate metadata key '{}'", name_,
             key);
    kv_.emplace(std::move(key), std::move(v));
  }

  if (const GgufValue* a = find("general.alignment")) {
    LY_CHECK(is_integer(a->type) && a->u > 0 && a->u <= (1u << 16) && (a->u & (a->u - 1)) == 0,
             ErrorCode::kInvalidFile, "{}: general.alignment must be a power of two, got {}", name_,
             a->u);
    alignment_ = uint32_t(a->u);
  }

  tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo t = p.read_tensor_info(k, alignment_);
    LY_CHECK(!tensor_index_.contains(t.name), ErrorCode::kInvalidFile, "{}: duplicate tensor '{}'",
             name_, t.name);
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }
  place_tensors(bytes, p.r.pos(), alignment_, tensors_, name_);
}

bool GgufFile::has(std::string_view key) const { return kv_.find(key) != kv_.end(); }

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

namespace {
const GgufValue& require(const GgufFile& g, std::string_view key) {
  const GgufValue* v = g.find(key);
  LY_CHECK(v != nullptr, ErrorCode::kNotFound, "{}: metadata key '{}' is missing", g.path(), key);
  return *v;
}
}  // namespace

std::optional<uint64_t> GgufFile::get_uint_opt(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  LY_CHECK(is_integer(v->type) && v->i >= 0, ErrorCode::kInvalidFile,
           "{}: metadata '{}' should be a non-negative integer, got type {}", name_, key,
           gguf_type_name(v->type));
  return v->u;
}

uint64_t GgufFile::get_uint(std::string_view key) const {
  require(*this, key);
  return *get_uint_opt(key);
}

std::optional<double> GgufFile::get_float_opt(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type == GgufType::kF32 || v->type == GgufType::kF64) return v->f;
  if (is_integer(v->type)) return double(v->i);
  fail(ErrorCode::kInvalidFile, "{}: metadata '{}' should be a number, got type {}", name_, key,
       gguf_type_name(v->type));
}

double GgufFile::get_float(std::string_view key) const {
  require(*this, key);
  return *get_float_opt(key);
}

std::optional<bool> GgufFile::get_bool_opt(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  LY_CHECK(v->type == GgufType::kBool, ErrorCode::kInvalidFile,
           "{}: metadata '{}' should be a bool, got type {}", name_, key, gguf_type_name(v->type));
  return v->u != 0;
}

std::optional<std::string_view> GgufFile::get_string_opt(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  LY_CHECK(v->type == GgufType::kString, ErrorCode::kInvalidFile,
           "{}: metadata '{}' should be a string, got type {}", name_, key, gguf_type_name(v->type));
  return v->str;
}

std::string_view GgufFile::get_string(std::string_view key) const {
  require(*this, key);
  return *get_string_opt(key);
}

const std::vector<std::string_view>& GgufFile::get_string_array(std::string_view key) const {
  const GgufValue& v = require(*this, key);
  LY_CHECK(v.type == GgufType::kArray && v.elem_type == GgufType::kString, ErrorCode::kInvalidFile,
           "{}: metadata '{}' should be an array of strings", name_, key);
  return v.strs;
}

const std::vector<int64_t>& GgufFile::get_int_array(std::string_view key) const {
  const GgufValue& v = require(*this, key);
  LY_CHECK(v.type == GgufType::kArray && is_integer(v.elem_type), ErrorCode::kInvalidFile,
           "{}: metadata '{}' should be an array of integers", name_, key);
  return v.ints;
}

const std::vector<double>& GgufFile::get_float_array(std::string_view key) const {
  const GgufValue& v = require(*this, key);
  LY_CHECK(v.type == GgufType::kArray &&
               (v.elem_type == GgufType::kF32 || v.elem_type == GgufType::kF64),
           ErrorCode::kInvalidFile, "{}: metadata '{}' should be an array of floats", name_, key);
  return v.floats;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace lychee
