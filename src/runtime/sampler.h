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

// The distribution Sampler::sample draws from: softmax(logits / T) over the top_k largest, then the
// smallest prefix (by decreasing probability) whose mass reaches top_p, renormalised; 0 elsewhere.
// probs: [vocab] f64. Greedy params (T = 0) give all mass to argmax(logits). Speculative sampling's
// draft and verifier distributions (runtime/speculative.h).
void sampling_distribution(std::span<const float> logits, const SamplingParams& params, std::vector<double>& probs);

}  // namespace lychee
