// Writes tiny but complete checkpoints (HF directory, GGUF file) for loader tests, with hooks
// to corrupt them: drop a tensor, change a shape.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gguf_builder.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weight_table.h"

namespace lychee::test {

inline nlohmann::json tiny_llama_config_json() {
  return {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
          {"hidden_size", 16}, {"intermediate_size", 24}, {"num_hidden_layers", 2},
          {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"vocab_size", 32},
          {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0},
          {"tie_word_embeddings", false}, {"hidden_act", "silu"}};
}

inline ModelConfig tiny_llama_config() {
  ModelConfig c;
  c.arch_label = "LlamaForCausalLM";
  c.n_layers = 2; c.d_model = 16; c.n_heads = 2; c.n_kv_heads = 1; c.head_dim = 8;
  c.d_ff = 24; c.vocab_size = 32; c.max_context = 64;
  return c;
}

// The tiny Llama's shape with other layer and KV-head counts (two query heads per KV head), for
// head-role and head-assignment tests.
inline ModelConfig tiny_config_of(int n_layers, int n_kv_heads) {
  ModelConfig c = tiny_llama_config();
  c.name = "tiny";
  c.n_layers = n_layers;
  c.n_kv_heads = n_kv_heads;
  c.n_heads = 2 * n_kv_heads;
  return c;
}

struct TinyEdit {
  std::string drop;                        // tensor name to leave out
  std::string reshape;                     // tensor name to give shape `shape`
  std::vector<int64_t> shape;
};

// Values of one weight for write_hf_f32: given its HF name, layer and shape (which it may change),
// the values in HF layout, or an empty vector to leave the weight out.
using HfWeightFill =
    std::function<std::vector<float>(const std::string& name, int layer, std::vector<int64_t>& shape)>;

// Writes config.json + model.safetensors (F32) into a fresh directory: every weight of the table
// that a model of config `c` has, with the values `fill` gives it.
inline void write_hf_f32(const std::string& dir, const nlohmann::json& config, const ModelConfig& c,
                         const HfWeightFill& fill) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << config.dump(1);
  std::vector<std::vector<float>> storage;
  std::vector<SafetensorsWriteItem> items;
  for (const WeightSpec& spec : weight_table()) {
    if (spec.present != nullptr && !spec.present(c)) continue;
    if (std::string(spec.hf_name).empty()) continue;
    for (int layer = 0; layer < (spec.per_layer ? c.n_layers : 1); ++layer) {
      const std::string name = weight_hf_name(spec, layer);
      std::vector<int64_t> shape = spec.shape(c);
      std::vector<float> values = fill(name, layer, shape);
      if (values.empty()) continue;
      storage.push_back(std::move(values));
      items.push_back({name, shape, storage.back()});
    }
  }
  write_safetensors_f32(dir + "/model.safetensors", items);
}

// The tiny Llama (tiny_llama_config) with every value 0.01, in a fresh directory.
inline std::string write_tiny_hf(const std::string& dir, const nlohmann::json& config,
                                 const TinyEdit& edit = {}) {
  write_hf_f32(dir, config, tiny_llama_config(), [&](const std::string& name, int, std::vector<int64_t>& shape) {
    if (name == edit.drop) return std::vector<float>();
    if (name == edit.reshape) shape = edit.shape;
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return std::vector<float>(size_t(n), 0.01f);
  });
  return dir;
}

// The tiny Llama's shapes as a GGUF architecture: qwen2 adds q/k/v biases, qwen3 q/k norms
// (and states its head dim, as Qwen3 files do).
inline ModelConfig tiny_gguf_config(const std::string& arch) {
  ModelConfig c = tiny_llama_config();
  c.qkv_bias = arch == "qwen2";
  c.qk_norm = arch == "qwen3";
  return c;
}

// A tiny GGUF (architecture llama, mistral, qwen2 or qwen3) with F32 tensors; `edit` works on
// GGUF names and ggml-order shapes.
inline GgufBuilder tiny_gguf(const std::string& arch, const TinyEdit& edit = {}) {
  const ModelConfig c = tiny_gguf_config(arch);
  GgufBuilder g;
  const auto key = [&](const char* k) { return arch + "." + k; };
  g.kv_str("general.architecture", arch);
  g.kv_u32(key("block_count"), c.n_layers);
  g.kv_u32(key("embedding_length"), c.d_model);
  g.kv_u32(key("feed_forward_length"), c.d_ff);
  g.kv_u32(key("attention.head_count"), c.n_heads);
  g.kv_u32(key("attention.head_count_kv"), c.n_kv_heads);
  if (arch == "qwen3") g.kv_u32(key("attention.key_length"), c.head_dim);
  g.kv_u32(key("context_length"), c.max_context);
  g.kv_u32(key("vocab_size"), c.vocab_size);
  g.kv_f32(key("attention.layer_norm_rms_epsilon"), 1e-5f);
  g.kv_f32(key("rope.freq_base"), 10000.0f);
  for (const WeightSpec& spec : weight_table()) {
    if (spec.present != nullptr && !spec.present(c)) continue;
    if (spec.optional) continue;
    for (int layer = 0; layer < (spec.per_layer ? c.n_layers : 1); ++layer) {
      const std::string name = weight_gguf_name(spec, layer);
      if (name == edit.drop) continue;
      std::vector<uint64_t> ne;
      if (name == edit.reshape) {
        for (auto d : edit.shape) ne.push_back(uint64_t(d));
      } else {
        const auto s = spec.shape(c);
        for (auto it = s.rbegin(); it != s.rend(); ++it) ne.push_back(uint64_t(*it));
      }
      g.tensor_f32(name, ne);
    }
  }
  return g;
}

// A tiny llama GGUF with F32 tensors; `edit` works on GGUF names and ggml-order shapes.
inline GgufBuilder tiny_llama_gguf(const TinyEdit& edit = {}) { return tiny_gguf("llama", edit); }

inline std::string write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  return path;
}

// Per process: CTest runs tests in parallel, and other checkouts on the machine run the same
// tests at the same time; a shared /tmp/lychee_test_NAME let one run delete another's files.
inline std::string temp_dir(const std::string& name) {
  const auto p = std::filesystem::temp_directory_path() /
                 ("lychee_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(p);
  return p.string();
}

}  // namespace lychee::test
