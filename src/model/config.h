// ModelConfig: the shape and hyper-parameters of a decoder-only transformer, read from a
// Hugging Face config.json or from GGUF metadata. Everything downstream sizes itself from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lychee {

class GgufFile;

enum class Arch { kLlama, kQwen2, kQwen3, kMistral };

const char* arch_name(Arch a);

struct RopeScaling {
  enum class Type { kNone, kLlama3, kLinear } type = Type::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position = 8192;
};

struct ModelConfig {
  Arch arch = Arch::kLlama;
  std::string arch_label;  // as the file names it, e.g. "LlamaForCausalLM" or "llama"
  std::string name;        // model identity for head-role files and logs
  int n_layers = 0;
  int d_model = 0;         // hidden size
  int n_heads = 0;         // query heads
  int n_kv_heads = 0;      // key/value heads (GQA)
  int head_dim = 0;
  int d_ff = 0;            // MLP intermediate size
  int vocab_size = 0;
  int max_context = 0;     // max_position_embeddings / context_length
  float rms_eps = 1e-6f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  bool tie_embeddings = false;
  bool qkv_bias = false;   // Qwen2, Llama with attention_bias
  bool o_bias = false;     // Llama with attention_bias
  bool mlp_bias = false;   // Llama with mlp_bias
  bool qk_norm = false;    // Qwen3: RMSNorm over head_dim on q and k, before RoPE

  int group_size() const { return n_heads / n_kv_heads; }
  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
  // Parameter count of the weights (tied embeddings counted once).
  int64_t n_params() const;
  // Throws Error(kInvalidFile) naming `source` if the values are inconsistent.
  void validate(const std::string& source) const;
};

// Llama-3-8B's shape (32 layers, d_model 4096, 32 query / 8 KV heads of 128, d_ff 14336, vocab
// 128256, context 128K + 1024), no checkpoint: benchmarks with random weights and planning tools.
ModelConfig llama3_8b_shape();
// SmolLM2-135M's shape (the default model: 30 layers, d_model 576, 9 query / 3 KV heads of 64,
// d_ff 1536, vocab 49152, tied embeddings, context 8192), no checkpoint.
ModelConfig smollm2_135m_shape();
// A named shape ("llama3-8b", "smollm2-135m"); throws kInvalidArgument naming the known ones.
ModelConfig model_shape(const std::string& name);
// The names model_shape knows.
std::vector<std::string> model_shape_names();

// Reads config.json in a Hugging Face model directory.
ModelConfig config_from_hf_json(const std::string& config_json_path);
// Reads the <arch>.* keys of a GGUF file (architectures llama, mistral, qwen2, qwen3).
ModelConfig config_from_gguf(const GgufFile& gguf);

// Per-frequency inverse frequencies for rotate-half RoPE, [head_dim / 2] f32, computed the way
// transformers does (f32 arithmetic), including llama3 scaling.
std::vector<float> rope_inv_freq(const ModelConfig& c);

}  // namespace lychee
