// A Session on the CUDA backend: one sequence in the GPU runner's paged KV cache. Full attention
// for now; sparse policies reach the GPU with the hybrid-head kernel (see ARCHITECTURE.md).
#pragma once

#ifdef LYCHEE_HAS_CUDA

#include <vector>

#include "cuda/gpu_runner.h"
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
  const KvReadStats& stats() const override { return stats_; }
  void reset_stats() override { stats_ = {}; }

 private:
  cuda::GpuRunner& runner_;
  cuda::GpuSeq seq_;
  int capacity_;
  KvReadStats stats_;
  std::vector<float> logits_;
  bool logits_valid_ = false;
};

}  // namespace lychee

#endif  // LYCHEE_HAS_CUDA
