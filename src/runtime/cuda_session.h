// A Session on the CUDA backend: one sequence in the GPU runner's paged KV cache. Attention
// policies run through the hybrid-head kernel: the session hands the runner the policy's
// DecodeSpec and counts what decode steps read on the device. Sessions may share one runner (the
// server steps many in turn): a session re-sets its policy when another set theirs since, queues
// the copy of its read counts after each step (read later, without waiting), and refuses to read
// logits another session's step replaced, unless it keeps them (keep_logits: copied to the host
// before that step). sample_and_feed queues the sampled token's decode step
// before the token reaches the host (generate's pipelined loop).
// Compiled only with CUDA.
#pragma once

#include <vector>

#include "cuda/runner/gpu_runner.h"
#include "runtime/session.h"

namespace lychee {

class GpuSession final : public Session {
 public:
  GpuSession(cuda::GpuRunner& runner, int capacity);
  ~GpuSession() override;
  void feed(std::span<const int32_t> tokens, bool allow_policy = true) override;
  std::span<const float> logits() override;
  void keep_logits(bool keep) override;
  int32_t sample(Sampler& sampler) override;
  int32_t sample_and_feed(Sampler& sampler, bool feed_next, bool allow_policy = true) override;
  bool runs_ahead() const override { return true; }
  int length() const override { return seq_.length; }
  int capacity() const override { return capacity_; }
  void truncate(int n) override;
  void copy_prefix(const Session& from, int n) override;
  void set_policy(AttentionPolicy* policy) override;
  // One decode step of the n rows (GpuRunner::verify) where it fits, else one forward pass through
  // the prefill kernels with every row's logits (GpuRunner::prefill's all_logits): Full's decode
  // steps within bf16 rounding, not bit for bit.
  std::span<const float> verify(std::span<const int32_t> tokens) override;
  const KvReadStats& stats() const override;
  void reset_stats() override;

 protected:
  // Groups the sessions by their policy's DecodeSpec (no policy: dense) and runs each group as
  // batched runner steps; after(i) right after the step holding session i.
  void decode_together(std::span<Session* const> sessions, std::span<const int32_t> tokens,
                       const std::function<void(size_t)>& after) override;
  // Groups the sessions by their row count into verification steps (GpuRunner::verify) of as
  // many sequences as fit; after(i, rows) once session i's rows are copied.
  void verify_together(std::span<Session* const> sessions, std::span<const std::span<const int32_t>> tokens,
                       const VerifiedRows& after) override;

 private:
  cuda::GpuRunner& runner_;
  cuda::GpuSeq seq_;
  int capacity_;
  AttentionPolicy* policy_ = nullptr;
  void check_last_forward() const;
  void check_verify_rows(int n) const;  // verify's checks for n rows
  // This session's rows [first, first + n) of the verification pass just run, copied into rows_
  // (before: the length the pass started from).
  std::span<const float> verified(int first, int n, int before);
  // This session's logits are the runner's rows now: with keep_logits_, copied to the host before
  // the next forward pass (GpuRunner::call_before_next_forward).
  void own_logits();
  void decode_step(std::span<const int32_t> tokens, bool allow_policy);  // empty tokens: fed on the device
  // The runner's policy set to this session's (if another session's is in force).
  void use_policy();
  // This session's step as row `row` of a decode step just run: its counts become the pending
  // step (device reads from row `row` of `reads`).
  void stepped(int row, const cuda::Ticket& reads);
  cuda::Ticket queue_sample(Sampler& sampler);
  // A decode step's counts, added to stats_ once the step is known to stay: at the session's
  // next call (a pipelined step dropped by truncate(length() - 1) right after is not counted).
  // Its device-side reads arrive through a ticket, read then (the copy is long done by then).
  struct PendingStep {
    bool active = false;
    KvReadStats counts;
    cuda::Ticket reads;  // id 0: none
    int row = 0;         // this session's row of the counters
  };
  void commit_pending() const;
  mutable PendingStep pending_;
  mutable KvReadStats stats_;
  int policy_epoch_ = -1;  // the runner's policy epoch when this session set its policy
  uint64_t forward_ = 0;   // the runner's forward count after this session's last step
  int row_ = 0;            // this session's logits row in that forward pass
  std::vector<float> logits_;
  std::vector<float> rows_;  // verify's logits [n, vocab]
  bool logits_valid_ = false;
  bool keep_logits_ = false;
};

}  // namespace lychee
