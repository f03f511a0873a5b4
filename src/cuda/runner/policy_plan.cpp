#include "cuda/runner/policy_plan.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"

namespace lychee::cuda {
namespace {

int ceil_div(int a, int b) { return (a + b - 1) / b; }
bool is_pow2(int x) { return x >= 1 && (x & (x - 1)) == 0; }

KernelHead kernel_head(const DecodeSpec& s, const HeadSpec& h) {
  switch (h.read) {
    case ReadKind::kWindow: return {ListKind::kWindow, ScoreKind::kNone, 1, false};
    case ReadKind::kSet: return {ListKind::kUnits, ScoreKind::kNone, s.unit, s.scope == SetScope::kQueryHead};
    case ReadKind::kDense: break;
  }
  switch (h.score) {
    case lychee::ScoreKind::kGroupMean:
      return {ListKind::kDense, s.unit == 1 ? ScoreKind::kGroupToken : ScoreKind::kGroupChunk16, 0, false};
    case lychee::ScoreKind::kPerQuery: return {ListKind::kDense, ScoreKind::kRowToken, 0, false};
    default: return {};
  }
}

}  // namespace

std::string gpu_unsupported(const DecodeSpec& s, const ModelConfig& c, int P) {
  if (c.head_dim != 64 && c.head_dim != 128)
    return fmt::format("the GPU backend runs head_dim 64 or 128 (its decode and prefill kernels); this model has "
                       "{} (use --device cpu)", c.head_dim);
  if (!s.sparse()) return "";
  const std::string option = s.unit_option.empty() ? "the selection unit" : s.unit_option;
  const int U = s.unit;
  if (s.has(lychee::ScoreKind::kPageBound)) {
    if (!is_pow2(U) || U > P)
      return fmt::format("{} {}: {} on the GPU needs a power of two that divides the KV page size ({}); use "
                         "--device cpu", option, U, s.name, P);
    return "";
  }
  if (s.has(lychee::ScoreKind::kPerQuery) && U != 1)
    return fmt::format("{} {}: per-query-head token scores on the GPU select tokens only; use --device cpu", option, U);
  if ((s.has(ReadKind::kSet) || s.has(lychee::ScoreKind::kGroupMean)) && !(is_pow2(U) && U <= P && (U == 1 || U >= 16)))
    return fmt::format("{} {}: {} on the GPU selects tokens (1) or blocks of a power of two from 16 to the KV page "
                       "size ({}); use one of those or --device cpu", option, U, s.name, P);
  return "";
}

GpuPolicyPlan plan_gpu_policy(const DecodeSpec& spec, const ModelConfig& c, int P, int max_context) {
  spec.validate(c);
  const std::string why = gpu_unsupported(spec, c, P);
  LY_CHECK(why.empty(), ErrorCode::kUnsupported, "{}", why);
  GpuPolicyPlan g;
  g.spec = spec;
  g.patterns.assign(1, std::vector<KernelHead>(size_t(c.n_kv_heads)));
  g.layers.assign(size_t(c.n_layers), KernelLayer{});
  const int group = c.group_size();
  for (int l = 0; l < c.n_layers; ++l) {
    const std::vector<HeadSpec>& heads = spec.layer(l);
    std::vector<KernelHead> pattern(heads.size());
    KernelLayer& kl = g.layers[size_t(l)];
    kl.sel_offset = int(g.selectors.size());
    for (int h = 0; h < c.n_kv_heads; ++h) {
      const HeadSpec& hs = heads[size_t(h)];
      pattern[size_t(h)] = kernel_head(spec, hs);
      kl.union_count = kl.union_count || (pattern[size_t(h)].kind == ListKind::kUnits && pattern[size_t(h)].per_q);
      kl.page_bound = kl.page_bound || hs.score == lychee::ScoreKind::kPageBound;
      if (hs.score == lychee::ScoreKind::kGroupMean) g.selectors.push_back(h);
      if (hs.score == lychee::ScoreKind::kPerQuery || hs.score == lychee::ScoreKind::kPageBound)
        for (int j = 0; j < group; ++j) g.selectors.push_back(h * group + j);
    }
    kl.n_sel = int(g.selectors.size()) - kl.sel_offset;
    auto it = std::find(g.patterns.begin(), g.patterns.end(), pattern);
    if (it == g.patterns.end()) it = g.patterns.insert(g.patterns.end(), pattern);
    kl.pattern = int(it - g.patterns.begin());
  }
  g.row_heads = spec.scope == SetScope::kKvHead ? c.n_kv_heads : c.n_heads;
  if (spec.has(lychee::ScoreKind::kPageBound)) g.score_unit = spec.unit;
  else if (spec.has(lychee::ScoreKind::kGroupMean) && spec.unit > 1) g.score_unit = 16;
  g.list_stride = ceil_div(max_context, spec.unit) + 1;
  g.score_stride = ceil_div(max_context, g.score_unit) + 1;
  return g;
}

int head_entries(const GpuPolicyPlan& g, const KernelHead& h, int P, int len) {
  const int unit = h.unit > 0 ? h.unit : P;
  switch (h.kind) {
    case ListKind::kDense: return ceil_div(len, unit);
    case ListKind::kWindow: {
      const int sink = std::min(g.spec.window_sink, len);
      return sink + std::min(g.spec.window_recent, len - sink);
    }
    case ListKind::kUnits: break;
  }
  return selected_units(g.spec.select, unit, len);
}

}  // namespace lychee::cuda
