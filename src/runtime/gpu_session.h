// A Session on the CUDA backend: one sequence in the GPU runner's paged KV cache. Attention
// policies run through the hybrid-head kernel: the session turns the reference policy object
// into the runner's GpuPolicy (to_gpu_policy) and counts what decode steps read on the device.
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

// The GPU form of a reference policy (Full, Lychee, Tidal, Quest, Duo); kUnsupported for a policy
// type with none. GpuRunner::set_policy rejects the settings the hybrid-head kernel does not run
// (e.g. a LycheeDecode block size that does not divide the KV page), naming the option.
cuda::GpuPolicy to_gpu_policy(const AttentionPolicy& policy);

}  // namespace lychee

#endif  // LYCHEE_HAS_CUDA
