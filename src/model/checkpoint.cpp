#include "model/checkpoint.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fmt/ranges.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/log.h"

namespace lychee {

namespace {

bool starts_with_gguf_magic(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  char magic[4] = {};
  const size_t n = std::fread(magic, 1, 4, f);
  std::fclose(f);
  return n == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// GGUF keeps ggml order (innermost first); the table speaks HF order (outermost first).
std::vector<int64_t> hf_order(const std::vector<int64_t>& ne) { return {ne.rbegin(), ne.rend()}; }

// Undo llama.cpp's per-head interleave of Q/K rows: file row h*hd + 2i + j holds HF row
// h*hd + j*hd/2 + i (j in {0, 1}). w: [n_heads * hd, cols] f32.
void unpermute_rows(float* w, int n_heads, int64_t rows, int64_t cols) {
  const int64_t hd = rows / n_heads;
  std::vector<float> tmp(w, w + rows * cols);
  for (int h = 0; h < n_heads; ++h)
    for (int64_t i = 0; i < hd / 2; ++i)
      for (int j = 0; j < 2; ++j) {
        const float* src = tmp.data() + (h * hd + 2 * i + j) * cols;
        float* dst = w + (h * hd + j * (hd / 2) + i) * cols;
        std::memcpy(dst, src, size_t(cols) * sizeof(float));
      }
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& path) {
  namespace fs = std::filesystem;
  Checkpoint ck;
  ck.path_ = path;
  LY_CHECK(fs::exists(path), ErrorCode::kNotFound, "{}: no such file or directory", path);
  if (fs::is_directory(path)) {
    const std::string config_path = (fs::path(path) / "config.json").string();
    LY_CHECK(fs::exists(config_path), ErrorCode::kNotFound,
             "{}: not a model directory (no config.json)", path);
    ck.format_ = CheckpointFormat::kHuggingFace;
    ck.config_ = config_from_hf_json(config_path);
    if (ck.config_.name.empty()) ck.config_.name = fs::path(path).filename().string();
    ck.st_ = std::make_unique<SafetensorsCheckpoint>(SafetensorsCheckpoint::open_dir(path));
  } else {
    LY_CHECK(starts_with_gguf_magic(path), ErrorCode::kInvalidFile,
             "{}: neither a model directory (config.json + safetensors) nor a GGUF file "
             "(magic is not 'GGUF')", path);
    ck.format_ = CheckpointFormat::kGguf;
    ck.gguf_ = std::make_unique<GgufFile>(GgufFile::open(path));
    ck.config_ = config_from_gguf(*ck.gguf_);
    if (ck.config_.name.empty()) ck.config_.name = fs::path(path).stem().string();
  }
  ck.collect_weights();
  return ck;
}

void Checkpoint::collect_weights() {
  const ModelConfig& c = config_;
  const bool gguf = format_ == CheckpointFormat::kGguf;
  weights_.assign(size_t(c.n_layers), {});
  size_t n_used = 0;
  for (const WeightSpec& spec : weight_table()) {
    const bool present = spec.present == nullptr || spec.present(c);
    for (int layer = 0; layer < (spec.per_layer ? c.n_layers : 1); ++layer) {
      const std::string name = gguf ? weight_gguf_name(spec, layer) : weight_hf_name(spec, layer);
      if (name.empty() || !present) continue;
      const std::vector<int64_t> expected = spec.shape(c);
      RawWeight w;
      w.name = name;
      if (gguf) {
        const GgufTensorInfo* t = gguf_->find_tensor(name);
        if (t == nullptr) {
          LY_CHECK(spec.optional, ErrorCode::kNotFound, "{}: missing tensor '{}' (expected shape {})",
                   path_, name, shape_str(expected));
          continue;
        }
        w.file = path_;
        w.dtype = t->dtype;
        w.shape = hf_order(t->ne);
        w.data = t->data;
        w.n_bytes = t->n_bytes;
        // llama.cpp runs llama (and mistral) with pairwise RoPE, so its converter interleaves
        // their Q/K rows; qwen2/qwen3 run rotate-half (NeoX) RoPE and keep HF's row order.
        const bool interleaved = c.arch == Arch::kLlama || c.arch == Arch::kMistral;
        if (interleaved && (spec.id == WeightId::kWq || spec.id == WeightId::kBq))
          w.unpermute_heads = c.n_heads;
        if (interleaved && (spec.id == WeightId::kWk || spec.id == WeightId::kBk))
          w.unpermute_heads = c.n_kv_heads;
      } else {
        const SafetensorsTensor* t = st_->find(name, &w.file);
        if (t == nullptr) {
          LY_CHECK(spec.optional, ErrorCode::kNotFound, "{}: missing tensor '{}' (expected shape {})",
                   path_, name, shape_str(expected));
          continue;
        }
        LY_CHECK(t->dtype == DType::kF32 || t->dtype == DType::kF16 || t->dtype == DType::kBF16,
                 ErrorCode::kUnsupported, "{}: tensor '{}' has dtype {} (expected F32, F16 or BF16)",
                 w.file, name, t->dtype_name);
        w.dtype = *t->dtype;
        w.shape = t->shape;
        w.data = t->data;
        w.n_bytes = t->n_bytes;
      }
      LY_CHECK(w.shape == expected, ErrorCode::kInvalidFile,
               "{}: tensor '{}' has wrong shape; expected {}, got {}", w.file, name,
               shape_str(expected), shape_str(w.shape));
      weights_[size_t(layer)][size_t(spec.id)] = std::move(w);
      ++n_used;
    }
  }
  const size_t n_in_file = gguf ? gguf_->tensors().size() : st_->tensor_names().size();
  if (n_in_file > n_used)
    LY_LOG_INFO("{}: {} tensors in the file are not used by lychee", path_, n_in_file - n_used);
}

const RawWeight* Checkpoint::weight(WeightId id, int layer) const {
  const WeightSpec& spec = weight_spec(id);
  LY_ASSERT(layer >= 0 && layer < config_.n_layers && (spec.per_layer || layer == 0));
  const auto& w = weights_[size_t(layer)][size_t(id)];
  return w ? &*w : nullptr;
}

void Checkpoint::read_f32(WeightId id, int layer, float* dst) const {
  const RawWeight* w = weight(id, layer);
  LY_ASSERT(w != nullptr);
  int64_t n = 1;
  for (int64_t d : w->shape) n *= d;
  convert_to_f32(w->dtype, w->data, n, dst);
  if (w->unpermute_heads > 0) {
    const int64_t cols = w->shape.size() == 2 ? w->shape[1] : 1;
    unpermute_rows(dst, w->unpermute_heads, w->shape[0], cols);
  }
}

uint64_t Checkpoint::file_weight_bytes() const {
  uint64_t total = 0;
  for (const auto& layer : weights_)
    for (const auto& w : layer)
      if (w) total += w->n_bytes;
  return total;
}

bool is_block_quantized(DType t) { return dtype_block_elems(t) > 1; }

void HostWeights::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

namespace {

// Whether `w` stays in its block format under `format`: a block-quantised matrix.
bool keep_blocks(const RawWeight& w, WeightFormat format) {
  return format == WeightFormat::kNative && is_block_quantized(w.dtype) && w.shape.size() == 2;
}

// Copies a block-quantised matrix [rows, cols] to dst, un-permuting Q/K rows as whole rows
// (each row is its own run of blocks, so the permutation of unpermute_rows moves rows intact).
void copy_blocks(const RawWeight& w, uint8_t* dst) {
  const int64_t rows = w.shape[0], row_bytes = dtype_bytes(w.dtype, w.shape[1]);
  if (w.unpermute_heads == 0) {
    std::memcpy(dst, w.data, size_t(rows * row_bytes));
    return;
  }
  const int64_t hd = rows / w.unpermute_heads;
  for (int64_t h = 0; h < w.unpermute_heads; ++h)
    for (int64_t i = 0; i < hd / 2; ++i)
      for (int64_t j = 0; j < 2; ++j)
        std::memcpy(dst + (h * hd + j * (hd / 2) + i) * row_bytes, w.data + (h * hd + 2 * i + j) * row_bytes,
                    size_t(row_bytes));
}

}  // namespace

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kF32: return "f32";
    case WeightFormat::kNative: return "native";
    case WeightFormat::kFp8: return "fp8";
    case WeightFormat::kBf16: return "bf16";
  }
  return "?";
}

namespace {

constexpr WeightFormat kWeightFormats[] = {WeightFormat::kF32, WeightFormat::kNative, WeightFormat::kFp8,
                                           WeightFormat::kBf16};
constexpr GpuWeightFormat kGpuWeightFormats[] = {GpuWeightFormat::kBf16, GpuWeightFormat::kFp8};

// The format of `formats` whose name_of is `name`, or nullopt.
template <typename F, size_t N>
std::optional<F> format_named(const F (&formats)[N], const char* (*name_of)(F), const std::string& name) {
  for (F f : formats)
    if (name == name_of(f)) return f;
  return std::nullopt;
}

template <typename F, size_t N>
std::vector<std::string> names_of(const F (&formats)[N], const char* (*name_of)(F)) {
  std::vector<std::string> names;
  for (F f : formats) names.emplace_back(name_of(f));
  return names;
}

}  // namespace

std::optional<WeightFormat> weight_format_from_name(const std::string& name) {
  return format_named(kWeightFormats, weight_format_name, name);
}

std::vector<std::string> weight_format_names() { return names_of(kWeightFormats, weight_format_name); }

std::optional<GpuWeightFormat> gpu_weight_format_from_name(const std::string& name) {
  return format_named(kGpuWeightFormats, gpu_weight_format_name, name);
}

std::vector<std::string> gpu_weight_format_names() { return names_of(kGpuWeightFormats, gpu_weight_format_name); }

const char* gpu_weight_format_name(GpuWeightFormat f) {
  switch (f) {
    case GpuWeightFormat::kBf16: return "bf16";
    case GpuWeightFormat::kFp8: return "fp8";
  }
  return "?";
}

bool is_linear_weight(WeightId id) {
  switch (id) {
    case WeightId::kWq: case WeightId::kWk: case WeightId::kWv: case WeightId::kWo:
    case WeightId::kWGate: case WeightId::kWUp: case WeightId::kWDown: return true;
    default: return false;
  }
}

bool Fp8Keep::keeps_qkv(int layer) const {
  return std::binary_search(qkv_layers.begin(), qkv_layers.end(), layer);
}

bool Fp8Keep::keeps(WeightId id, int layer) const {
  return (id == WeightId::kWq || id == WeightId::kWk || id == WeightId::kWv) && keeps_qkv(layer);
}

HostWeights HostWeights::load(const Checkpoint& ck, WeightFormat format, const Fp8Keep& keep) {
  const ModelConfig& c = ck.config();
  HostWeights hw;
  hw.format_ = format;
  hw.views_.assign(size_t(c.n_layers), {});
  auto padded = [](int64_t n) { return (size_t(n) + 63) / 64 * 64; };  // 64-byte aligned views
  auto held_bytes = [&](const RawWeight& w, int64_t numel) {
    return keep_blocks(w, format) ? dtype_bytes(w.dtype, numel) : numel * int64_t(sizeof(float));
  };
  size_t total = 0;
  for (const WeightSpec& spec : weight_table())
    for (int layer = 0; layer < (spec.per_layer ? c.n_layers : 1); ++layer)
      if (const RawWeight* w = ck.weight(spec.id, layer)) total += padded(held_bytes(*w, weight_numel(spec, c)));
  hw.n_bytes_ = total;
  auto* arena = static_cast<uint8_t*>(std::aligned_alloc(64, std::max<size_t>(total, 64)));
  LY_CHECK(arena != nullptr, ErrorCode::kCapacity, "{}: cannot allocate {} MiB for the weights",
           ck.path(), total >> 20);
  hw.arena_.reset(arena);
  size_t offset = 0;
  for (const WeightSpec& spec : weight_table()) {
    for (int layer = 0; layer < (spec.per_layer ? c.n_layers : 1); ++layer) {
      const RawWeight* w = ck.weight(spec.id, layer);
      if (w == nullptr) continue;
      const int64_t numel = weight_numel(spec, c);
      WeightView& v = hw.views_[size_t(layer)][size_t(spec.id)];
      v.data = arena + offset;
      v.rows = w->shape.size() == 2 ? w->shape[0] : 1;
      v.cols = numel / v.rows;
      if (keep_blocks(*w, format)) {
        v.dtype = w->dtype;
        v.row_bytes = dtype_bytes(w->dtype, v.cols);
        copy_blocks(*w, arena + offset);
      } else {
        v.row_bytes = v.cols * int64_t(sizeof(float));
        ck.read_f32(spec.id, layer, reinterpret_cast<float*>(arena + offset));
        if (format == WeightFormat::kFp8 && is_linear_weight(spec.id) && !keep.keeps(spec.id, layer))
          round_rows_through_e4m3(reinterpret_cast<float*>(arena + offset), v.rows, v.cols);
        if (format == WeightFormat::kBf16 && w->shape.size() == 2) {
          float* f = reinterpret_cast<float*>(arena + offset);
          for (int64_t i = 0; i < numel; ++i) f[i] = bf16_to_f32(f32_to_bf16(f[i]));
        }
      }
      offset += padded(held_bytes(*w, numel));
    }
  }
  return hw;
}

const WeightView& HostWeights::view(WeightId id, int layer) const {
  const WeightView& v = views_[size_t(layer)][size_t(id)];
  if (v.data == nullptr && id == WeightId::kOutput) return views_[0][size_t(WeightId::kTokEmbd)];
  return v;
}

void HostWeights::relayout(WeightId id, int layer, int64_t row_group,
                           const std::function<void(uint8_t*, const WeightView&)>& pack) {
  WeightView& v = views_[size_t(layer)][size_t(id)];
  LY_CHECK(v.data != nullptr && v.quantized() && v.row_group == 1, ErrorCode::kInternal,
           "weight {} of layer {} cannot be re-laid out (absent, f32 or done already)",
           weight_gguf_name(weight_spec(id), layer), layer);
  // The view points into arena_, which this object owns and allocated writable.
  pack(const_cast<uint8_t*>(v.data), v);
  v.row_group = row_group;
}

const float* HostWeights::get(WeightId id, int layer) const {
  const WeightView& v = view(id, layer);
  if (v.data == nullptr) return nullptr;
  LY_CHECK(!v.quantized(), ErrorCode::kInternal,
           "weight {} of layer {} is held as {} blocks, not f32 (WeightFormat::kNative)",
           weight_gguf_name(weight_spec(id), layer), layer, dtype_name(v.dtype));
  return v.f32();
}

}  // namespace lychee
