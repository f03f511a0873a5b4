#include "runtime/cuda_session.h"

#include "attention/policies.h"
#include "core/error.h"

namespace lychee {

GpuSession::GpuSession(cuda::GpuRunner& runner, int capacity)
    : runner_(runner), capacity_(std::min(capacity, runner.max_context())),
      logits_(size_t(runner.config().vocab_size)) {
  LY_CHECK(capacity_ > 0, ErrorCode::kInvalidArgument, "session capacity must be positive");
}

GpuSession::~GpuSession() { runner_.release(seq_); }

void GpuSession::feed(std::span<const int32_t> tokens, bool allow_policy) {
  LY_CHECK(seq_.length + int(tokens.size()) <= capacity_, ErrorCode::kCapacity,
           "KV cache full: {} cached + {} new tokens exceed the session's {} tokens", seq_.length,
           tokens.size(), capacity_);
  logits_valid_ = false;
  const ModelConfig& c = runner_.config();
  if (tokens.size() == 1 && seq_.length > 0) {
    cuda::GpuSeq* seqs[] = {&seq_};
    const bool with_policy = allow_policy && policy_ != nullptr;
    // Sessions share the runner: another session may have set its own policy since.
    if (with_policy && runner_.policy_epoch() != policy_epoch_) {
      runner_.set_policy(policy_->spec());
      policy_epoch_ = runner_.policy_epoch();
    }
    runner_.decode(seqs, tokens, with_policy);
    forward_ = runner_.forwards();
    if (!allow_policy) return;  // like the CPU session: a step outside the policy is not counted
    const uint64_t n_ctx = uint64_t(seq_.length);
    ++stats_.decode_steps;
    stats_.dense_token_reads += uint64_t(c.n_layers) * c.n_kv_heads * n_ctx;
    if (with_policy) {
      // Counted on the device in row 0, which every session's single-sequence step uses: take
      // them now, before another session's step adds to them.
      stats_.token_reads += runner_.take_token_reads()[0];
      for (int l = 0; l < c.n_layers; ++l) stats_.metadata_bytes += policy_->metadata_bytes(l, int(n_ctx));
    } else {
      stats_.token_reads += uint64_t(c.n_layers) * c.n_kv_heads * n_ctx;
    }
    return;
  }
  const int before = seq_.length;
  runner_.prefill(seq_, tokens);
  forward_ = runner_.forwards();
  if (!allow_policy && before > 0 && policy_ != nullptr)  // cache correction: a dense re-prefill
    stats_.correction_token_reads += uint64_t(c.n_layers) * uint64_t(c.n_kv_heads) * uint64_t(seq_.length);
}

const KvReadStats& GpuSession::stats() const { return stats_; }

void GpuSession::reset_stats() { stats_ = {}; }

// The runner's logits rows belong to its last forward pass: reading them after another session
// stepped would silently give that session's logits.
void GpuSession::check_last_forward() const {
  LY_CHECK(runner_.forwards() == forward_, ErrorCode::kInternal,
           "GPU session: another session ran a forward pass on the shared runner since this session's last "
           "step; read this session's logits (or sample) before stepping another");
}

std::span<const float> GpuSession::logits() {
  if (!logits_valid_) {
    check_last_forward();
    runner_.copy_logits(0, logits_);
    logits_valid_ = true;
  }
  return logits_;
}

int32_t GpuSession::sample(Sampler& sampler) {
  check_last_forward();
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
  runner_.set_policy(policy != nullptr ? policy->spec() : full_spec(runner_.config()));
  policy_epoch_ = runner_.policy_epoch();
  policy_ = policy;
  if (policy_ != nullptr) policy_->reset();
}

}  // namespace lychee
