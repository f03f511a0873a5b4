// A checkpoint opened for loading: a Hugging Face directory (config.json + safetensors) or a
// GGUF file. Opening reads the config and validates every weight of the table (presence,
// dtype, shape) before any data is converted, so a bad file fails before anything is built.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "model/weight_table.h"

namespace lychee {

enum class CheckpointFormat { kHuggingFace, kGguf };

// One weight as stored in the file.
struct RawWeight {
  std::string name;           // name in the file
  std::string file;           // file that holds it
  DType dtype = DType::kF32;
  std::vector<int64_t> shape; // outermost first (HF order)
  const uint8_t* data = nullptr;
  uint64_t n_bytes = 0;
  // GGUF llama/mistral files store Q and K rows interleaved per head (for ggml's pairwise RoPE);
  // this is the head count to undo that with, 0 when the rows are in rotate-half order already
  // (Hugging Face files, and GGUF qwen2/qwen3, which llama.cpp runs with NeoX RoPE).
  int unpermute_heads = 0;
};

class Checkpoint {
 public:
  // path: a directory with config.json, or a .gguf file.
  static Checkpoint open(const std::string& path);

  const ModelConfig& config() const { return config_; }
  CheckpointFormat format() const { return format_; }
  const std::string& path() const { return path_; }
  const GgufFile* gguf() const { return gguf_.get(); }

  // nullptr when the weight is absent (not present in this model, or optional and missing).
  const RawWeight* weight(WeightId id, int layer = 0) const;
  // Converts one weight to f32 in HF layout (Q/K rows un-permuted). dst: [numel] f32.
  void read_f32(WeightId id, int layer, float* dst) const;
  // Bytes the weights take in the file.
  uint64_t file_weight_bytes() const;

 private:
  Checkpoint() = default;
  void collect_weights();

  std::string path_;
  CheckpointFormat format_ = CheckpointFormat::kHuggingFace;
  ModelConfig config_;
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<SafetensorsCheckpoint> st_;
  // [layer][WeightId]; globals live in layer 0.
  std::vector<std::array<std::optional<RawWeight>, kNumWeightIds>> weights_;
};

// Host f32 weights in one arena, with a view per (weight, layer).
class HostWeights {
 public:
  static HostWeights load(const Checkpoint& ck);

  // nullptr when the weight is absent. kOutput falls back to kTokEmbd for tied embeddings.
  const float* get(WeightId id, int layer = 0) const;
  size_t n_bytes() const { return n_floats_ * sizeof(float); }

 private:
  struct FreeDeleter { void operator()(float* p) const; };
  std::unique_ptr<float, FreeDeleter> arena_;
  size_t n_floats_ = 0;
  std::vector<std::array<const float*, kNumWeightIds>> views_;
};

}  // namespace lychee
