// Selection on the GPU for the hybrid-head decode: the strategies of LycheeDecode's ablation
// (top-k, top-p, threshold, ratio) over scores the attention kernel wrote in the same pass as the
// retrieval heads' dense attention, TidalDecode's per-query-head token top-k, and Quest's page
// metadata (channel-wise min/max keys, kept on append) and upper-bound page scores. Every kernel
// reads lengths from the device and writes ascending unit lists plus their lengths, so a decode
// step needs no host synchronisation and stays CUDA-graph capturable. The semantics are those of
// the CPU reference (src/attention/selection.cpp); tests check the sets for equality.
#pragma once

#include <cstdint>

#include "attention/selection.h"
#include "cuda/common/common.h"

namespace lychee::cuda {

struct SelectArgs {
  const float* scores;     // rows [row][score_stride]; entry i covers tokens [i * score_unit, ...)
  int score_stride;
  int score_unit;          // tokens per score entry (16 for chunk scores, 1 for token scores, Quest's page)
  int unit;                // selection unit, a multiple of score_unit: a unit's score is the max of its entries
  const int32_t* seq_lens; // [batch]
  const int32_t* heads;    // [n_select] head index of each selector; its row is seq * row_heads + head
  int n_select;
  int row_heads;           // n_kv_heads (group-mean scores) or n_heads (per query head)
  int32_t* lists;          // out: rows [row][list_stride] ascending unit ids
  int32_t* counts;         // out: [row] list lengths
  float* unit_scores;      // scratch, rows [row][list_stride]
  int list_stride;         // >= units of the longest sequence
  SelectStrategy strategy;
  int budget;              // top-k: tokens, forced units included
  double value;            // top-p p, threshold probability, ratio fraction
  int sink, recent;        // forced tokens at the start and end (the last unit is always forced)
  float scale;             // softmax scale of top-p / threshold probabilities
};
// Grid (n_select, batch); no host synchronisation.
void select_units(const SelectArgs& a, int batch, cudaStream_t stream);

// Adds to token_reads[seq] the tokens the query heads of each KV head read, counted once per
// token (the union of their lists), for layers whose lists are per query head.
struct UnionReadsArgs {
  const int32_t* lists;    // rows seq * n_heads + head
  const int32_t* counts;
  int list_stride;
  int unit;
  int max_units;           // bitmap size: units of the longest sequence
  const int32_t* seq_lens;
  int n_heads, n_kv_heads;
  unsigned long long* token_reads;
};
void count_union_reads(const UnionReadsArgs& a, int batch, cudaStream_t stream);

// Quest's metadata: per chunk of `qpage` tokens, the channel-wise min and max of the keys, kept
// beside the paged pool ([n_pages][n_kv_heads][page_size / qpage][head_dim] bf16: exact for bf16
// keys; FP8 keys' values s · e4m3 are rounded outward, min down and max up, so the bound stays a
// bound). quest_update recomputes the chunks holding positions [from[seq], seq_lens[seq]).
struct QuestArgs {
  const bf16* k_pool;      // one layer (bf16 KV; null with FP8)
  const uint8_t* k8_pool;  // FP8 KV: codes [n_pages][n_kv_heads][page_size][head_dim] e4m3, one layer
  const float* k_scale;    //   and scales [n_pages][n_kv_heads][page_size] f32
  bf16* kmin;              // one layer
  bf16* kmax;
  const int32_t* block_table;
  int max_pages;
  const int32_t* seq_lens;
  const int32_t* from;     // [batch]
  const bf16* q;           // [batch][n_heads][head_dim]
  float* scores;           // out of quest_scores: rows seq * n_heads + head, entry = chunk
  int score_stride;
  int n_heads, n_kv_heads, head_dim, page_size, qpage;
};
void quest_update(const QuestArgs& a, int batch, cudaStream_t stream);
// scores[row][c] = sum_i max(q_i kmax_i, q_i kmin_i) over the chunk's metadata (Quest's bound).
void quest_scores(const QuestArgs& a, int batch, cudaStream_t stream);

// The host-side checks the launchers run (select_host.cpp); Error(kInvalidArgument / kUnsupported)
// naming the field.
void check_select_args(const SelectArgs& a);
void check_union_args(const UnionReadsArgs& a);
void check_quest_args(const QuestArgs& a);

}  // namespace lychee::cuda
