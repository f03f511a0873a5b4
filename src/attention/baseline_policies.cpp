// The baselines on the reference path (baselines.md §1-3): TidalDecode, Quest, DuoAttention.
#include <algorithm>
#include <cmath>

#include "attention/policies.h"
#include "core/error.h"

namespace lychee {

// ---- TidalDecode: layers [0, dense_layers) dense; selection layers dense plus a top-k per query
// head on q·k over the whole cache; every other layer reads the set of the latest selection layer.

TidalPolicy::TidalPolicy(const ModelConfig& c, int budget, std::vector<int> selection_layers, int dense_layers)
    : n_heads_(c.n_heads), head_dim_(c.head_dim), group_(c.group_size()), budget_(budget),
      selection_layers_(std::move(selection_layers)), dense_layers_(dense_layers), sets_(size_t(c.n_heads)) {
  LY_CHECK(budget_ >= 1, ErrorCode::kInvalidArgument, "tidal: budget must be >= 1, got {}", budget_);
  for (int l : selection_layers_)
    LY_CHECK(l >= 0 && l < c.n_layers, ErrorCode::kInvalidArgument,
             "tidal: selection layer {} is outside 0..{}", l, c.n_layers - 1);
}

void TidalPolicy::reset() {
  for (auto& s : sets_) s.clear();
}

void TidalPolicy::begin_step(int) { reset(); }

void TidalPolicy::plan_layer(int layer, const float* q, const LayerKvView& kv, std::span<HeadRead> reads) {
  if (layer < dense_layers_) return;
  const int n = kv.length, d = head_dim_;
  const bool selects = std::find(selection_layers_.begin(), selection_layers_.end(), layer) != selection_layers_.end();
  if (!selects) {
    if (sets_[0].empty()) return;  // no selection layer has run yet: attend densely
    for (int h = 0; h < n_heads_; ++h) {
      reads[size_t(h)].dense = false;
      reads[size_t(h)].tokens = sets_[size_t(h)];
    }
    return;
  }
  // The current token is always kept (in the budget); the other budget-1 are the top logits.
  SelectParams p;
  p.budget = budget_;
  scores_.resize(size_t(n));
  for (int h = 0; h < n_heads_; ++h) {
    const float* qh = q + size_t(h) * d;
    const float* k = kv.k_head(h / group_);
    for (int t = 0; t < n; ++t) {
      double dot = 0.0;
      for (int i = 0; i < d; ++i) dot += double(qh[i]) * double(k[size_t(t) * d + i]);
      scores_[size_t(t)] = float(dot);
    }
    sets_[size_t(h)] = select_units(scores_, 1, n, p, 1.0f);
  }
}

// ---- Quest: channel-wise min/max keys per page kept as tokens arrive; per query head the
// upper bound sum_i max(q_i M_i, q_i m_i) ranks the pages; the last page is always read.

QuestPolicy::QuestPolicy(const ModelConfig& c, int budget, int page_size, int dense_layers)
    : n_heads_(c.n_heads), n_kv_heads_(c.n_kv_heads), head_dim_(c.head_dim), group_(c.group_size()),
      budget_(budget), page_(page_size), dense_layers_(dense_layers), kmin_(size_t(c.n_layers)),
      kmax_(size_t(c.n_layers)), n_seen_(size_t(c.n_layers), 0) {
  LY_CHECK(budget_ >= 1, ErrorCode::kInvalidArgument, "quest: budget must be >= 1, got {}", budget_);
  LY_CHECK(page_ >= 1, ErrorCode::kInvalidArgument, "quest: page size must be >= 1, got {}", page_);
}

void QuestPolicy::reset() {
  for (auto& v : kmin_) v.clear();
  for (auto& v : kmax_) v.clear();
  std::fill(n_seen_.begin(), n_seen_.end(), 0);
}

float QuestPolicy::page_bound(const float* q, const float* kmin, const float* kmax, int d) {
  double u = 0.0;
  for (int i = 0; i < d; ++i) u += std::max(double(q[i]) * kmax[i], double(q[i]) * kmin[i]);
  return float(u);
}

void QuestPolicy::update_metadata(int layer, const LayerKvView& kv) {
  const int n = kv.length, d = head_dim_;
  const size_t n_pages = size_t((n + page_ - 1) / page_);
  auto& mn = kmin_[size_t(layer)];
  auto& mx = kmax_[size_t(layer)];
  // Layout [n_pages][n_kv_heads][d]: a new page appends a row of +inf / -inf.
  mn.resize(n_pages * n_kv_heads_ * d, INFINITY);
  mx.resize(n_pages * n_kv_heads_ * d, -INFINITY);
  for (int h = 0; h < n_kv_heads_; ++h) {
    const float* k = kv.k_head(h);
    for (int t = n_seen_[size_t(layer)]; t < n; ++t) {
      const size_t off = (size_t(t / page_) * n_kv_heads_ + h) * d;
      for (int i = 0; i < d; ++i) {
        mn[off + i] = std::min(mn[off + i], k[size_t(t) * d + i]);
        mx[off + i] = std::max(mx[off + i], k[size_t(t) * d + i]);
      }
    }
  }
  n_seen_[size_t(layer)] = n;
}

void QuestPolicy::plan_layer(int layer, const float* q, const LayerKvView& kv, std::span<HeadRead> reads) {
  if (layer < dense_layers_) return;
  LY_CHECK(kv.length >= n_seen_[size_t(layer)], ErrorCode::kInternal,
           "quest: the cache shrank without a reset (layer {})", layer);
  update_metadata(layer, kv);
  const int n = kv.length, d = head_dim_;
  const int n_pages = (n + page_ - 1) / page_;
  SelectParams p;
  p.budget = budget_;
  scores_.resize(size_t(n_pages));
  std::vector<int32_t> pages;
  for (int h = 0; h < n_heads_; ++h) {
    const int kvh = h / group_;
    for (int pg = 0; pg < n_pages; ++pg) {
      const size_t off = (size_t(pg) * n_kv_heads_ + kvh) * d;
      scores_[size_t(pg)] = page_bound(q + size_t(h) * d, &kmin_[size_t(layer)][off], &kmax_[size_t(layer)][off], d);
    }
    pages = select_units(scores_, page_, n, p, 1.0f);
    reads[size_t(h)].dense = false;
    units_to_tokens(pages, page_, n, reads[size_t(h)].tokens);
  }
}

uint64_t QuestPolicy::metadata_bytes(int layer, int n_ctx) const {
  if (layer < dense_layers_) return 0;
  const uint64_t n_pages = uint64_t((n_ctx + page_ - 1) / page_);
  return uint64_t(n_kv_heads_) * n_pages * 2 * uint64_t(head_dim_) * 2;  // min and max, bf16
}

// ---- DuoAttention: retrieval heads dense; streaming heads read the first `sink` and the last
// `recent` tokens.

DuoPolicy::DuoPolicy(const ModelConfig& c, HeadRoles roles, int sink, int recent)
    : n_kv_heads_(c.n_kv_heads), group_(c.group_size()), roles_(std::move(roles)), sink_(sink), recent_(recent) {
  roles_.validate(c, "head roles");
  LY_CHECK(sink_ >= 0 && recent_ >= 1, ErrorCode::kInvalidArgument,
           "duo: sink must be >= 0 and recent >= 1, got {} and {}", sink_, recent_);
}

void DuoPolicy::plan_layer(int layer, const float*, const LayerKvView& kv, std::span<HeadRead> reads) {
  const int n = kv.length;
  const int sink_end = std::min(sink_, n);
  for (int h = 0; h < n_kv_heads_; ++h) {
    if (roles_.is_retrieval(layer, h)) continue;
    HeadRead& first = reads[size_t(h * group_)];
    first.dense = false;
    first.tokens.clear();
    for (int t = 0; t < sink_end; ++t) first.tokens.push_back(t);
    for (int t = std::max(sink_end, n - recent_); t < n; ++t) first.tokens.push_back(t);
    for (int j = 1; j < group_; ++j) reads[size_t(h * group_ + j)] = first;
  }
}

}  // namespace lychee
