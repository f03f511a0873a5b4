#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace lychee {

void SamplingParams::validate() const {
  LY_CHECK(temperature >= 0.0f && std::isfinite(temperature), ErrorCode::kInvalidArgument,
           "temperature must be >= 0, got {}", temperature);
  LY_CHECK(top_k >= 0, ErrorCode::kInvalidArgument, "top_k must be >= 0, got {}", top_k);
  LY_CHECK(top_p > 0.0f && top_p <= 1.0f, ErrorCode::kInvalidArgument,
           "top_p must be in (0, 1], got {}", top_p);
}

int32_t argmax(std::span<const float> logits) {
  LY_CHECK(!logits.empty(), ErrorCode::kInvalidArgument, "argmax of empty logits");
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[size_t(best)]) best = int32_t(i);
  return best;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  params_.validate();
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.temperature == 0.0f) return argmax(logits);
  cand_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) cand_[i] = {logits[i] / params_.temperature, int32_t(i)};
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  size_t n = cand_.size();
  if (params_.top_k > 0 && size_t(params_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + params_.top_k, cand_.end(), by_logit);
    n = size_t(params_.top_k);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Softmax over the kept candidates (sorted, so the first is the max).
  const float mx = cand_[0].first;
  double sum = 0.0;
  std::vector<double> p(n);
  for (size_t i = 0; i < n; ++i) sum += p[i] = std::exp(double(cand_[i].first - mx));
  // Top-p: the smallest prefix whose probability reaches top_p.
  if (params_.top_p < 1.0f) {
    double cum = 0.0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += p[i] / sum;
      if (cum >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
    sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += p[i];
  }
  const double u = std::uniform_real_distribution<double>(0.0, sum)(rng_);
  double acc = 0.0;
  for (size_t i = 0; i < n; ++i) {
    acc += p[i];
    if (u < acc) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

}  // namespace lychee
