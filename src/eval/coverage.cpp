#include "eval/coverage.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "core/error.h"

namespace lychee {

void CoverageStats::clear() {
  covered.clear();
  best.clear();
  heads.clear();
  needle_full = needle_read = 0;
}

double CoverageStats::needle_recall() const { return needle_full > 0 ? needle_read / needle_full : -1.0; }

namespace {

double mean_of(const std::vector<double>& sums, const std::vector<uint64_t>& heads) {
  const uint64_t n = std::accumulate(heads.begin(), heads.end(), uint64_t(0));
  return n == 0 ? 0.0 : std::accumulate(sums.begin(), sums.end(), 0.0) / double(n);
}

}  // namespace

double CoverageStats::mean_covered() const { return mean_of(covered, heads); }
double CoverageStats::mean_best() const { return mean_of(best, heads); }

std::vector<double> CoverageStats::covered_by_layer() const {
  std::vector<double> out(covered.size(), 0.0);
  for (size_t l = 0; l < covered.size(); ++l)
    if (heads[l] > 0) out[l] = covered[l] / double(heads[l]);
  return out;
}

void head_softmax(const float* q, const float* k, int hd, float scale, std::span<double> p) {
  double mx = -INFINITY;
  for (size_t j = 0; j < p.size(); ++j) {
    double dot = 0.0;
    for (int d = 0; d < hd; ++d) dot += double(q[d]) * double(k[j * size_t(hd) + size_t(d)]);
    p[j] = dot * scale;
    mx = std::max(mx, p[j]);
  }
  double sum = 0.0;
  for (double& v : p) sum += (v = std::exp(v - mx));
  for (double& v : p) v /= sum;
}

HeadMass read_mass(const float* q, const float* k, int hd, int n_ctx, const HeadRead& read, float scale,
                   std::span<const int32_t> needle) {
  if (read.dense && needle.empty()) return {1.0, 1.0, 0.0, 0.0};
  std::vector<double> p(static_cast<size_t>(n_ctx));
  head_softmax(q, k, hd, scale, p);
  HeadMass m;
  for (int32_t t : needle) {
    if (t >= n_ctx) break;
    m.needle_full += p[size_t(t)];
    if (read.dense || std::binary_search(read.tokens.begin(), read.tokens.end(), t)) m.needle_read += p[size_t(t)];
  }
  if (read.dense) {
    m.covered = m.best = 1.0;
    return m;
  }
  for (int32_t t : read.tokens) m.covered += p[size_t(t)];
  const size_t n = std::min(read.tokens.size(), p.size());
  std::nth_element(p.begin(), p.begin() + std::ptrdiff_t(n), p.end(), std::greater<>());
  m.best = std::accumulate(p.begin(), p.begin() + std::ptrdiff_t(n), 0.0);
  return m;
}

CoverageProbe::CoverageProbe(AttentionPolicy& inner) : inner_(inner) {}

void CoverageProbe::plan_layer(int layer, const float* q, const LayerKvView& kv, std::span<HeadRead> reads) {
  inner_.plan_layer(layer, q, kv, reads);
  const DecodeSpec& s = inner_.spec();
  const int n_heads = s.n_kv_heads * s.group;
  LY_CHECK(int(reads.size()) == n_heads && kv.head_dim == s.head_dim, ErrorCode::kInternal,
           "coverage probe: layer {} has {} read lists for {} heads", layer, reads.size(), n_heads);
  if (stats_.heads.size() < size_t(layer + 1)) {
    stats_.covered.resize(size_t(layer + 1), 0.0);
    stats_.best.resize(size_t(layer + 1), 0.0);
    stats_.heads.resize(size_t(layer + 1), 0);
  }
  per_head_.assign(size_t(n_heads), HeadMass{});
  const float scale = 1.0f / std::sqrt(float(kv.head_dim));
#pragma omp parallel for schedule(dynamic, 1)
  for (int h = 0; h < n_heads; ++h)
    per_head_[size_t(h)] = read_mass(q + int64_t(h) * kv.head_dim, kv.k_head(h / s.group), kv.head_dim, kv.length,
                                     reads[size_t(h)], scale, needle_);
  for (const HeadMass& m : per_head_) {
    stats_.covered[size_t(layer)] += m.covered;
    stats_.best[size_t(layer)] += m.best;
    stats_.needle_full += m.needle_full;
    stats_.needle_read += m.needle_read;
  }
  stats_.heads[size_t(layer)] += uint64_t(n_heads);
}

}  // namespace lychee
