// Token sampling from logits: greedy, temperature, top-k, top-p, seeded.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace lychee {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 0;
  void validate() const;     // throws Error(kInvalidArgument) naming the bad field
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // logits: [vocab] f32. Greedy takes the lowest index among equal maxima.
  int32_t sample(std::span<const float> logits);
  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
};

int32_t argmax(std::span<const float> logits);

}  // namespace lychee
