#include "runtime/session.h"

#include "core/error.h"

namespace lychee {

CpuSession::CpuSession(cpu::Model& model, int capacity, KvCacheDtype kv_dtype)
    : model_(model), kv_(model.config(), capacity, kv_dtype) {}

void CpuSession::feed(std::span<const int32_t> tokens, bool allow_policy) {
  if (policy_ != nullptr && kv_.length() == 0) policy_->reset();
  const bool decode = tokens.size() == 1 && kv_.length() > 0;
  AttentionPolicy* policy = decode && allow_policy ? policy_ : nullptr;
  if (policy != nullptr) policy->begin_step(kv_.length() + 1);
  model_.forward(tokens, kv_, logits_, /*all_logits=*/false, policy, decode && allow_policy ? &stats_ : nullptr);
  if (!allow_policy && kv_.length() > int(tokens.size()) && policy_ != nullptr) {
    // A dense re-prefill over a prefix (cache correction) reads every cached token once per
    // (layer, KV head).
    const ModelConfig& c = model_.config();
    stats_.correction_token_reads += uint64_t(c.n_layers) * uint64_t(c.n_kv_heads) * uint64_t(kv_.length());
  }
}

void Session::decode_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens,
                           const std::function<void(size_t)>& after) {
  LY_CHECK(sessions.size() == tokens.size(), ErrorCode::kInvalidArgument,
           "decode_batch: {} sessions but {} tokens", sessions.size(), tokens.size());
  if (sessions.empty()) return;
  for (size_t i = 0; i < sessions.size(); ++i) {
    const Session* s = sessions[i];
    LY_CHECK(s != nullptr, ErrorCode::kInvalidArgument, "decode_batch: session {} is null", i);
    LY_CHECK(s->length() > 0, ErrorCode::kInvalidArgument, "decode_batch: session {} is empty (prefill first)", i);
    LY_CHECK(s->length() + 1 <= s->capacity(), ErrorCode::kCapacity,
             "KV cache full: session {} holds {} tokens, its capacity", i, s->length());
    for (size_t j = 0; j < i; ++j)
      LY_CHECK(sessions[j] != s, ErrorCode::kInvalidArgument, "decode_batch: sessions {} and {} are the same", j, i);
  }
  sessions[0]->decode_together(sessions, tokens, after);
}

void Session::decode_together(std::span<Session* const> sessions, std::span<const int32_t> tokens,
                              const std::function<void(size_t)>& after) {
  for (size_t i = 0; i < sessions.size(); ++i) {
    sessions[i]->feed(tokens.subspan(i, 1));
    if (after) after(i);
  }
}

void Session::copy_prefix(const Session&, int) {
  LY_CHECK(false, ErrorCode::kUnsupported, "this backend's sessions cannot copy a cached prefix");
}

void CpuSession::copy_prefix(const Session& from, int n) {
  const auto* other = dynamic_cast<const CpuSession*>(&from);
  LY_CHECK(other != nullptr && &other->model_ == &model_, ErrorCode::kInvalidArgument,
           "a CPU session copies a prefix only from a CPU session of the same model");
  kv_.copy_prefix(other->kv_, n);
  if (policy_ != nullptr) policy_->reset();
}

void CpuSession::truncate(int n) {
  kv_.set_length(n);
  if (policy_ != nullptr) policy_->reset();
}

void CpuSession::set_policy(AttentionPolicy* policy) {
  policy_ = policy;
  if (policy_ != nullptr) policy_->reset();
}

}  // namespace lychee
