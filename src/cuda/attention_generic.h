// Plain CUDA-core attention over the paged KV cache for head dims the tensor-core kernels do not
// cover (any head_dim up to 256; the tiny test models use 8 to 32). Correct, not fast: one
// block per (sequence, query, head), keys in chunks with an online softmax in fp32.
#pragma once

#include <cstdint>

#include "cuda/common.h"

namespace lychee::cuda {

struct GenericAttentionArgs {
  const bf16* q;              // [batch][q_len_max][n_heads][head_dim]
  const bf16* k_pool;         // [n_pages][n_kv_heads][page_size][head_dim]
  const bf16* v_pool;
  const int32_t* page_table;  // [batch][max_pages]
  const int32_t* q_lens;      // [batch], or null: one query per sequence (decode)
  const int32_t* kv_lens;     // [batch] tokens cached, the queries' own included
  bf16* out;                  // like q
  int batch, q_len_max, n_heads, n_kv_heads, head_dim, page_size, max_pages;
  float scale;
};

// Causal: query i of a sequence sees positions <= kv_len - q_len + i.
void attention_generic(const GenericAttentionArgs& a, cudaStream_t stream);

}  // namespace lychee::cuda
