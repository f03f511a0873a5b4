// A Session on the CUDA backend: one sequence in the GPU runner's paged KV cache. Attention
// policies run through the hybrid-head kernel: the session hands the runner the policy's
// DecodeSpec and counts what decode steps read on the device. Sessions may share one runner (the
// server steps many in turn): a session re-sets its policy when another set theirs since, takes
// its read counts after each step, and refuses to read logits another session's step replaced.
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
  int32_t sample(Sampler& sampler) override;
  int length() const override { return seq_.length; }
  int capacity() const override { return capacity_; }
  void truncate(int n) override;
  void set_policy(AttentionPolicy* policy) override;
  const KvReadStats& stats() const override;
  void reset_stats() override;

 private:
  cuda::GpuRunner& runner_;
  cuda::GpuSeq seq_;
  int capacity_;
  AttentionPolicy* policy_ = nullptr;
  void check_last_forward() const;

  KvReadStats stats_;
  int policy_epoch_ = -1;  // the runner's policy epoch when this session set its policy
  uint64_t forward_ = 0;   // the runner's forward count after this session's last step
  std::vector<float> logits_;
  bool logits_valid_ = false;
};

}  // namespace lychee
