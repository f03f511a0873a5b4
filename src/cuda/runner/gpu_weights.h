// The model's weights on the GPU, bf16 matrices (fp32 norms and biases) in one arena. Q/K/V and
// gate/up are fused so each takes one matrix product.
#pragma once

#include <cstdint>
#include <vector>

#include "cuda/common/common.h"
#include "cuda/common/device_buffer.h"
#include "model/checkpoint.h"
#include "model/config.h"

namespace lychee::cuda {

struct GpuLayerWeights {
  const float* attn_norm;   // [d]
  const bf16* wqkv;         // [q_dim + 2 kv_dim][d]
  const float* bqkv;        // [q_dim + 2 kv_dim] or null
  const float* q_norm;      // [head_dim] or null (Qwen3)
  const float* k_norm;
  const bf16* wo;           // [d][q_dim]
  const float* bo;          // [d] or null
  const float* ffn_norm;    // [d]
  const bf16* w_gate_up;    // [2 ff][d]: gate rows, then up rows
  const float* b_gate_up;   // [2 ff] or null
  const bf16* w_down;       // [d][ff]
  const float* b_down;      // [d] or null
};

class GpuWeights {
 public:
  // Converts every weight of the checkpoint to bf16 (norms and biases f32) and uploads it.
  static GpuWeights from_checkpoint(const Checkpoint& ck);
  // Random weights of the config's shape (for speed benchmarks: decode time does not depend on
  // the values). Norm weights 1, no biases.
  static GpuWeights random(const ModelConfig& c, uint64_t seed);

  const ModelConfig& config() const { return config_; }
  size_t bytes() const { return arena_.bytes(); }
  // Bytes a decode step reads: every matrix and vector, the embedding table once per token row
  // (the LM head reads the output matrix whole).
  uint64_t bytes_read_per_step(int batch) const;

  const bf16* embed = nullptr;     // [vocab][d]
  const bf16* output = nullptr;    // [vocab][d] (== embed when tied)
  const float* out_norm = nullptr; // [d]
  const float* inv_freq = nullptr; // [head_dim / 2]
  std::vector<GpuLayerWeights> layers;

 private:
  GpuWeights() = default;
  ModelConfig config_;
  DeviceBuffer<uint8_t> arena_;
};

}  // namespace lychee::cuda
