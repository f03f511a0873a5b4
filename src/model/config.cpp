#include "model/config.h"

#include <cmath>
#include <numbers>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mmap_file.h"
#include "model/gguf.h"

namespace lychee {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::kLlama: return "llama";
    case Arch::kQwen2: return "qwen2";
    case Arch::kQwen3: return "qwen3";
    case Arch::kMistral: return "mistral";
  }
  return "?";
}

ModelConfig llama3_8b_shape() {
  ModelConfig c;
  c.arch = Arch::kLlama;
  c.arch_label = "LlamaForCausalLM";
  c.name = "Llama-3-8B shape, random bf16 weights";
  c.n_layers = 32; c.d_model = 4096; c.n_heads = 32; c.n_kv_heads = 8; c.head_dim = 128;
  c.d_ff = 14336; c.vocab_size = 128256; c.max_context = 131072 + 1024;
  c.rms_eps = 1e-5f; c.rope_theta = 500000.0f;
  return c;
}

namespace {
// Llama-3-70B's shape: 80 layers, d_model 8192, 64 query / 8 KV heads of 128, d_ff 28672; the rest
// (vocabulary, context, RoPE theta 500000, RMSNorm eps) as llama3_8b_shape. 70.55 B parameters:
// 141 GB of bf16 weights, so it runs over several GPUs (--tensor-parallel) or with FP8 weights.
// Reached through model_shape("llama3-70b").
ModelConfig llama3_70b_shape() {
  ModelConfig c = llama3_8b_shape();
  c.name = "Llama-3-70B shape, random bf16 weights";
  c.n_layers = 80; c.d_model = 8192; c.n_heads = 64; c.n_kv_heads = 8;
  c.d_ff = 28672;
  return c;
}
}  // namespace

ModelConfig smollm2_135m_shape() {
  ModelConfig c;
  c.arch = Arch::kLlama;
  c.arch_label = "LlamaForCausalLM";
  c.name = "SmolLM2-135M shape, random bf16 weights";
  c.n_layers = 30; c.d_model = 576; c.n_heads = 9; c.n_kv_heads = 3; c.head_dim = 64;
  c.d_ff = 1536; c.vocab_size = 49152; c.max_context = 8192;
  c.rms_eps = 1e-5f; c.rope_theta = 100000.0f; c.tie_embeddings = true;
  return c;
}

namespace {
struct NamedShape {
  const char* name;
  ModelConfig (*make)();
};
constexpr NamedShape kShapes[] = {
    {"llama3-8b", llama3_8b_shape}, {"llama3-70b", llama3_70b_shape}, {"smollm2-135m", smollm2_135m_shape}};
}  // namespace

std::vector<std::string> model_shape_names() {
  std::vector<std::string> names;
  for (const NamedShape& s : kShapes) names.emplace_back(s.name);
  return names;
}

ModelConfig model_shape(const std::string& name) {
  for (const NamedShape& s : kShapes)
    if (name == s.name) return s.make();
  fail(ErrorCode::kInvalidArgument, "unknown model shape '{}' (known: {})", name, fmt::join(model_shape_names(), ", "));
}

int64_t ModelConfig::n_params() const {
  const int64_t d = d_model;
  int64_t per_layer = 2 * d                                   // attn + ffn norms
                      + d * q_dim() + 2 * d * kv_dim() + int64_t(q_dim()) * d  // q, k, v, o
                      + 3 * d * d_ff;                         // gate, up, down
  if (qkv_bias) per_layer += q_dim() + 2 * kv_dim();
  if (o_bias) per_layer += d;
  if (mlp_bias) per_layer += 2 * d_ff + d;
  if (qk_norm) per_layer += 2 * head_dim;
  const int64_t embed = int64_t(vocab_size) * d;
  return embed * (tie_embeddings ? 1 : 2) + n_layers * per_layer + d;
}

void ModelConfig::validate(const std::string& source) const {
  auto positive = [&](int v, const char* field) {
    LY_CHECK(v > 0, ErrorCode::kInvalidFile, "{}: {} must be positive, got {}", source, field, v);
  };
  positive(n_layers, "number of layers");
  positive(d_model, "hidden size");
  positive(n_heads, "number of attention heads");
  positive(n_kv_heads, "number of key/value heads");
  positive(head_dim, "head dim");
  positive(d_ff, "intermediate size");
  positive(vocab_size, "vocab size");
  positive(max_context, "context length");
  LY_CHECK(n_heads % n_kv_heads == 0, ErrorCode::kInvalidFile,
           "{}: {} attention heads are not a multiple of {} key/value heads", source, n_heads,
           n_kv_heads);
  LY_CHECK(head_dim % 2 == 0, ErrorCode::kInvalidFile, "{}: head dim {} is odd; RoPE needs it even",
           source, head_dim);
  LY_CHECK(rms_eps > 0 && std::isfinite(rms_eps), ErrorCode::kInvalidFile,
           "{}: rms_norm_eps must be positive, got {}", source, rms_eps);
  LY_CHECK(rope_theta > 0 && std::isfinite(rope_theta), ErrorCode::kInvalidFile,
           "{}: rope_theta must be positive, got {}", source, rope_theta);
  LY_CHECK(n_layers <= 1024 && d_model <= (1 << 17) && n_heads <= 1024 && head_dim <= 1024 &&
               d_ff <= (1 << 20) && vocab_size <= (1 << 24),
           ErrorCode::kInvalidFile, "{}: implausibly large model dimensions", source);
}

namespace {

using nlohmann::json;

template <typename T>
T json_get(const json& j, const char* key, const std::string& src) {
  LY_CHECK(j.contains(key), ErrorCode::kInvalidFile, "{}: missing field '{}'", src, key);
  const json& v = j[key];
  if constexpr (std::is_same_v<T, bool>) {
    LY_CHECK(v.is_boolean(), ErrorCode::kInvalidFile, "{}: field '{}' must be a boolean", src, key);
  } else if constexpr (std::is_integral_v<T>) {
    LY_CHECK(v.is_number_integer(), ErrorCode::kInvalidFile, "{}: field '{}' must be an integer",
             src, key);
    const int64_t i = v.get<int64_t>();
    LY_CHECK(i >= 0 && i <= int64_t(1) << 31, ErrorCode::kInvalidFile,
             "{}: field '{}' is out of range: {}", src, key, i);
  } else {
    LY_CHECK(v.is_number(), ErrorCode::kInvalidFile, "{}: field '{}' must be a number", src, key);
  }
  return v.get<T>();
}

template <typename T>
T json_get_or(const json& j, const char* key, T fallback, const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  return json_get<T>(j, key, src);
}

RopeScaling rope_scaling_from_json(const json& rs, const std::string& src) {
  RopeScaling s;
  if (rs.is_null()) return s;
  LY_CHECK(rs.is_object(), ErrorCode::kInvalidFile, "{}: rope scaling must be an object", src);
  std::string type = "default";
  if (rs.contains("rope_type") && rs["rope_type"].is_string()) type = rs["rope_type"].get<std::string>();
  else if (rs.contains("type") && rs["type"].is_string()) type = rs["type"].get<std::string>();
  if (type == "default") return s;
  if (type == "llama3") {
    s.type = RopeScaling::Type::kLlama3;
    s.factor = json_get<float>(rs, "factor", src);
    s.low_freq_factor = json_get<float>(rs, "low_freq_factor", src);
    s.high_freq_factor = json_get<float>(rs, "high_freq_factor", src);
    s.original_max_position = json_get<int>(rs, "original_max_position_embeddings", src);
    LY_CHECK(s.high_freq_factor > s.low_freq_factor && s.factor > 0, ErrorCode::kInvalidFile,
             "{}: llama3 rope scaling needs high_freq_factor > low_freq_factor and factor > 0", src);
    return s;
  }
  if (type == "linear") {
    s.type = RopeScaling::Type::kLinear;
    s.factor = json_get<float>(rs, "factor", src);
    LY_CHECK(s.factor > 0, ErrorCode::kInvalidFile, "{}: linear rope scaling factor must be > 0", src);
    return s;
  }
  fail(ErrorCode::kUnsupported, "{}: rope scaling type '{}' is not supported (default, linear, llama3)",
       src, type);
}

}  // namespace

ModelConfig config_from_hf_json(const std::string& path) {
  const std::string text = read_text_file(path);
  json j = json::parse(text, nullptr, false);
  LY_CHECK(!j.is_discarded(), ErrorCode::kInvalidFile, "{}: not valid JSON", path);
  LY_CHECK(j.is_object(), ErrorCode::kInvalidFile, "{}: not a JSON object", path);

  ModelConfig c;
  std::string label;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string()) {
    label = j["architectures"][0].get<std::string>();
  } else if (j.contains("model_type") && j["model_type"].is_string()) {
    label = j["model_type"].get<std::string>();
  }
  c.arch_label = label;
  if (label == "LlamaForCausalLM" || label == "llama") c.arch = Arch::kLlama;
  else if (label == "Qwen2ForCausalLM" || label == "qwen2") c.arch = Arch::kQwen2;
  else if (label == "Qwen3ForCausalLM" || label == "qwen3") c.arch = Arch::kQwen3;
  else if (label == "MistralForCausalLM" || label == "mistral") c.arch = Arch::kMistral;
  else
    fail(ErrorCode::kUnsupported,
         "{}: unknown architecture '{}' (supported: LlamaForCausalLM, Qwen2ForCausalLM, "
         "Qwen3ForCausalLM, MistralForCausalLM)", path, label.empty() ? "<none>" : label);

  const std::string act = j.value("hidden_act", std::string("silu"));
  LY_CHECK(act == "silu", ErrorCode::kUnsupported, "{}: hidden_act '{}' is not supported (silu)", path, act);

  c.n_layers = json_get<int>(j, "num_hidden_layers", path);
  c.d_model = json_get<int>(j, "hidden_size", path);
  c.n_heads = json_get<int>(j, "num_attention_heads", path);
  c.n_kv_heads = json_get_or<int>(j, "num_key_value_heads", c.n_heads, path);
  LY_CHECK(c.n_heads > 0, ErrorCode::kInvalidFile, "{}: num_attention_heads must be positive", path);
  c.head_dim = json_get_or<int>(j, "head_dim", c.d_model / c.n_heads, path);
  c.d_ff = json_get<int>(j, "intermediate_size", path);
  c.vocab_size = json_get<int>(j, "vocab_size", path);
  c.max_context = json_get_or<int>(j, "max_position_embeddings", 4096, path);
  c.rms_eps = json_get_or<float>(j, "rms_norm_eps", 1e-6f, path);
  c.tie_embeddings = json_get_or<bool>(j, "tie_word_embeddings", false, path);

  // transformers >= 5 writes rope_parameters {rope_type, rope_theta, ...}; older files write
  // rope_theta and rope_scaling at the top level.
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    const json& rp = j["rope_parameters"];
    c.rope_theta = json_get_or<float>(rp, "rope_theta", 10000.0f, path);
    c.rope_scaling = rope_scaling_from_json(rp, path);
  } else {
    c.rope_theta = json_get_or<float>(j, "rope_theta", 10000.0f, path);
    if (j.contains("rope_scaling")) c.rope_scaling = rope_scaling_from_json(j["rope_scaling"], path);
  }

  switch (c.arch) {
    case Arch::kLlama:
    case Arch::kMistral:
      c.qkv_bias = c.o_bias = json_get_or<bool>(j, "attention_bias", false, path);
      c.mlp_bias = json_get_or<bool>(j, "mlp_bias", false, path);
      break;
    case Arch::kQwen2: c.qkv_bias = true; break;
    case Arch::kQwen3:
      c.qkv_bias = c.o_bias = json_get_or<bool>(j, "attention_bias", false, path);
      c.qk_norm = true;
      break;
  }
  const bool sliding = json_get_or<bool>(j, "use_sliding_window", c.arch == Arch::kMistral, path);
  if (sliding && j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    const int window = json_get<int>(j, "sliding_window", path);
    // Full attention equals sliding-window attention while the sequence fits the window.
    if (window < c.max_context) c.max_context = window;
  }
  c.name = j.value("_name_or_path", std::string());
  c.validate(path);
  return c;
}

ModelConfig config_from_gguf(const GgufFile& g) {
  // Metadata keys are prefixed by the architecture name. Mistral models are written as `llama`
  // by llama.cpp's converter; `mistral` is accepted too, with the same keys under its own prefix.
  const std::string arch(g.get_string("general.architecture"));
  ModelConfig c;
  if (arch == "llama") c.arch = Arch::kLlama;
  else if (arch == "mistral") c.arch = Arch::kMistral;
  else if (arch == "qwen2") c.arch = Arch::kQwen2;
  else if (arch == "qwen3") c.arch = Arch::kQwen3;
  else
    fail(ErrorCode::kUnsupported,
         "{}: GGUF architecture '{}' is not supported (llama, mistral, qwen2, qwen3)", g.path(), arch);
  c.arch_label = arch;
  const auto key = [&](const char* suffix) { return arch + "." + suffix; };
  auto u = [&](const char* suffix) { return int(g.get_uint(key(suffix))); };
  c.n_layers = u("block_count");
  c.d_model = u("embedding_length");
  c.n_heads = u("attention.head_count");
  c.n_kv_heads = int(g.get_uint_opt(key("attention.head_count_kv")).value_or(c.n_heads));
  c.d_ff = u("feed_forward_length");
  c.max_context = u("context_length");
  LY_CHECK(c.n_heads > 0, ErrorCode::kInvalidFile, "{}: {} must be positive", g.path(),
           key("attention.head_count"));
  // Qwen3 states its head dim (128 for every size, not d_model / n_heads).
  c.head_dim = int(g.get_uint_opt(key("attention.key_length")).value_or(c.d_model / c.n_heads));
  if (auto v = g.get_uint_opt(key("attention.value_length"))) {
    LY_CHECK(int(*v) == c.head_dim, ErrorCode::kUnsupported,
             "{}: {} {} differs from the key length {}", g.path(), key("attention.value_length"),
             *v, c.head_dim);
  }
  if (auto rot = g.get_uint_opt(key("rope.dimension_count"))) {
    LY_CHECK(int(*rot) == c.head_dim, ErrorCode::kUnsupported,
             "{}: {} {} differs from the head dim {} (partial RoPE)", g.path(),
             key("rope.dimension_count"), *rot, c.head_dim);
  }
  c.rms_eps = float(g.get_float(key("attention.layer_norm_rms_epsilon")));
  c.rope_theta = float(g.get_float_opt(key("rope.freq_base")).value_or(10000.0));
  if (auto type = g.get_string_opt(key("rope.scaling.type"))) {
    if (*type == "linear") {
      c.rope_scaling.type = RopeScaling::Type::kLinear;
      c.rope_scaling.factor = float(g.get_float(key("rope.scaling.factor")));
    } else {
      LY_CHECK(*type == "none", ErrorCode::kUnsupported,
               "{}: {} '{}' is not supported (none, linear)", g.path(), key("rope.scaling.type"),
               *type);
    }
  }
  if (auto n = g.get_uint_opt(key("vocab_size"))) {
    c.vocab_size = int(*n);
  } else {
    c.vocab_size = int(g.get_string_array("tokenizer.ggml.tokens").size());
  }
  c.tie_embeddings = g.find_tensor("output.weight") == nullptr;
  // Qwen2 always has q/k/v biases and Qwen3 always q/k norms; other biases are optional in these
  // graphs (llama.cpp loads them when present), so layer 0 decides and the weight table then
  // requires them in every layer with the right shape.
  const auto has = [&](const char* name) { return g.find_tensor(name) != nullptr; };
  c.qkv_bias = c.arch == Arch::kQwen2 || has("blk.0.attn_q.bias");
  c.o_bias = has("blk.0.attn_output.bias");
  c.mlp_bias = c.arch != Arch::kQwen2 && c.arch != Arch::kQwen3 && has("blk.0.ffn_up.bias");
  c.qk_norm = c.arch == Arch::kQwen3;
  c.name = std::string(g.get_string_opt("general.name").value_or(""));
  c.validate(g.path());
  return c;
}

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    const float expo = float(2 * i) / float(c.head_dim);
    inv[i] = 1.0f / std::pow(c.rope_theta, expo);
  }
  const RopeScaling& s = c.rope_scaling;
  if (s.type == RopeScaling::Type::kLinear) {
    for (float& f : inv) f /= s.factor;
  } else if (s.type == RopeScaling::Type::kLlama3) {
    const float old_len = float(s.original_max_position);
    const float low_wavelen = old_len / s.low_freq_factor;
    const float high_wavelen = old_len / s.high_freq_factor;
    for (float& f : inv) {
      // transformers computes 2*pi / t as reciprocal(t) * 2*pi in f32.
      const float wavelen = (1.0f / f) * (2.0f * std::numbers::pi_v<float>);
      const float scaled = wavelen > low_wavelen ? f / s.factor : f;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      if (medium) {
        const float smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1.0f - smooth) * scaled / s.factor + smooth * scaled;
      } else {
        f = scaled;
      }
    }
  }
  return inv;
}

}  // namespace lychee
