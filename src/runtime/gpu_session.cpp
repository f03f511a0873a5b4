#ifdef LYCHEE_HAS_CUDA

#include "runtime/gpu_session.h"

#include "core/error.h"

namespace lychee {

GpuSession::GpuSession(cuda::GpuRunner& runner, int capacity)
    : runner_(runner), capacity_(std::min(capacity, runner.max_context())),
      logits_(size_t(runner.config().vocab_size)) {
  LY_CHECK(capacity_ > 0, ErrorCode::kInvalidArgument, "session capacity must be positive");
}

GpuSession::~GpuSession() { runner_.release(seq_); }

void GpuSession::feed(std::span<const int32_t> tokens, bool allow_policy) {
  (void)allow_policy;  // dense on the GPU
  LY_CHECK(seq_.length + int(tokens.size()) <= capacity_, ErrorCode::kCapacity,
           "KV cache full: {} cached + {} new tokens exceed the session's {} tokens", seq_.length,
           tokens.size(), capacity_);
  logits_valid_ = false;
  if (tokens.size() == 1 && seq_.length > 0) {
    cuda::GpuSeq* seqs[] = {&seq_};
    runner_.decode(seqs, tokens);
    const ModelConfig& c = runner_.config();
    ++stats_.decode_steps;
    stats_.token_reads += uint64_t(c.n_layers) * c.n_kv_heads * uint64_t(seq_.length);
    stats_.dense_token_reads += uint64_t(c.n_layers) * c.n_kv_heads * uint64_t(seq_.length);
  } else {
    runner_.prefill(seq_, tokens);
  }
}

std::span<const float> GpuSession::logits() {
  if (!logits_valid_) {
    runner_.copy_logits(0, logits_);
    logits_valid_ = true;
  }
  return logits_;
}

int32_t GpuSession::sample(Sampler& sampler) {
  const SamplingParams& p = sampler.params();
  int32_t token = 0;
  if (p.temperature == 0.0f) {
    runner_.greedy(1, std::span<int32_t>(&token, 1));
  } else {
    runner_.sample(1, p.temperature, p.top_k, p.top_p, p.seed, std::span<int32_t>(&token, 1));
  }
  return token;
}

void GpuSession::truncate(int n) {
  runner_.truncate(seq_, n);
  logits_valid_ = false;
}

void GpuSession::set_policy(AttentionPolicy* policy) {
  LY_CHECK(policy == nullptr || policy->name() == "full", ErrorCode::kUnsupported,
           "policy '{}' runs on the CPU reference only for now (--device cpu); the GPU runs full attention",
           policy ? policy->name() : "");
}

}  // namespace lychee

#endif  // LYCHEE_HAS_CUDA
