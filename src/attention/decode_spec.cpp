#include "attention/decode_spec.h"

#include <algorithm>

#include "core/error.h"

namespace lychee {

bool DecodeSpec::sparse() const {
  for (const auto& pat : patterns)
    for (const HeadSpec& h : pat)
      if (h.read != ReadKind::kDense || h.score != ScoreKind::kNone) return true;
  return false;
}

bool DecodeSpec::layer_has(int l, ScoreKind s) const {
  const auto& pat = layer(l);
  return std::any_of(pat.begin(), pat.end(), [&](const HeadSpec& h) { return h.score == s; });
}

bool DecodeSpec::layer_has(int l, ReadKind r) const {
  const auto& pat = layer(l);
  return std::any_of(pat.begin(), pat.end(), [&](const HeadSpec& h) { return h.read == r; });
}

bool DecodeSpec::has(ScoreKind s) const {
  for (int l = 0; l < n_layers(); ++l)
    if (layer_has(l, s)) return true;
  return false;
}

bool DecodeSpec::has(ReadKind r) const {
  for (int l = 0; l < n_layers(); ++l)
    if (layer_has(l, r)) return true;
  return false;
}

uint64_t DecodeSpec::metadata_bytes(int l, int n_ctx) const {
  if (!layer_has(l, ScoreKind::kPageBound)) return 0;
  const uint64_t n_pages = uint64_t((n_ctx + unit - 1) / unit);
  return uint64_t(n_kv_heads) * n_pages * 2 * uint64_t(head_dim) * 2;  // min and max, bf16
}

void DecodeSpec::validate(const ModelConfig& c) const {
  LY_CHECK(n_kv_heads == c.n_kv_heads && group == c.group_size() && head_dim == c.head_dim &&
               n_layers() == c.n_layers,
           ErrorCode::kInvalidArgument,
           "{} policy: built for {} layers x {} KV heads (group {}, head_dim {}), the model has {} x {} (group {}, "
           "head_dim {})",
           name, n_layers(), n_kv_heads, group, head_dim, c.n_layers, c.n_kv_heads, c.group_size(), c.head_dim);
  LY_CHECK(unit >= 1, ErrorCode::kInvalidArgument, "{}: {} must be >= 1, got {}", name,
           unit_option.empty() ? "the selection unit" : unit_option, unit);
  LY_CHECK(window_sink >= 0 && window_recent >= 0, ErrorCode::kInvalidArgument,
           "{}: window sink and recent must be >= 0, got {} and {}", name, window_sink, window_recent);
  select.validate();
  LY_CHECK(!patterns.empty(), ErrorCode::kInvalidArgument, "{}: no head patterns", name);
  for (size_t p = 0; p < patterns.size(); ++p) {
    LY_CHECK(int(patterns[p].size()) == n_kv_heads, ErrorCode::kInvalidArgument,
             "{}: pattern {} has {} heads for {} KV heads", name, p, patterns[p].size(), n_kv_heads);
    for (size_t h = 0; h < patterns[p].size(); ++h) {
      const HeadSpec& s = patterns[p][h];
      const bool fused = s.score == ScoreKind::kGroupMean || s.score == ScoreKind::kPerQuery;
      LY_CHECK(!fused || s.read == ReadKind::kDense, ErrorCode::kInvalidArgument,
               "{}: pattern {} head {} scores in the attention pass but does not read densely", name, p, h);
      LY_CHECK(s.score != ScoreKind::kPageBound || s.read == ReadKind::kSet, ErrorCode::kInvalidArgument,
               "{}: pattern {} head {} ranks pages but does not read its selection", name, p, h);
      LY_CHECK((s.score != ScoreKind::kPerQuery && s.score != ScoreKind::kPageBound) || scope == SetScope::kQueryHead,
               ErrorCode::kInvalidArgument, "{}: per-query-head scores need per-query-head sets", name);
      LY_CHECK(s.score != ScoreKind::kGroupMean || scope == SetScope::kKvHead, ErrorCode::kInvalidArgument,
               "{}: group-mean scores need per-KV-head sets", name);
      LY_CHECK(s.read != ReadKind::kWindow || window_recent >= 1, ErrorCode::kInvalidArgument,
               "{}: a window head needs recent >= 1", name);
    }
  }
  for (int l = 0; l < n_layers(); ++l)
    LY_CHECK(layer_pattern[size_t(l)] >= 0 && layer_pattern[size_t(l)] < int(patterns.size()),
             ErrorCode::kInvalidArgument, "{}: layer {} uses pattern {} of {}", name, l, layer_pattern[size_t(l)],
             patterns.size());
}

DecodeSpecBuilder::DecodeSpecBuilder(const ModelConfig& c, std::string name) : c_(c) {
  spec_.name = std::move(name);
  spec_.n_kv_heads = c.n_kv_heads;
  spec_.group = c.group_size();
  spec_.head_dim = c.head_dim;
  spec_.patterns.assign(1, std::vector<HeadSpec>(size_t(c.n_kv_heads)));
  spec_.layer_pattern.assign(size_t(c.n_layers), 0);
}

void DecodeSpecBuilder::set_layer(int layer, const std::vector<HeadSpec>& pattern) {
  LY_CHECK(layer >= 0 && layer < c_.n_layers && int(pattern.size()) == c_.n_kv_heads, ErrorCode::kInvalidArgument,
           "{}: layer {} with {} heads (model: {} layers x {} KV heads)", spec_.name, layer, pattern.size(),
           c_.n_layers, c_.n_kv_heads);
  auto& pats = spec_.patterns;
  auto it = std::find(pats.begin(), pats.end(), pattern);
  if (it == pats.end()) it = pats.insert(pats.end(), pattern);
  spec_.layer_pattern[size_t(layer)] = int(it - pats.begin());
}

DecodeSpec DecodeSpecBuilder::finish() {
  spec_.validate(c_);
  return std::move(spec_);
}

int selected_units(const SelectParams& p, int unit, int n_tokens) {
  const int n_units = (n_tokens + unit - 1) / unit;
  if (p.strategy == SelectStrategy::kTopP || p.strategy == SelectStrategy::kThreshold) return n_units;
  // Forced: the units of the sink tokens, of the recent tokens, and the last unit.
  const int sink_units = (std::min(p.sink, n_tokens) + unit - 1) / unit;
  const int recent_first = std::min(std::max(0, n_tokens - p.recent) / unit, n_units - 1);
  const int n_forced = n_units - recent_first + std::max(0, std::min(sink_units, recent_first));
  return std::min(n_units, std::max(topk_units(p, unit, n_tokens), n_forced));
}

}  // namespace lychee
