// The model's weights on the GPU in one arena: bf16 matrices (fp32 norms and biases), or with
// GpuWeightFormat::kFp8 the linear matrices as FP8 e4m3 codes with one f32 scale per output
// channel (row). Q/K/V and gate/up are fused so each takes one matrix product.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/common/common.h"
#include "cuda/common/device_buffer.h"
#include "model/checkpoint.h"
#include "model/config.h"

namespace lychee::cuda {

// A linear weight [rows][cols] (outputs x inputs, row-major) as the GPU holds it: bf16 values,
// or (kFp8) e4m3 codes and row scales, w[r][c] = e4m3(codes[r][c]) · scales[r]; the other
// format's pointers are null.
struct GpuMatrix {
  const bf16* values = nullptr;    // [rows][cols] bf16 (kBf16)
  const uint8_t* codes = nullptr;  // [rows][cols] e4m3 (kFp8); cols % 16 == 0: rows 16-byte aligned
  const float* scales = nullptr;   // [rows] f32 (kFp8)
  int rows = 0, cols = 0;
  bool fp8() const { return codes != nullptr; }
};

// How the runner multiplies n rows of activations by an FP8 matrix: the FP8 GEMV in this many
// launches of up to kFp8GemvMaxRows (fp8_gemv.h) rows (each reads the codes once: 1 byte per weight), or 0:
// widen the matrix to bf16 and use cuBLASLt (1 byte read, 2 written and 2 read per weight). The
// GEMV while it reads less, up to 4 launches (n <= 32). Pure.
constexpr int kFp8GemvMaxLaunches = 4;
int fp8_gemv_launches(int n);

struct GpuLayerWeights {
  const float* attn_norm;   // [d]
  GpuMatrix wqkv;           // [q_dim + 2 kv_dim][d]: Q rows, K rows, V rows
  const float* bqkv;        // [q_dim + 2 kv_dim] or null
  const float* q_norm;      // [head_dim] or null (Qwen3)
  const float* k_norm;
  GpuMatrix wo;             // [d][q_dim]
  const float* bo;          // [d] or null
  const float* ffn_norm;    // [d]
  GpuMatrix w_gate_up;      // [2 ff][d]: gate rows, then up rows
  const float* b_gate_up;   // [2 ff] or null
  GpuMatrix w_down;         // [d][ff]
  const float* b_down;      // [d] or null
};

// Why the model's linear matrices cannot be held as FP8 on the GPU, or "": the FP8 kernels read
// 16 codes at a time, so every product's input width (hidden size, q_dim, intermediate size)
// must be a multiple of 16. Pure host code.
std::string fp8_weights_unsupported(const ModelConfig& c);

class GpuWeights {
 public:
  // Converts every weight of the checkpoint to bf16 (norms and biases f32) and uploads it; with
  // kFp8 the linear matrices go through core/fp8.h's quantiser instead (from the checkpoint's f32
  // rows, Q/K un-permuted: the values the CPU reference's WeightFormat::kFp8 holds). kFp8 on a
  // model fp8_weights_unsupported refuses: Error(kUnsupported) before anything is allocated.
  // keep: FP8's exceptions (model/checkpoint.h; those Q/K/V matrices are uploaded as bf16).
  static GpuWeights from_checkpoint(const Checkpoint& ck, GpuWeightFormat format = GpuWeightFormat::kBf16,
                                    const Fp8Keep& keep = {});
  // Random weights of the config's shape (for speed benchmarks: decode time does not depend on
  // the values): N(0, 0.02²) bf16, or with kFp8 codes of N(0, 112²) (a quarter of e4m3's range,
  // as the quantiser's max|row| / 448 scale puts a row's ~4σ largest value at 448) and row
  // scales 0.02 / 112. Norm weights 1, no biases.
  static GpuWeights random(const ModelConfig& c, uint64_t seed, GpuWeightFormat format = GpuWeightFormat::kBf16,
                           const Fp8Keep& keep = {});

  // One rank's part of the model under tensor parallelism (attention/tp_assign.h's
  // tp_shard_shape: its KV heads kv_heads, in that order, and MLP slice `rank` of n_gpus), on the
  // current CUDA device, from the values the whole model's upload has: from the checkpoint (ck)
  // or random with `seed` (ck null), each full layer made in a device scratch and the rank's
  // rows and columns copied out (so FP8 row scales are those of the whole rows). The embedding,
  // LM head and norms are whole on every rank.
  static GpuWeights shard(const Checkpoint* ck, const ModelConfig& full, uint64_t seed, GpuWeightFormat format,
                          const Fp8Keep& keep, const std::vector<int>& kv_heads, int rank, int n_gpus);

  // The shape this object holds (a rank's under tensor parallelism) and the whole model's.
  const ModelConfig& config() const { return config_; }
  const ModelConfig& full_config() const { return full_config_; }
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }
  // The global KV heads held, ascending local order (empty: all, in order).
  const std::vector<int>& kv_heads() const { return kv_heads_; }
  int device() const { return device_; }
  GpuWeightFormat format() const { return format_; }
  size_t bytes() const { return arena_.bytes(); }
  // Bytes a decode step reads: every matrix (1 byte per FP8 weight plus its row's f32 scale, 2
  // per bf16 weight) and vector, the embedding table once per token row (the LM head reads the
  // output matrix whole). Batches of more than 8 rows read FP8 matrices more than once (see
  // forward.cpp); this counts them once, the bound of the format.
  uint64_t bytes_read_per_step(int batch) const;

  const bf16* embed = nullptr;     // [vocab][d]
  const bf16* output = nullptr;    // [vocab][d] (== embed when tied)
  GpuMatrix output8;               // the LM head in FP8 under LYCHEE_FP8_LM_HEAD=1 (lab), else empty
  const float* out_norm = nullptr; // [d]
  const float* inv_freq = nullptr; // [head_dim / 2]
  std::vector<GpuLayerWeights> layers;

 private:
  GpuWeights() = default;
  ModelConfig config_, full_config_;
  int tp_rank_ = 0, tp_size_ = 1;
  std::vector<int> kv_heads_;
  int device_ = current_device();
  static int current_device() {
    int d = 0;
    LY_CUDA_CHECK(cudaGetDevice(&d));
    return d;
  }
  GpuWeightFormat format_ = GpuWeightFormat::kBf16;
  size_t matrix_bytes_ = 0;  // the layers' linear weights as laid out (values, FP8 scales)
  DeviceBuffer<uint8_t> arena_;
};

}  // namespace lychee::cuda
