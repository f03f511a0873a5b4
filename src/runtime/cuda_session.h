// A Session on the CUDA backend: one sequence in the GPU runner's paged KV cache. Attention
// policies run through the hybrid-head kernel: the session hands the runner the policy's
// DecodeSpec and counts what decode steps read on the device. Compiled only with CUDA.
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
  mutable KvReadStats stats_;
  mutable bool reads_pending_ = false;  // device counters hold reads not yet in stats_
  std::vector<float> logits_;
  bool logits_valid_ = false;
};

}  // namespace lychee
