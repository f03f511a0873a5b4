// The attention-policy interface the CPU reference calls: for each decode step, layer and query
// head, which cached tokens the head reads. Backends do the arithmetic; policies never do. Every
// policy is a compiled DecodeSpec (decode_spec.h) executed by SpecPolicy (spec_policy.h); the
// GPU runs the same spec. Policies include no backend header.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "attention/decode_spec.h"

namespace lychee {

// What one query head reads in one decode step.
struct HeadRead {
  bool dense = true;             // every cached token 0 .. n_ctx-1
  std::vector<int32_t> tokens;   // otherwise: ascending positions, the current token included
};

// Host view of one layer's cache for one sequence (the CPU oracle's layout).
struct LayerKvView {
  const float* k = nullptr;  // [n_kv_heads][capacity][head_dim] f32
  const float* v = nullptr;
  int capacity = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int length = 0;            // tokens cached, the current one included
  const float* k_head(int h) const { return k + size_t(h) * size_t(capacity) * size_t(head_dim); }
  const float* v_head(int h) const { return v + size_t(h) * size_t(capacity) * size_t(head_dim); }
};

// What decode steps read from the KV cache, counted by the backend from the read sets: per
// (layer, KV head) the union of the tokens its query heads read.
struct KvReadStats {
  uint64_t decode_steps = 0;
  uint64_t token_reads = 0;        // sum over steps, layers, KV heads of tokens read
  uint64_t dense_token_reads = 0;  // what full attention would have read
  uint64_t metadata_bytes = 0;     // policy side data read (e.g. Quest's page min/max)
  uint64_t correction_token_reads = 0;  // dense re-prefills of cache correction

  // Bytes at `elem_bytes` per K/V element (2 for the bf16 cache of the GPU engine; kv_bytes_at
  // below for FP8 pages, whose scales make the bytes per token no multiple of head_dim).
  uint64_t kv_bytes(int head_dim, int elem_bytes = 2) const {
    return (token_reads + correction_token_reads) * uint64_t(head_dim) * 2 * uint64_t(elem_bytes) +
           metadata_bytes;
  }
  uint64_t dense_kv_bytes(int head_dim, int elem_bytes = 2) const {
    return dense_token_reads * uint64_t(head_dim) * 2 * uint64_t(elem_bytes);
  }
  // The same at `token_head_bytes` per token of one KV head's K (or V), as the cache holds it
  // (Engine::kv_bytes_per_token_head: f32 rows on the CPU, bf16 or FP8 codes and scale on the GPU).
  uint64_t kv_bytes_at(int64_t token_head_bytes) const {
    return (token_reads + correction_token_reads) * uint64_t(token_head_bytes) * 2 + metadata_bytes;
  }
  uint64_t dense_kv_bytes_at(int64_t token_head_bytes) const {
    return dense_token_reads * uint64_t(token_head_bytes) * 2;
  }
  KvReadStats& operator+=(const KvReadStats& o);
};

// The number of distinct tokens the query heads of one KV head read (sorted token lists).
int64_t union_size(std::span<const HeadRead> group_reads, int n_ctx);

class AttentionPolicy {
 public:
  virtual ~AttentionPolicy() = default;
  virtual std::string name() const = 0;
  // The description both backends execute.
  virtual const DecodeSpec& spec() const = 0;
  // A new sequence starts (its prompt is prefilled densely).
  virtual void reset() = 0;
  // A decode step starts; n_ctx counts the cached tokens including the one being decoded.
  virtual void begin_step(int n_ctx) = 0;
  // Decide what each query head of `layer` reads. q: [n_heads, head_dim] f32 after RoPE (and
  // q_norm). reads: [n_heads], preset to dense.
  virtual void plan_layer(int layer, const float* q, const LayerKvView& kv,
                          std::span<HeadRead> reads) = 0;
  // Bytes of side data (beyond K/V) the policy read for `layer` in this step.
  virtual uint64_t metadata_bytes(int layer, int n_ctx) const {
    (void)layer, (void)n_ctx;
    return 0;
  }
};

}  // namespace lychee
