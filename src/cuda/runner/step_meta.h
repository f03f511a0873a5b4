// The per-step metadata of a forward pass, host side and pure: one contiguous block (tokens,
// positions, where each token's K/V go, lengths, a prefill's block-table row, the pages decode
// rows gained since the last step, then the decode plans of the step's layer patterns) that the
// runner copies to the device with asynchronous copies, and the planner that fills the plan
// section. Plans are rebuilt only when the work changes (batch membership, policy, or a head's
// planned entry count; dense heads are planned a few pages ahead, so a page boundary crossed
// seldom replans); otherwise only the small per-step section is written and uploaded.
#pragma once

#include <cstddef>
#include <functional>
#include <cstdint>
#include <span>
#include <vector>

#include "cuda/kernels/decode_attention.h"
#include "cuda/runner/policy_plan.h"

namespace lychee::cuda {

// The most parts a prefill pass's attention is cut into (RunnerOptions::prefill_attn_pow2_tail:
// one per binary digit of a pass of at most 65536 tokens, and the tail).
inline constexpr int kMaxAttnParts = 32;

// Byte offsets of the fields in the metadata block (each 16-byte aligned).
struct MetaLayout {
  size_t tokens, positions, kv_page, kv_row, seq_lens, q_lens, quest_from;  // per step
  size_t block_table;  // per step: [max_pages] the prefill's pages
  size_t attn_parts;   // per step: a prefill pass's attention parts, kMaxAttnParts (q_len, kv_len) pairs
  size_t n_deltas;     // per step: entries of `deltas`
  size_t deltas;       // per step, last: (row * max_pages + index, page) pairs for the decode table
  size_t n_items, item_offset, merge_begin, merge_count, items, total;                  // plans
  int merge_stride;  // ints per pattern in merge_begin / merge_count
  MetaLayout(int max_tokens, int max_batch, int max_pages, int max_items, int n_heads, int n_patterns);
  size_t step_bytes() const { return n_items; }  // the per-step section is everything before the plans
};

struct PlannerShape {
  int n_heads = 1, n_kv_heads = 1, page_size = 64;
  int sm_count = 1, ctas_per_sm = 2;
  int max_items = 1;
  int max_pages = 1 << 30;  // block-table row width: dense plans never pass it
  // Batch-invariant steps (GpuRunner::decode's batch_invariant) hold at most this many sequences:
  // each head then gets at most max_items / (invariant_rows x the pattern's heads per sequence)
  // splits, a number that does not depend on the batch.
  int invariant_rows = 1;
};

// The page count a dense head is planned for (see step_meta.cpp).
int dense_horizon(int pages, int max_pages);

// Fills the plan section of the metadata block for decode steps.
class StepPlanner {
 public:
  StepPlanner(const PlannerShape& shape, const MetaLayout& layout);
  // The plans of patterns [0, n_patterns) of `policy` (null: dense only) for sequences of
  // `lens` tokens (the current one included), written into `meta` (the host block). Returns the
  // end of the plan section written (an offset into the block), or 0 when every head's work
  // equals the last call's and nothing was written. `before_write` runs before any write (the
  // runner waits there for the device to have consumed the last plan upload).
  // `invariant`: batch-invariant plans (plan_decode's splits_per_head; lens.size() <=
  // invariant_rows): a sequence's splits depend on that sequence alone. rows_per_seq > 1: a
  // verification step's dense plan (policy null; plan_decode's rows_per_seq).
  size_t plan(const GpuPolicyPlan* policy, std::span<const int> lens, uint8_t* meta,
              const std::function<void()>& before_write = {}, bool invariant = false, int rows_per_seq = 1);
  // Forget the cached plans (the next plan() rebuilds them).
  void invalidate() { last_heads_.clear(); }
  int replans() const { return replans_; }

 private:
  void heads_of(const GpuPolicyPlan* policy, int pattern, std::span<const int> lens, int list_stride,
                std::vector<DecodeHeadWork>& out) const;

  PlannerShape s_;
  MetaLayout m_;
  std::vector<std::vector<DecodeHeadWork>> last_heads_;  // [pattern] the heads last planned
  bool last_invariant_ = false;
  int last_rows_ = 1;
  int replans_ = 0;
};

}  // namespace lychee::cuda
