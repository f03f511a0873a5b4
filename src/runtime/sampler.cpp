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

namespace {

// The candidates a draw chooses among: cand[0, n) sorted by decreasing logit (index on ties), w[i]
// their unnormalised softmax weights, sum their total. Returns n.
size_t kept_candidates(std::span<const float> logits, const SamplingParams& params,
                       std::vector<std::pair<float, int32_t>>& cand, std::vector<double>& w, double& sum) {
  cand.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) cand[i] = {logits[i] / params.temperature, int32_t(i)};
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  size_t n = cand.size();
  if (params.top_k > 0 && size_t(params.top_k) < n) {
    std::partial_sort(cand.begin(), cand.begin() + params.top_k, cand.end(), by_logit);
    n = size_t(params.top_k);
  } else {
    std::sort(cand.begin(), cand.end(), by_logit);
  }
  // Softmax over the kept candidates (sorted, so the first is the max).
  const float mx = cand[0].first;
  sum = 0.0;
  w.resize(n);
  for (size_t i = 0; i < n; ++i) sum += w[i] = std::exp(double(cand[i].first - mx));
  // Top-p: the smallest prefix whose probability reaches top_p.
  if (params.top_p < 1.0f) {
    double cum = 0.0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += w[i] / sum;
      if (cum >= params.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
    sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += w[i];
  }
  return n;
}

}  // namespace

int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.temperature == 0.0f) return argmax(logits);
  double sum = 0.0;
  std::vector<double> p;
  const size_t n = kept_candidates(logits, params_, cand_, p, sum);
  const double u = std::uniform_real_distribution<double>(0.0, sum)(rng_);
  double acc = 0.0;
  for (size_t i = 0; i < n; ++i) {
    acc += p[i];
    if (u < acc) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

void sampling_distribution(std::span<const float> logits, const SamplingParams& params, std::vector<double>& probs) {
  probs.assign(logits.size(), 0.0);
  if (params.temperature == 0.0f) {
    probs[size_t(argmax(logits))] = 1.0;
    return;
  }
  std::vector<std::pair<float, int32_t>> cand;
  std::vector<double> w;
  double sum = 0.0;
  const size_t n = kept_candidates(logits, params, cand, w, sum);
  for (size_t i = 0; i < n; ++i) probs[size_t(cand[i].second)] = w[i] / sum;
}

}  // namespace lychee
