#include "runtime/session.h"

namespace lychee {

CpuSession::CpuSession(cpu::Model& model, int capacity) : model_(model), kv_(model.config(), capacity) {}

std::span<const float> CpuSession::forward(std::span<const int32_t> tokens) {
  if (policy_ != nullptr && kv_.length() == 0) policy_->reset();
  // A single token after a prefilled prompt is a decode step; prompts are prefilled densely.
  const bool decode = policy_ != nullptr && tokens.size() == 1 && kv_.length() > 0;
  if (decode) policy_->begin_step(kv_.length() + 1);
  model_.forward(tokens, kv_, logits_, /*all_logits=*/false, decode ? policy_ : nullptr);
  return logits_;
}

}  // namespace lychee
