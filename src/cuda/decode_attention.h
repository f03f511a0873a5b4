// Dense split-KV paged decode attention (FlashDecoding-style) for Hopper: one query token per
// sequence, GQA-packed (a CTA serves all query heads of one KV head with one read of K and V),
// tensor cores (mma.sync m16n8k16 bf16), a cp.async pipeline over the paged KV cache, and a
// log-sum-exp merge of the splits. Design, byte count and lab notes: docs/kernels/decode-attention.md.
//
// Plan, then run: plan_decode (host, pure) cuts every (sequence, KV head)'s page list into work
// items; the caller copies the plan to the device once per step; decode_attention only launches
// (no host synchronisation, capturable in a CUDA graph with a fixed grid of max_items CTAs).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cuda/common.h"

namespace lychee::cuda {

// A unit of split-KV work: pages [page_begin, page_end) of one (sequence, KV head)'s page list.
struct DecodeWorkItem {
  int32_t seq;          // batch index
  int32_t kv_head;
  int32_t list_offset;  // where this (seq, kv head)'s page list starts in DecodeAttentionArgs::page_lists
  int32_t page_begin;   // range inside that list
  int32_t page_end;
  int32_t slot;         // partial-result slot of this item, or -1: the only item of its head, write `out` directly
};

// Row r of list entry p holds the token at position p * page_size + r; it is read only when that
// position is < seq_lens[seq] (the dense rule: the list is the sequence's block-table row).
struct DecodeAttentionArgs {
  const bf16* q;             // [batch][n_heads][head_dim], after RoPE
  const bf16* k_pool;        // [n_pages][n_kv_heads][page_size][head_dim] (one layer)
  const bf16* v_pool;
  const int32_t* page_lists; // page ids; dense heads use their sequence's block-table row
  const int32_t* seq_lens;   // [batch] tokens including the current one
  const DecodeWorkItem* items;  // [n_items]
  const int32_t* n_items;    // device scalar: items beyond it are idle (grid fixed for CUDA graphs)
  const int32_t* merge_begin;   // [batch * n_kv_heads]: first slot of (seq, kv head); its slots are contiguous
  const int32_t* merge_count;   // [batch * n_kv_heads]: slots to merge (0 = written directly)
  float* partial_o;          // [max_slots][group][head_dim]
  float* partial_lse;        // [max_slots][group] natural-log LSE of the scaled logits
  bf16* out;                 // [batch][n_heads][head_dim]
  int batch, n_heads, n_kv_heads, head_dim, page_size;
  int max_items;             // grid size of the main kernel
  float scale;               // softmax scale, 1/sqrt(head_dim)
};

// Launches the attention kernel (grid = max_items CTAs, each reading its item; idle when >= *n_items)
// and the merge kernel. No host synchronisation; capturable in a CUDA graph.
// Supported: head_dim 64 or 128, page_size 16, 32, 64 or 128, group = n_heads / n_kv_heads in 1..8;
// anything else throws lychee::Error (kUnsupported / kInvalidArgument) naming the field.
// Both kernels use programmatic dependent launch: the attention kernel waits for the previous
// kernel in the stream before reading anything, the merge kernel waits for the attention kernel.
void decode_attention(const DecodeAttentionArgs& a, cudaStream_t stream);

// Host-side planning ("plan, then run"): cuts each (seq, kv head)'s page list into splits so that the
// total work spreads evenly over the SMs (about `ctas_per_sm * sm_count` CTAs, splits of at least
// `min_pages_per_split` pages, balanced split lengths), assigns slots, fills merge arrays.
struct DecodeHeadWork { int32_t seq, kv_head, list_offset, n_pages; };
struct DecodePlan {
  std::vector<DecodeWorkItem> items;
  std::vector<int32_t> merge_begin, merge_count;  // [batch * n_kv_heads]
  int n_slots = 0;
};
// Items come longest first (a head's splits differ by at most one page); n_slots <= items.size()
// <= max_items, so partial buffers of max_items slots always suffice. A head with n_pages == 0
// gets no item and its output is not written. Throws kInvalidArgument on bad heads or when
// more heads have pages than max_items.
DecodePlan plan_decode(std::span<const DecodeHeadWork> heads, int batch, int n_kv_heads, int sm_count,
                       int ctas_per_sm, int min_pages_per_split, int max_items);

// Dense attention's work: every (seq, kv head) reads its sequence's block-table row
// (list_offset = seq * max_pages_per_seq), ceil(seq_lens[seq] / page_size) pages.
// Throws kInvalidArgument when a length is < 1 or needs more than max_pages_per_seq pages.
std::vector<DecodeHeadWork> dense_decode_heads(std::span<const int32_t> seq_lens, int n_kv_heads,
                                               int page_size, int max_pages_per_seq);

// Resident attention CTAs per SM for this head_dim / page_size (the occupancy the planner's
// ctas_per_sm should use; 2 for every supported variant on H100).
int decode_attention_ctas_per_sm(int head_dim, int page_size);

// The host-side checks decode_attention runs before launching (exposed so tests can call them
// without a GPU). Throws lychee::Error naming the bad field, e.g. "unsupported head_dim: 96".
void check_decode_args(const DecodeAttentionArgs& a);

}  // namespace lychee::cuda
