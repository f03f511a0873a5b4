// A checkpoint opened for loading: a Hugging Face directory (config.json + safetensors) or a
// GGUF file. Opening reads the config and validates every weight of the table (presence,
// dtype, shape) before any data is converted, so a bad file fails before anything is built.
#pragma once

#include <array>
#include <functional>
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

// How the CPU holds weights. kF32: every weight converted to f32 (the reference). kNative:
// matrices stored in a GGUF block-quantised type (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q8_K) stay
// in their blocks, as in the file (Q/K rows un-permuted as whole rows); everything else is f32.
// kFp8: f32, with the seven linear matrices of every layer (Q, K, V, O, gate, up, down) rounded
// through FP8 e4m3 with one scale per output channel (core/fp8.h): the values the GPU's FP8
// weights stand for; embedding, norms, biases and the LM head stay as they are.
// kBf16: f32, with every matrix (embedding, LM head, the seven linear ones) rounded to bf16 and
// every vector (norms, biases) as it is: the values the GPU's bf16 weights stand for, so a GPU
// comparison against it measures the GPU's arithmetic apart from the weights' format (the format's
// own cost is CPU kBf16 against CPU kF32).
enum class WeightFormat { kF32, kNative, kFp8, kBf16 };
const char* weight_format_name(WeightFormat f);  // "f32", "native", "fp8", "bf16" (the --cpu-weights values)
// The format weight_format_name gives `name`, or nullopt for any other name.
std::optional<WeightFormat> weight_format_from_name(const std::string& name);
// Every name weight_format_from_name admits, in the enum's order (the CLI's and the Python
// engine's choices).
std::vector<std::string> weight_format_names();

// How the GPU holds the seven linear matrices (Q, K, V, O, gate, up, down; fused there as QKV,
// O, gate/up, down). kBf16: bf16 (the default). kFp8: FP8 e4m3 codes with one f32 scale per
// output channel, made by core/fp8.h's quantiser from the checkpoint's f32 values, the very
// values WeightFormat::kFp8 holds on the CPU. Embedding, LM head, norms and biases are the same
// in both (bf16 matrices, f32 vectors).
enum class GpuWeightFormat { kBf16, kFp8 };
const char* gpu_weight_format_name(GpuWeightFormat f);  // "bf16", "fp8" (the --weights values)
// The format gpu_weight_format_name gives `name`, or nullopt for any other name.
std::optional<GpuWeightFormat> gpu_weight_format_from_name(const std::string& name);
std::vector<std::string> gpu_weight_format_names();  // as weight_format_names

// One weight as HostWeights holds it. A matrix is [rows, cols] row-major (HF order, [out, in]);
// a vector has rows = 1. dtype is kF32, or with WeightFormat::kNative a block-quantised type
// whose rows are `row_bytes` apart (cols is a multiple of its block size); the CPU backend may
// then re-lay it out in place (HostWeights::relayout): row_group 8 means cpu/quant_pack.h's
// groups of eight interleaved rows, the same bytes in another order.
struct WeightView {
  DType dtype = DType::kF32;
  const uint8_t* data = nullptr;  // nullptr when the weight is absent
  int64_t rows = 0, cols = 0;
  int64_t row_bytes = 0;
  int64_t row_group = 1;  // 1: row-major as the file has it; 8: interleaved groups of 8 rows
  bool quantized() const { return dtype != DType::kF32; }
  int64_t n_bytes() const { return rows * row_bytes; }
  const float* f32() const { return reinterpret_cast<const float*>(data); }
};

// The seven per-layer linear matrices (Q, K, V, O, gate, up, down): what FP8 weights quantise.
bool is_linear_weight(WeightId id);

// Exceptions to FP8 weights (CPU WeightFormat::kFp8, GPU GpuWeightFormat::kFp8): layers whose Q,
// K and V projections keep their unrounded values (f32 on the CPU reference, bf16 on the GPU).
// The engine fills it with the layers whose heads select tokens for other heads (LycheeDecode's
// retrieval heads, TidalDecode's selection layers): there a change of the scores moves the set
// that many heads read, and on the default model FP8 there costs LycheeDecode 3-6 points of
// accuracy that keeping those projections bf16 wins back (docs/results/fp8_gpu).
struct Fp8Keep {
  std::vector<int> qkv_layers;  // ascending
  bool keeps_qkv(int layer) const;
  bool keeps(WeightId id, int layer) const;  // id is Q, K or V and keeps_qkv(layer)
};

// True for the GGUF block-quantised types (block size > 1).
bool is_block_quantized(DType t);

// Host weights in one 64-byte-aligned arena, with a view per (weight, layer).
class HostWeights {
 public:
  // keep: kFp8's exceptions (ignored by the other formats).
  static HostWeights load(const Checkpoint& ck, WeightFormat format = WeightFormat::kF32, const Fp8Keep& keep = {});

  // The weight's values in f32; nullptr when the weight is absent. kOutput falls back to
  // kTokEmbd for tied embeddings. Error(kInternal) for a weight held quantized (use view()).
  const float* get(WeightId id, int layer = 0) const;
  // The weight as held (data nullptr when absent), with the same kOutput fallback.
  const WeightView& view(WeightId id, int layer = 0) const;
  size_t n_bytes() const { return n_bytes_; }
  WeightFormat format() const { return format_; }
  // Rewrites a block-quantised weight's bytes in place (`pack` gets them, n_bytes() of them) and
  // records the layout it leaves as the view's row_group (the CPU backend's decode layout,
  // cpu/quant_pack.h). Error(kInternal) for an absent or f32 weight or one already re-laid out.
  void relayout(WeightId id, int layer, int64_t row_group, const std::function<void(uint8_t*, const WeightView&)>& pack);

 private:
  struct FreeDeleter { void operator()(uint8_t* p) const; };
  std::unique_ptr<uint8_t, FreeDeleter> arena_;
  size_t n_bytes_ = 0;
  WeightFormat format_ = WeightFormat::kF32;
  std::vector<std::array<WeightView, kNumWeightIds>> views_;
};

}  // namespace lychee
