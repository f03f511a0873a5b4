// A Session is one sequence on one backend: it owns the sequence's KV cache and turns tokens
// into next-token logits. Generation, chat, eval and bench drive sessions; they do not know the
// backend.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "attention/policy.h"
#include "cpu/model.h"
#include "runtime/sampler.h"

namespace lychee {

class Session {
 public:
  virtual ~Session() = default;
  // Appends tokens (a prompt chunk or one decoded token). A single token after a prefix is a
  // decode step and goes through the policy (unless allow_policy is false); anything else is a
  // dense prefill.
  virtual void feed(std::span<const int32_t> tokens, bool allow_policy = true) = 0;
  // The logits of the last fed token, [vocab] f32 on the host, valid until the next feed (GPU
  // sessions copy them from the device).
  virtual std::span<const float> logits() = 0;
  // Whether logits() stays readable after other sessions of the same engine step (a reference and
  // a test session fed in turn: compare_perplexity). The CPU keeps every session's logits anyway.
  // A GPU session shares its runner's logits rows, which the next forward pass overwrites: kept,
  // it copies its row to the host right before another session's pass (a synchronous copy of
  // vocab floats, hence off by default: the server samples before it steps another session). It
  // does not extend to sample(), which reads the device rows.
  virtual void keep_logits(bool keep) { (void)keep; }
  // The next token from the last logits with the sampler's parameters (GPU sessions sample on
  // the device).
  virtual int32_t sample(Sampler& sampler) { return sampler.sample(logits()); }
  // Pipelined decoding: the next token from the last logits and, when feed_next, that token fed
  // as the next decode step. A backend that runs asynchronously (the GPU) queues the step before
  // the token reaches the host, so the device never waits for the host between steps; a caller
  // that then stops drops the queued step with truncate(length() - 1) right away (its reads are
  // not counted). The default samples, then feeds.
  virtual int32_t sample_and_feed(Sampler& sampler, bool feed_next, bool allow_policy = true) {
    const int32_t token = sample(sampler);
    if (feed_next) feed(std::span<const int32_t>(&token, 1), allow_policy);
    return token;
  }
  // Prefix reuse: this session, empty, takes the first n cached tokens of `from` (a session of the
  // same backend and model) without computing them; the next feed continues at position n.
  // Throws kUnsupported where a backend cannot, kInvalidArgument for a bad source or length.
  virtual void copy_prefix(const Session& from, int n);
  // Whether sample_and_feed runs ahead of the host. generate uses it then; otherwise it samples,
  // checks for a stop, and only then feeds, so that no step is computed in vain.
  virtual bool runs_ahead() const { return false; }
  // Speculative verification (runtime/speculative.h): appends `tokens` after a non-empty prefix
  // densely (no policy; causal among themselves) and returns the logits of every one of them,
  // [n, vocab] f32 on the host, valid until the next feed. Row i is bit for bit what a Full decode
  // step of tokens[i] gives after tokens[0..i) (the CPU: one pass where its chunks are
  // row-invariant, else row by row; the GPU: one decode step whose rows alias the sequence). The
  // default feeds them one by one as dense decode steps. Counted as dense re-reads
  // (KvReadStats::correction_token_reads).
  virtual std::span<const float> verify(std::span<const int32_t> tokens);
  std::span<const float> forward(std::span<const int32_t> tokens, bool allow_policy = true) {
    feed(tokens, allow_policy);
    return logits();
  }
  // Batched decoding (the server's step): one decode step of each of `sessions` (of one backend
  // and model, each at most once), sessions[i] fed tokens[i] through its policy. after(i) is
  // called once session i's step has run and before any other forward pass, so the caller reads
  // its logits or samples there. The GPU runs the sessions whose policies compile to the same
  // DecodeSpec as one batch (one launch per layer, rows of at most the runner's batch); the
  // default steps them one at a time. Every session is checked (capacity, a prefix to continue)
  // before any runs; Error names the session's index.
  static void decode_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens,
                           const std::function<void(size_t)>& after);
  // Batched verification (the server's speculating requests): sessions[i] verifies tokens[i] as
  // verify() does (each session at most once, of one backend and model), and after(i, rows) gets
  // its rows [tokens[i].size(), vocab] once they are in, before any other forward pass. The GPU
  // runs the sessions of equal row counts as one verification step where the runner takes it
  // (GpuRunner::verify_step_fits; batch-invariant sessions alone); the default verifies them one
  // at a time. Every session is checked (a prefix, capacity, distinct) before any runs; Error
  // names the session's index.
  using VerifiedRows = std::function<void(size_t, std::span<const float>)>;
  static void verify_batch(std::span<Session* const> sessions, std::span<const std::span<const int32_t>> tokens,
                           const VerifiedRows& after);
  virtual int length() const = 0;     // tokens in the cache
  virtual int capacity() const = 0;   // most tokens the cache can hold
  // Keeps the first n tokens; the policy is reset (its per-sequence state is rebuilt).
  virtual void truncate(int n) = 0;
  // The decode-time attention policy (nullptr = dense), reset on the way in. Not owned.
  virtual void set_policy(AttentionPolicy* policy) = 0;
  // What decode steps (and cache corrections) read from the KV cache since the last reset.
  virtual const KvReadStats& stats() const = 0;
  virtual void reset_stats() = 0;
  // Batch-invariant decoding: this session's decode steps give the same logits (bit for bit)
  // whatever other sessions decode_batch runs beside it (the server's seeded requests). The
  // CPU steps sessions one at a time, so it always is; the GPU then runs the session only in
  // batches of batch-invariant sessions, with per-head splits (GpuRunner::decode).
  void set_batch_invariant(bool on) { batch_invariant_ = on; }
  bool batch_invariant() const { return batch_invariant_; }

 protected:
  bool batch_invariant_ = false;
  std::vector<float> verify_rows_;  // the default verify's logits [n, vocab]
  // decode_batch's work, called on sessions[0] once the arguments are checked.
  virtual void decode_together(std::span<Session* const> sessions, std::span<const int32_t> tokens,
                               const std::function<void(size_t)>& after);
  // verify_batch's work, likewise.
  virtual void verify_together(std::span<Session* const> sessions, std::span<const std::span<const int32_t>> tokens,
                               const VerifiedRows& after);
};

class CpuSession final : public Session {
 public:
  // kv_dtype kFp8: the cache holds the values FP8 codes stand for (cpu/kv_cache.h).
  CpuSession(cpu::Model& model, int capacity, KvCacheDtype kv_dtype = KvCacheDtype::kBf16);
  void feed(std::span<const int32_t> tokens, bool allow_policy = true) override;
  std::span<const float> logits() override { return logits_; }
  int length() const override { return kv_.length(); }
  int capacity() const override { return kv_.capacity(); }
  void truncate(int n) override;
  void set_policy(AttentionPolicy* policy) override;
  void copy_prefix(const Session& from, int n) override;
  std::span<const float> verify(std::span<const int32_t> tokens) override;
  const KvReadStats& stats() const override { return stats_; }
  void reset_stats() override { stats_ = {}; }
  const cpu::KvCache& kv() const { return kv_; }

 private:
  cpu::Model& model_;
  cpu::KvCache kv_;
  AttentionPolicy* policy_ = nullptr;
  KvReadStats stats_;
  std::vector<float> logits_;
  std::vector<float> rows_;                   // verify's logits [n, vocab]
  std::unique_ptr<AttentionPolicy> full_;     // verify's Full decode steps (made on first use)
};

}  // namespace lychee
