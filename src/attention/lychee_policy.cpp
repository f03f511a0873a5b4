// LycheeDecode on the reference path (paper §3.1, Algorithm 1; method-reference-code.md §6.11):
// per decode step and layer, sparse KV heads read the set last written at their KV-head index by
// a retrieval head of an earlier layer; retrieval heads read everything, score every token with
// the raw logit of the GQA group's mean query (q̄·k, no scale, no softmax), and write their new
// selection after the layer's sparse heads have planned. Layer 0 is all retrieval.
#include <algorithm>
#include <cmath>

#include "attention/policies.h"
#include "core/error.h"

namespace lychee {

LycheePolicy::LycheePolicy(const ModelConfig& c, HeadRoles roles, int block_size, SelectParams select)
    : n_heads_(c.n_heads), n_kv_heads_(c.n_kv_heads), head_dim_(c.head_dim), roles_(std::move(roles)),
      block_(block_size), select_(select), sets_(size_t(c.n_kv_heads)) {
  roles_.validate(c, "head roles");
  select_.validate();
  LY_CHECK(block_ >= 1, ErrorCode::kInvalidArgument, "block size must be >= 1, got {}", block_);
}

void LycheePolicy::reset() {
  for (auto& s : sets_) s.clear();
}

// Nothing carries over between steps: layer 0 (all retrieval) writes every set afresh.
void LycheePolicy::begin_step(int) { reset(); }

void LycheePolicy::plan_layer(int layer, const float* q, const LayerKvView& kv, std::span<HeadRead> reads) {
  const int n = kv.length;
  const int group = n_heads_ / n_kv_heads_;
  const int last_unit = (n - 1) / block_;
  std::vector<int> retrieval;
  for (int h = 0; h < n_kv_heads_; ++h) {
    if (layer == 0 || roles_.is_retrieval(layer, h)) {
      retrieval.push_back(h);  // reads stay dense
      continue;
    }
    const std::vector<int32_t>& set = sets_[size_t(h)];
    LY_CHECK(!set.empty(), ErrorCode::kInternal, "lychee: KV head {} of layer {} has no selection", h, layer);
    std::vector<int32_t> units = set;
    if (units.back() != last_unit) units.push_back(last_unit);  // the current token reads itself
    HeadRead& first = reads[size_t(h * group)];
    first.dense = false;
    units_to_tokens(units, block_, n, first.tokens);
    for (int j = 1; j < group; ++j) reads[size_t(h * group + j)] = first;
  }
  for (int h : retrieval) select_for_head(h, q, kv);
}

void LycheePolicy::select_for_head(int h, const float* q, const LayerKvView& kv) {
  const int n = kv.length, d = head_dim_, group = n_heads_ / n_kv_heads_;
  qbar_.assign(size_t(d), 0.0f);
  for (int j = 0; j < group; ++j)
    for (int i = 0; i < d; ++i) qbar_[size_t(i)] += q[size_t((h * group + j) * d + i)];
  for (float& v : qbar_) v /= float(group);
  token_scores_.resize(size_t(n));
  const float* k = kv.k_head(h);
  for (int t = 0; t < n; ++t) {
    double dot = 0.0;
    for (int i = 0; i < d; ++i) dot += double(qbar_[size_t(i)]) * double(k[size_t(t) * d + i]);
    token_scores_[size_t(t)] = float(dot);
  }
  const int n_units = (n + block_ - 1) / block_;
  unit_scores_.assign(size_t(n_units), -INFINITY);
  for (int t = 0; t < n; ++t)  // block score = max logit in the block
    unit_scores_[size_t(t / block_)] = std::max(unit_scores_[size_t(t / block_)], token_scores_[size_t(t)]);
  sets_[size_t(h)] = select_units(unit_scores_, block_, n, select_, 1.0f / std::sqrt(float(d)));
}

}  // namespace lychee
