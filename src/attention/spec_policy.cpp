#include "attention/spec_policy.h"

#include <algorithm>
#include <cmath>

#include "attention/policies.h"
#include "core/error.h"

namespace lychee {

SpecPolicy::SpecPolicy(DecodeSpec spec)
    : spec_(std::move(spec)),
      sets_(size_t(spec_.scope == SetScope::kKvHead ? spec_.n_kv_heads : spec_.n_kv_heads * spec_.group)),
      kmin_(size_t(spec_.n_layers())), kmax_(size_t(spec_.n_layers())), n_seen_(size_t(spec_.n_layers()), 0) {}

void SpecPolicy::reset() {
  for (auto& s : sets_) s.clear();
  for (auto& v : kmin_) v.clear();
  for (auto& v : kmax_) v.clear();
  std::fill(n_seen_.begin(), n_seen_.end(), 0);
}

// Selections never carry over between steps; Quest's page metadata does (it grows with the cache).
void SpecPolicy::begin_step(int) {
  for (auto& s : sets_) s.clear();
}

void SpecPolicy::plan_layer(int layer, const float* q, const LayerKvView& kv, std::span<HeadRead> reads) {
  const std::vector<HeadSpec>& pattern = spec_.layer(layer);
  if (spec_.layer_has(layer, ScoreKind::kPageBound)) update_page_metadata(layer, kv);
  for (int h = 0; h < spec_.n_kv_heads; ++h)  // 1. selections the layer itself reads
    if (pattern[size_t(h)].score == ScoreKind::kPageBound) rank_pages(layer, h, q, kv);
  for (int h = 0; h < spec_.n_kv_heads; ++h)  // 2. what every head reads
    plan_reads(layer, h, pattern[size_t(h)], kv.length, reads);
  for (int h = 0; h < spec_.n_kv_heads; ++h) {  // 3. selections for later layers
    if (pattern[size_t(h)].score == ScoreKind::kGroupMean) select_group_mean(h, q, kv);
    if (pattern[size_t(h)].score == ScoreKind::kPerQuery) select_per_query(h, q, kv);
  }
}

void SpecPolicy::plan_reads(int layer, int h, const HeadSpec& spec, int n, std::span<HeadRead> reads) {
  const int group = spec_.group, unit = spec_.unit;
  HeadRead& first = reads[size_t(h * group)];
  switch (spec.read) {
    case ReadKind::kDense: return;
    case ReadKind::kWindow: {
      const int sink_end = std::min(spec_.window_sink, n);
      first.dense = false;
      first.tokens.clear();
      for (int t = 0; t < sink_end; ++t) first.tokens.push_back(t);
      for (int t = std::max(sink_end, n - spec_.window_recent); t < n; ++t) first.tokens.push_back(t);
      break;
    }
    case ReadKind::kSet: {
      const int last_unit = (n - 1) / unit;
      const int n_slots = spec_.scope == SetScope::kKvHead ? 1 : group;
      for (int j = 0; j < n_slots; ++j) {
        const int slot = spec_.scope == SetScope::kKvHead ? h : h * group + j;
        const std::vector<int32_t>& set = sets_[size_t(slot)];
        LY_CHECK(!set.empty(), ErrorCode::kInternal, "{}: head {} of layer {} reads slot {}, which no layer selected",
                 spec_.name, h, layer, slot);
        std::vector<int32_t> units = set;
        if (units.back() != last_unit) units.push_back(last_unit);  // the current token reads itself
        HeadRead& r = reads[size_t(h * group + j)];
        r.dense = false;
        units_to_tokens(units, unit, n, r.tokens);
      }
      if (n_slots > 1) return;
      break;
    }
  }
  for (int j = 1; j < group; ++j) reads[size_t(h * group + j)] = first;
}

std::vector<int32_t> SpecPolicy::select(int n_tokens) {
  const int unit = spec_.unit, n_units = (n_tokens + unit - 1) / unit;
  unit_scores_.assign(size_t(n_units), -INFINITY);
  for (int t = 0; t < n_tokens; ++t)  // a unit's score is the max over its tokens
    unit_scores_[size_t(t / unit)] = std::max(unit_scores_[size_t(t / unit)], token_scores_[size_t(t)]);
  return select_units(unit_scores_, unit, n_tokens, spec_.select, spec_.prob_scale);
}

// q̄ = the mean of the group's queries (f32), then q̄·k per token in double.
void SpecPolicy::select_group_mean(int h, const float* q, const LayerKvView& kv) {
  const int n = kv.length, d = spec_.head_dim, group = spec_.group;
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
  sets_[size_t(h)] = select(n);
}

void SpecPolicy::select_per_query(int h, const float* q, const LayerKvView& kv) {
  const int n = kv.length, d = spec_.head_dim, group = spec_.group;
  token_scores_.resize(size_t(n));
  const float* k = kv.k_head(h);
  for (int j = 0; j < group; ++j) {
    const float* qh = q + size_t(h * group + j) * d;
    for (int t = 0; t < n; ++t) {
      double dot = 0.0;
      for (int i = 0; i < d; ++i) dot += double(qh[i]) * double(k[size_t(t) * d + i]);
      token_scores_[size_t(t)] = float(dot);
    }
    sets_[size_t(h * group + j)] = select(n);
  }
}

float quest_page_bound(const float* q, const float* kmin, const float* kmax, int d) {
  double u = 0.0;
  for (int i = 0; i < d; ++i) u += std::max(double(q[i]) * kmax[i], double(q[i]) * kmin[i]);
  return float(u);
}

void SpecPolicy::update_page_metadata(int layer, const LayerKvView& kv) {
  const int n = kv.length, d = spec_.head_dim, n_kv = spec_.n_kv_heads, page = spec_.unit;
  LY_CHECK(n >= n_seen_[size_t(layer)], ErrorCode::kInternal, "{}: the cache shrank without a reset (layer {})",
           spec_.name, layer);
  const size_t n_pages = size_t((n + page - 1) / page);
  auto& mn = kmin_[size_t(layer)];
  auto& mx = kmax_[size_t(layer)];
  // Layout [n_pages][n_kv_heads][d]: a new page appends a row of +inf / -inf.
  mn.resize(n_pages * n_kv * d, INFINITY);
  mx.resize(n_pages * n_kv * d, -INFINITY);
  for (int h = 0; h < n_kv; ++h) {
    const float* k = kv.k_head(h);
    for (int t = n_seen_[size_t(layer)]; t < n; ++t) {
      const size_t off = (size_t(t / page) * n_kv + h) * d;
      for (int i = 0; i < d; ++i) {
        mn[off + i] = std::min(mn[off + i], k[size_t(t) * d + i]);
        mx[off + i] = std::max(mx[off + i], k[size_t(t) * d + i]);
      }
    }
  }
  n_seen_[size_t(layer)] = n;
}

// Quest: every query head of KV head h ranks the pages by the bound (the page is the unit, so a
// unit's score is its bound) and selects its top pages.
void SpecPolicy::rank_pages(int layer, int h, const float* q, const LayerKvView& kv) {
  const int n = kv.length, d = spec_.head_dim, n_kv = spec_.n_kv_heads, page = spec_.unit, group = spec_.group;
  const int n_pages = (n + page - 1) / page;
  unit_scores_.resize(size_t(n_pages));
  for (int j = 0; j < group; ++j) {
    const int qh = h * group + j;
    for (int pg = 0; pg < n_pages; ++pg) {
      const size_t off = (size_t(pg) * n_kv + h) * d;
      unit_scores_[size_t(pg)] =
          quest_page_bound(q + size_t(qh) * d, &kmin_[size_t(layer)][off], &kmax_[size_t(layer)][off], d);
    }
    sets_[size_t(qh)] = select_units(unit_scores_, page, n, spec_.select, spec_.prob_scale);
  }
}

}  // namespace lychee
