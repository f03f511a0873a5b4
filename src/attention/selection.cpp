#include "attention/selection.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace lychee {

const char* select_strategy_name(SelectStrategy s) {
  switch (s) {
    case SelectStrategy::kTopK: return "topk";
    case SelectStrategy::kTopP: return "topp";
    case SelectStrategy::kThreshold: return "threshold";
    case SelectStrategy::kRatio: return "ratio";
  }
  return "?";
}

SelectStrategy parse_select_strategy(const std::string& name) {
  if (name == "topk") return SelectStrategy::kTopK;
  if (name == "topp") return SelectStrategy::kTopP;
  if (name == "threshold") return SelectStrategy::kThreshold;
  if (name == "ratio") return SelectStrategy::kRatio;
  fail(ErrorCode::kInvalidArgument, "unknown selection strategy '{}' (topk, topp, threshold, ratio)", name);
}

void SelectParams::validate() const {
  LY_CHECK(budget >= 1, ErrorCode::kInvalidArgument, "selection budget must be >= 1 token, got {}", budget);
  LY_CHECK(sink >= 0 && recent >= 0, ErrorCode::kInvalidArgument,
           "sink and recent must be >= 0, got {} and {}", sink, recent);
  switch (strategy) {
    case SelectStrategy::kTopK: break;
    case SelectStrategy::kTopP:
      LY_CHECK(value > 0.0 && value <= 1.0, ErrorCode::kInvalidArgument, "top-p value must be in (0, 1], got {}", value);
      break;
    case SelectStrategy::kThreshold:
      LY_CHECK(value >= 0.0 && value < 1.0, ErrorCode::kInvalidArgument,
               "threshold value must be a probability in [0, 1), got {}", value);
      break;
    case SelectStrategy::kRatio:
      LY_CHECK(value > 0.0 && value <= 1.0, ErrorCode::kInvalidArgument, "ratio value must be in (0, 1], got {}", value);
      break;
  }
}

int topk_units(const SelectParams& params, int unit_size, int n_tokens) {
  const double tokens = params.strategy == SelectStrategy::kRatio
                            ? std::ceil(params.value * n_tokens)
                            : double(params.budget);
  return std::max(1, int(tokens) / unit_size);
}

namespace {

// Units that are always kept: those holding sink tokens, recent tokens, and the last unit.
std::vector<uint8_t> forced_units(int n_units, int unit_size, int n_tokens, const SelectParams& p) {
  std::vector<uint8_t> forced(size_t(n_units), 0);
  for (int t = 0; t < std::min(p.sink, n_tokens); ++t) forced[size_t(t / unit_size)] = 1;
  for (int t = std::max(0, n_tokens - p.recent); t < n_tokens; ++t) forced[size_t(t / unit_size)] = 1;
  forced[size_t(n_units - 1)] = 1;
  return forced;
}

// Unit ids sorted by score, highest first; ties to the lower index.
std::vector<int32_t> by_score(std::span<const float> scores) {
  std::vector<int32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return scores[size_t(a)] > scores[size_t(b)]; });
  return order;
}

std::vector<double> probabilities(std::span<const float> scores, float scale) {
  std::vector<double> p(scores.size());
  double mx = -INFINITY;
  for (float s : scores) mx = std::max(mx, double(s) * scale);
  double sum = 0.0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp(double(scores[i]) * scale - mx);
  for (double& v : p) v /= sum;
  return p;
}

}  // namespace

std::vector<int32_t> select_units(std::span<const float> scores, int unit_size, int n_tokens,
                                  const SelectParams& params, float scale) {
  const int n_units = int(scores.size());
  LY_ASSERT(n_units == (n_tokens + unit_size - 1) / unit_size && n_units > 0);
  std::vector<uint8_t> keep = forced_units(n_units, unit_size, n_tokens, params);
  const std::vector<int32_t> order = by_score(scores);
  if (params.strategy == SelectStrategy::kTopK || params.strategy == SelectStrategy::kRatio) {
    int left = topk_units(params, unit_size, n_tokens) -
               int(std::count(keep.begin(), keep.end(), uint8_t(1)));
    for (int32_t u : order) {
      if (left <= 0) break;
      if (!keep[size_t(u)]) {
        keep[size_t(u)] = 1;
        --left;
      }
    }
  } else {
    const std::vector<double> p = probabilities(scores, scale);
    if (params.strategy == SelectStrategy::kTopP) {
      double cum = 0.0;
      for (int32_t u : order) {  // the smallest prefix reaching probability p
        keep[size_t(u)] = 1;
        cum += p[size_t(u)];
        if (cum >= params.value) break;
      }
    } else {
      for (int u = 0; u < n_units; ++u)
        if (p[size_t(u)] > params.value) keep[size_t(u)] = 1;
    }
  }
  std::vector<int32_t> out;
  for (int u = 0; u < n_units; ++u)
    if (keep[size_t(u)]) out.push_back(u);
  return out;
}

void units_to_tokens(std::span<const int32_t> units, int unit_size, int n_tokens,
                     std::vector<int32_t>& tokens) {
  tokens.clear();
  for (int32_t u : units)
    for (int t = u * unit_size; t < std::min((u + 1) * unit_size, n_tokens); ++t) tokens.push_back(t);
}

}  // namespace lychee
