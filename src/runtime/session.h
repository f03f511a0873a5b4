// A Session is one sequence on one backend: it owns the sequence's KV cache and turns tokens
// into next-token logits. Generation, chat, eval and bench drive sessions; they do not know the
// backend.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "attention/policy.h"
#include "cpu/model.h"

namespace lychee {

class Session {
 public:
  virtual ~Session() = default;
  // Appends tokens (a prompt chunk or one decoded token) and returns the logits of the last
  // one: [vocab] f32, valid until the next call.
  virtual std::span<const float> forward(std::span<const int32_t> tokens) = 0;
  virtual int length() const = 0;     // tokens in the cache
  virtual int capacity() const = 0;   // most tokens the cache can hold
  virtual void truncate(int n) = 0;   // keep the first n tokens
  // The decode-time attention policy (nullptr = dense). Prefill is always dense.
  virtual void set_policy(AttentionPolicy* policy) = 0;
};

class CpuSession final : public Session {
 public:
  CpuSession(cpu::Model& model, int capacity);
  std::span<const float> forward(std::span<const int32_t> tokens) override;
  int length() const override { return kv_.length(); }
  int capacity() const override { return kv_.capacity(); }
  void truncate(int n) override { kv_.set_length(n); }
  void set_policy(AttentionPolicy* policy) override { policy_ = policy; }
  const cpu::KvCache& kv() const { return kv_; }

 private:
  cpu::Model& model_;
  cpu::KvCache kv_;
  AttentionPolicy* policy_ = nullptr;
  std::vector<float> logits_;
};

}  // namespace lychee
