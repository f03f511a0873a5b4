#include "runtime/session.h"

#include <algorithm>

#include "attention/policies.h"
#include "attention/spec_policy.h"
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

namespace {

void check_verify(const Session& s, std::span<const int32_t> tokens) {
  LY_CHECK(!tokens.empty(), ErrorCode::kInvalidArgument, "verify needs at least one token");
  LY_CHECK(s.length() > 0, ErrorCode::kInvalidArgument, "verify of an empty sequence (prefill first)");
  LY_CHECK(s.length() + int(tokens.size()) <= s.capacity(), ErrorCode::kCapacity,
           "KV cache full: {} cached + {} verified tokens exceed the session's {} tokens", s.length(),
           tokens.size(), s.capacity());
}

}  // namespace

std::span<const float> Session::verify(std::span<const int32_t> tokens) {
  check_verify(*this, tokens);
  verify_rows_.clear();
  for (size_t i = 0; i < tokens.size(); ++i) {
    feed(tokens.subspan(i, 1), /*allow_policy=*/false);
    const std::span<const float> l = logits();
    verify_rows_.insert(verify_rows_.end(), l.begin(), l.end());
  }
  return verify_rows_;
}

// A native model's chunk of fewer than min_gemm_rows() rows computes each row as its decode step
// does, and a Full policy's step equals a step without one (cpu/model.h): one pass. Otherwise (f32
// weights, whose chunks go through sgemm and BLAS attention while a Full step sums in double) the
// rows are Full decode steps one by one.
std::span<const float> CpuSession::verify(std::span<const int32_t> tokens) {
  check_verify(*this, tokens);
  const int n = int(tokens.size());
  const int before = kv_.length();
  if (model_.weights().format() == WeightFormat::kNative && n < model_.min_gemm_rows()) {
    model_.forward(tokens, kv_, rows_, /*all_logits=*/true);
  } else {
    if (full_ == nullptr) {
      full_ = std::make_unique<SpecPolicy>(full_spec(model_.config()));
      full_->reset();
    }
    rows_.clear();
    for (int i = 0; i < n; ++i) {
      full_->begin_step(kv_.length() + 1);
      model_.forward(tokens.subspan(size_t(i), 1), kv_, logits_, false, full_.get(), nullptr);
      rows_.insert(rows_.end(), logits_.begin(), logits_.end());
    }
  }
  const size_t vocab = size_t(model_.config().vocab_size);
  logits_.assign(rows_.end() - std::ptrdiff_t(vocab), rows_.end());
  if (policy_ != nullptr) policy_->reset();  // its per-sequence state did not see these tokens
  const ModelConfig& c = model_.config();
  stats_.correction_token_reads += uint64_t(c.n_layers) * uint64_t(c.n_kv_heads) * uint64_t(before + n);
  return rows_;
}

void Session::verify_batch(std::span<Session* const> sessions, std::span<const std::span<const int32_t>> tokens,
                           const VerifiedRows& after) {
  LY_CHECK(sessions.size() == tokens.size(), ErrorCode::kInvalidArgument,
           "verify_batch: {} sessions but {} token lists", sessions.size(), tokens.size());
  if (sessions.empty()) return;
  for (size_t i = 0; i < sessions.size(); ++i) {
    const Session* s = sessions[i];
    LY_CHECK(s != nullptr, ErrorCode::kInvalidArgument, "verify_batch: session {} is null", i);
    try {
      check_verify(*s, tokens[i]);
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("verify_batch: session {}: {}", i, e.what()));
    }
    for (size_t j = 0; j < i; ++j)
      LY_CHECK(sessions[j] != s, ErrorCode::kInvalidArgument, "verify_batch: sessions {} and {} are the same", j, i);
  }
  sessions[0]->verify_together(sessions, tokens, after);
}

void Session::verify_together(std::span<Session* const> sessions, std::span<const std::span<const int32_t>> tokens,
                              const VerifiedRows& after) {
  for (size_t i = 0; i < sessions.size(); ++i) {
    const std::span<const float> rows = sessions[i]->verify(tokens[i]);
    if (after) after(i, rows);
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
