#include "cuda/runner/step_meta.h"

#include <algorithm>

#include "core/error.h"

namespace lychee::cuda {

MetaLayout::MetaLayout(int max_tokens, int max_batch, int max_pages, int max_items, int n_heads, int n_patterns)
    : merge_stride(max_batch * n_heads) {
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t o = off;
    off += (bytes + 15) / 16 * 16;
    return o;
  };
  tokens = take(size_t(max_tokens) * 4);
  positions = take(size_t(max_tokens) * 4);
  kv_page = take(size_t(max_tokens) * 4);
  kv_row = take(size_t(max_tokens) * 4);
  seq_lens = take(size_t(max_batch) * 4);
  q_lens = take(size_t(max_batch) * 4);
  quest_from = take(size_t(max_batch) * 4);
  block_table = take(size_t(max_pages) * 4);
  attn_parts = take(size_t(kMaxAttnParts) * 8);
  n_deltas = take(4);
  deltas = take(size_t(max_batch) * max_pages * 8);
  n_items = take(size_t(n_patterns) * 4);
  item_offset = take(size_t(n_patterns) * 4);
  merge_begin = take(size_t(n_patterns) * merge_stride * 4);
  merge_count = take(size_t(n_patterns) * merge_stride * 4);
  items = take(size_t(n_patterns) * max_items * sizeof(DecodeWorkItem));
  total = off;
}

// Dense heads are planned for up to 1/32 more pages than they have (at least one page more
// than needed is never planned), so a plan outlives many page crossings: the kernel clips an
// item at the device-side length, and the splits stay within ~3% of equal.
int dense_horizon(int pages, int max_pages) {
  const int step = std::max(1, (pages + 31) / 32);
  return std::min(max_pages, (pages + step - 1) / step * step);
}

StepPlanner::StepPlanner(const PlannerShape& shape, const MetaLayout& layout) : s_(shape), m_(layout) {}

// One DecodeHeadWork per (sequence, KV head), or per (sequence, query head) for per-query lists;
// list rows are seq * row_heads + head, as the selection kernels write them.
void StepPlanner::heads_of(const GpuPolicyPlan* policy, int pattern, std::span<const int> lens, int list_stride,
                           std::vector<DecodeHeadWork>& out) const {
  const int n_kv = s_.n_kv_heads, group = s_.n_heads / s_.n_kv_heads, P = s_.page_size;
  static const KernelHead dense{};
  out.clear();
  for (size_t b = 0; b < lens.size(); ++b) {
    for (int h = 0; h < n_kv; ++h) {
      const KernelHead& spec = policy != nullptr ? policy->patterns[size_t(pattern)][size_t(h)] : dense;
      DecodeHeadWork w;
      w.seq = int(b);
      w.kv_head = h;
      w.unit = spec.unit > 0 ? spec.unit : P;
      w.kind = spec.kind;
      w.score = spec.score;
      w.n_entries = policy != nullptr ? head_entries(*policy, spec, P, lens[b])
                                      : (lens[b] + P - 1) / P;
      if (w.kind == ListKind::kDense) w.n_entries = dense_horizon(w.n_entries, s_.max_pages);
      if (!spec.per_q) {
        const int row = int(b) * n_kv + h;
        w.row_begin = 0;
        w.n_rows = group;
        w.list = row * list_stride;
        w.count = row;
        out.push_back(w);
        continue;
      }
      for (int g = 0; g < group; ++g) {
        const int row = int(b) * s_.n_heads + h * group + g;
        w.row_begin = g;
        w.n_rows = 1;
        w.list = row * list_stride;
        w.count = row;
        out.push_back(w);
      }
    }
  }
}

size_t StepPlanner::plan(const GpuPolicyPlan* policy, std::span<const int> lens, uint8_t* meta,
                         const std::function<void()>& before_write, bool invariant, int rows_per_seq) {
  LY_CHECK(!invariant || int(lens.size()) <= s_.invariant_rows, ErrorCode::kInvalidArgument,
           "a batch-invariant step of {} sequences (at most {})", lens.size(), s_.invariant_rows);
  const int n_patterns = policy != nullptr ? int(policy->patterns.size()) : 1;
  const int list_stride = policy != nullptr ? policy->list_stride : 1;
  std::vector<std::vector<DecodeHeadWork>> heads(static_cast<size_t>(n_patterns));
  for (int p = 0; p < n_patterns; ++p) heads_of(policy, p, lens, list_stride, heads[size_t(p)]);
  LY_CHECK(rows_per_seq == 1 || policy == nullptr, ErrorCode::kInvalidArgument,
           "a verification step of {} rows per sequence plans dense attention only", rows_per_seq);
  if (heads == last_heads_ && invariant == last_invariant_ && rows_per_seq == last_rows_) return 0;
  if (before_write) before_write();

  auto* n_items = reinterpret_cast<int32_t*>(meta + m_.n_items);
  auto* item_offset = reinterpret_cast<int32_t*>(meta + m_.item_offset);
  auto* items = reinterpret_cast<DecodeWorkItem*>(meta + m_.items);
  int used = 0;
  for (int p = 0; p < n_patterns; ++p) {
    int splits = 0;
    if (invariant) {  // heads per sequence: the pattern's, the same for every sequence
      const int per_seq = lens.empty() ? 1 : std::max<int>(1, int(heads[size_t(p)].size() / lens.size()));
      splits = std::max(1, s_.max_items / (s_.invariant_rows * per_seq));
    }
    const DecodePlan plan = plan_decode(heads[size_t(p)], int(lens.size()), s_.n_heads, s_.n_kv_heads, s_.sm_count,
                                        s_.ctas_per_sm, 2 * s_.page_size, s_.max_items, splits, rows_per_seq);
    item_offset[p] = used;
    n_items[p] = int32_t(plan.items.size());
    std::copy(plan.items.begin(), plan.items.end(), items + used);
    used += int(plan.items.size());
    std::copy(plan.merge_begin.begin(), plan.merge_begin.end(),
              reinterpret_cast<int32_t*>(meta + m_.merge_begin) + size_t(p) * m_.merge_stride);
    std::copy(plan.merge_count.begin(), plan.merge_count.end(),
              reinterpret_cast<int32_t*>(meta + m_.merge_count) + size_t(p) * m_.merge_stride);
  }
  last_heads_ = std::move(heads);
  last_invariant_ = invariant;
  last_rows_ = rows_per_seq;
  ++replans_;
  return m_.items + size_t(used) * sizeof(DecodeWorkItem);
}

}  // namespace lychee::cuda
