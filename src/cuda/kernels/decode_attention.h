// The hybrid-head split-KV paged decode attention (FlashDecoding-style, LycheeDecode's Appendix C)
// for Hopper: one query token per sequence (or rows_per_seq of them, causal among themselves:
// speculative verification), tensor cores (mma.sync m16n8k16 bf16), a cp.async
// pipeline over the paged KV cache, and a log-sum-exp merge of the splits. Dense heads, sparse
// heads and per-query-head baselines run in ONE launch: every head's work is a list of entries
// (pages, 16-token chunks or single tokens) cut into splits of equal token count over all SMs.
// Design, byte count and lab notes: docs/kernels/decode-attention.md, docs/kernels/hybrid-attention.md.
//
// Plan, then run: plan_decode (host, pure) cuts every head's entry list into work items; the
// caller copies the plan to the device once per step; decode_attention only launches (no host
// synchronisation, capturable in a CUDA graph with a fixed grid of max_items CTAs). Lengths that
// only the device knows (a top-p selection's size) are planned at their upper bound and clipped
// on the device: items past the end are empty and merge with weight 0.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "cuda/common/common.h"

namespace lychee::cuda {

// How an item's entries map to token positions. Entry e covers positions [u * unit, u * unit +
// unit) of its sequence, where u is e (kDense), unit_lists[list + e] (kUnits: ascending unit ids
// written by a selection kernel; the last one is always the sequence's last unit), or the e-th
// position of the window "first window_sink tokens + last window_recent tokens" (kWindow, unit 1).
enum class ListKind : int8_t { kDense = 0, kUnits = 1, kWindow = 2 };

// What a kDense item emits besides attention, in the same pass over K (fused scoring):
//   kGroupChunk16: per 16 tokens, the max of the raw logit of the group's mean query (q̄·k) —
//                  LycheeDecode's block score; a selection kernel takes the max over a block
//   kGroupToken:   q̄·k per token (LycheeDecode's token mode)
//   kRowToken:     q·k per token and query row (TidalDecode's per-head selection)
enum class ScoreKind : int8_t { kNone = 0, kGroupChunk16 = 1, kGroupToken = 2, kRowToken = 3 };

// The most query rows one m16n8k16 tile holds: a KV head's group x rows_per_seq (verification).
inline constexpr int kDecodeMaxTileRows = 16;
// The most new positions per sequence a verification step takes (γ + 1 for γ <= 15).
inline constexpr int kDecodeMaxVerifyRows = 16;

// A unit of split-KV work: entries [begin, end) of one head's list.
struct DecodeWorkItem {
  int32_t seq;        // batch index
  int32_t kv_head;
  int32_t list;       // kUnits: offset of the head's list in unit_lists
  int32_t count;      // kUnits: index of the list's length in list_counts
  int32_t begin, end; // entry range (end may pass the device-side length: clipped there)
  int32_t slot;       // partial-result slot, or -1: the only item of its rows, write `out` directly
  int16_t unit;       // tokens per entry: page_size (page path) or a divisor of it (gather path)
  int8_t row_begin;   // query rows of the KV head's group this item serves:
  int8_t n_rows;      //   all of them (GQA-packed) or one (per-query-head selections)
  ListKind kind;
  ScoreKind score;
  // Verification (DecodeAttentionArgs::rows_per_seq R): the item serves new positions [pos_begin,
  // pos_begin + n_pos) of its sequence; n_pos 0: all R (always so when a group x R fits one tile).
  int8_t pos_begin = 0;
  int8_t n_pos = 0;
};
static_assert(sizeof(DecodeWorkItem) == 36, "the two position bytes took the old padding's place");

// The new positions one item serves: all R while a KV head's group x R rows fit one mma tile,
// else as many as fit (kDecodeMaxTileRows / group); a head's split then has ceil(R / that) items,
// each reading the split's KV (the kernel and the merge compute the same number on the device).
inline int decode_positions_per_item(int group, int rows_per_seq) {
  return std::min(rows_per_seq, std::max(1, kDecodeMaxTileRows / group));
}

struct DecodeAttentionArgs {
  const bf16* q;               // [batch][rows_per_seq][n_heads][head_dim], after RoPE
  const bf16* k_pool;          // [n_pages][n_kv_heads][page_size][head_dim] (one layer; null with FP8 KV)
  const bf16* v_pool;
  const int32_t* block_table;  // [batch][max_pages] physical page ids
  const int32_t* unit_lists;   // kUnits lists (may be null when no item uses them)
  const int32_t* list_counts;  // their lengths
  const int32_t* seq_lens;     // [batch] tokens including the current one (all rows_per_seq new ones)
  const DecodeWorkItem* items; // the plans of all layers
  const int32_t* item_offset;  // device scalar: this launch's plan starts at items + *item_offset (null: 0)
  const int32_t* n_items;      // device scalar: items beyond it are idle (grid fixed for CUDA graphs)
  const int32_t* merge_begin;  // [batch * n_heads]: first slot of (seq, query head); its slots are contiguous
  const int32_t* merge_count;  // [batch * n_heads]: slots to merge (0 = written directly)
  float* partial_o;            // [max_slots][rows_per_seq * group][head_dim]: a slot's row p * group + r is
                               //   query row r of the group at new position p (past one tile an item
                               //   writes its positions' rows only)
  float* partial_lse;          // [max_slots][rows_per_seq * group] natural-log LSE of the scaled logits
  bf16* out;                   // [batch][rows_per_seq][n_heads][head_dim]
  float* scores;               // fused scores: row (seq * n_kv_heads + kv) for group kinds,
  int score_stride;            //   (seq * n_heads + head) for kRowToken; entry = position / 16 or position
  unsigned long long* token_reads;  // optional [batch]: += tokens read by GQA-packed items
  int window_sink, window_recent;   // kWindow
  int batch, n_heads, n_kv_heads, head_dim, page_size, max_pages;
  int max_items;               // grid size of the main kernel
  bool invariant_merge = false;  // the merge's slot lanes fixed (8), not chosen by grid size:
                                 //   results independent of the batch (batch-invariant steps)
  float scale;                 // softmax scale, 1/sqrt(head_dim)
  // Query positions per sequence (speculative verification: γ + 1), causal among themselves: the
  // row of new position p (0..R-1) sees tokens [0, seq_lens[seq] - (R - 1 - p)). R > 1 takes dense
  // GQA-packed items only (kDense, ScoreKind::kNone, all of a group's rows: dense_decode_heads'
  // heads planned by plan_decode with the same rows_per_seq), bf16 KV, R <= kDecodeMaxVerifyRows,
  // and none of the policy fields (lists, scores, window, token_reads); check_decode_args says
  // which. Past one tile (group x R > 16) a head's positions are cut over several items
  // (decode_positions_per_item), each reading the KV.
  int rows_per_seq = 1;
  // FP8 KV (core/kv_dtype.h), in place of k_pool / v_pool (exactly one of the two kinds is set):
  // codes [n_pages][n_kv_heads][page_size][head_dim] e4m3 and scales [n_pages][n_kv_heads]
  // [page_size] f32, one layer. The kernel copies half the bytes of bf16 (plus 4 per token and
  // head), widens the codes (exact) and applies the scales to scalars: logit = s_k[t] (q . code_k[t]),
  // V's scale folded into the probability, p[t] s_v[t] (the row sum l takes p[t] alone).
  const uint8_t* k8_pool = nullptr;
  const uint8_t* v8_pool = nullptr;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
};

// Launches the attention kernel (grid = max_items CTAs, each reading its item; idle when >= *n_items)
// and the merge kernel. No host synchronisation; capturable in a CUDA graph.
// Supported: head_dim 64 or 128, page_size 16, 32, 64 or 128, group = n_heads / n_kv_heads in 1..8,
// rows_per_seq as above (an item's group x positions > 8 takes the kernel's 16-row variant); anything
// else throws lychee::Error (kUnsupported / kInvalidArgument) naming the field.
// Both kernels use programmatic dependent launch: the attention kernel waits for the previous
// kernel in the stream before reading anything, the merge kernel waits for the attention kernel.
void decode_attention(const DecodeAttentionArgs& a, cudaStream_t stream);
// The merge launch decode_attention ends with (decode_merge.cu); args already checked.
void decode_merge(const DecodeAttentionArgs& a, cudaStream_t stream);

// One head's work for the planner: `n_entries` entries of `unit` tokens (an upper bound when the
// length is only known on the device), for query rows [row_begin, row_begin + n_rows).
struct DecodeHeadWork {
  int32_t seq = 0, kv_head = 0;
  int32_t n_entries = 0;
  int32_t unit = 64;
  int32_t row_begin = 0, n_rows = 1;
  ListKind kind = ListKind::kDense;
  ScoreKind score = ScoreKind::kNone;
  int32_t list = 0, count = 0;
  bool operator==(const DecodeHeadWork&) const = default;
};

struct DecodePlan {
  std::vector<DecodeWorkItem> items;
  std::vector<int32_t> merge_begin, merge_count;  // [batch * n_heads]
  int n_slots = 0;
};

// Host-side planning ("plan, then run"), the workload pooling of the hybrid kernel: all heads
// (dense, sparse, per query head) are cut into splits of about equal token count so that the
// total spreads evenly over the SMs (about `ctas_per_sm * sm_count` CTAs, splits of at least
// `min_tokens_per_split` tokens, whole entries); assigns slots and fills the merge arrays.
// Items come longest first (a head's splits differ by at most one entry); n_slots <= items.size()
// <= max_items. A head with no entries gets no item and its rows are not written. Throws
// kInvalidArgument on bad heads (rows outside the group, a query row served twice) or when more
// heads have entries than max_items.
// splits_per_head > 0: batch-invariant planning instead (decode_plan.cpp): every head gets
// min(splits_per_head, n_entries, tokens / min_tokens_per_split) splits whatever else the batch
// holds (kInvalidArgument when they pass max_items).
// rows_per_seq R > 1 (a verification step; dense GQA-packed heads only, else kInvalidArgument):
// where a group x R passes one tile, every split of a head becomes c = ceil(R /
// decode_positions_per_item) items, one per group of positions; the head's slots are then c runs
// of its split count (merge_count), position group k's at merge_begin + k x merge_count.
DecodePlan plan_decode(std::span<const DecodeHeadWork> heads, int batch, int n_heads, int n_kv_heads,
                       int sm_count, int ctas_per_sm, int min_tokens_per_split, int max_items,
                       int splits_per_head = 0, int rows_per_seq = 1);

// Dense attention's work: every (seq, kv head) reads all ceil(seq_lens[seq] / page_size) pages of
// its block-table row, GQA-packed. Throws kInvalidArgument when a length is < 1 or needs more
// than max_pages_per_seq pages.
std::vector<DecodeHeadWork> dense_decode_heads(std::span<const int32_t> seq_lens, int n_kv_heads, int group,
                                               int page_size, int max_pages_per_seq);

// Resident attention CTAs per SM for this head_dim / page_size (the occupancy the planner's
// ctas_per_sm should use; 2 for every supported variant on H100).
int decode_attention_ctas_per_sm(int head_dim, int page_size);

// The host-side checks decode_attention runs before launching (exposed so tests can call them
// without a GPU). Throws lychee::Error naming the bad field, e.g. "unsupported head_dim: 96".
void check_decode_args(const DecodeAttentionArgs& a);

}  // namespace lychee::cuda
