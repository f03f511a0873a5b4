// A DecodeSpec (attention/decode_spec.h) as the hybrid-head kernel runs it: per layer, the list
// kind and fused score kind of every KV head's work (layers with equal patterns share a plan),
// the heads that select after (or, for page bounds, before) the attention, and the sizes of the
// selection buffers. Host code, pure: built once per policy setting and unit-tested without a
// GPU (tests/test_runner_plan.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention/decode_spec.h"
#include "cuda/kernels/decode_attention.h"
#include "model/config.h"

namespace lychee::cuda {

// What one KV head's kernel work is, for every sequence of the batch.
struct KernelHead {
  ListKind kind = ListKind::kDense;
  ScoreKind score = ScoreKind::kNone;
  int unit = 0;        // tokens per list entry; 0: the KV page size
  bool per_q = false;  // one item group per query head (per-query-head selections)
  bool operator==(const KernelHead&) const = default;
};

struct KernelLayer {
  int pattern = 0;                 // index into GpuPolicyPlan::patterns
  int sel_offset = 0, n_sel = 0;   // selector rows: GpuPolicyPlan::selectors[sel_offset ...]
  bool page_bound = false;         // Quest: page metadata, bound scores and selection before the attention
  bool union_count = false;        // per-query-head lists: count the union of what a KV head's rows read
};

struct GpuPolicyPlan {
  DecodeSpec spec;
  std::vector<std::vector<KernelHead>> patterns;  // [pattern][kv head]; pattern 0 is all dense
  std::vector<KernelLayer> layers;                // [n_layers]
  std::vector<int32_t> selectors;                 // head index (of row_heads) per selecting row
  int row_heads = 1;     // rows of the score / list buffers per sequence: n_kv_heads or n_heads
  int score_unit = 1;    // tokens per score entry: 16 (block scores), 1 (token scores) or the page (bounds)
  int list_stride = 1;   // entries per list row: units of the longest sequence + 1
  int score_stride = 1;  // entries per score row
  bool has_sets() const { return !selectors.empty(); }
};

// Why the GPU backend cannot run `spec` on model c (a head_dim its kernels lack, or a selection
// unit the hybrid-head kernel does not read; naming the option and saying to use --device cpu),
// or "" when it can. page_size: the KV pool's page. The runner, GpuSession and --device auto all
// ask this one predicate.
std::string gpu_unsupported(const DecodeSpec& spec, const ModelConfig& c, int page_size);

// The kernel form of `spec` for sequences of up to max_context tokens. Error(kUnsupported) with
// gpu_unsupported's reason; Error(kInvalidArgument) when the spec does not fit the model.
GpuPolicyPlan plan_gpu_policy(const DecodeSpec& spec, const ModelConfig& c, int page_size, int max_context);

// Entries of one head's list for a sequence of `len` tokens: exact for dense pages, windows and
// top-k lists; the upper bound (every unit) where only the device knows the count (top-p,
// threshold), which the kernel clips.
int head_entries(const GpuPolicyPlan& plan, const KernelHead& head, int page_size, int len);

}  // namespace lychee::cuda
