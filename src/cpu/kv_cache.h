// The CPU reference KV cache of one sequence: contiguous per (layer, KV head), sized once.
// Always f32; with KvCacheDtype::kFp8 each token's K and V of each KV head are stored as the
// values their FP8 codes stand for (core/kv_dtype.h), so the CPU computes what the GPU's FP8
// pages hold. With kBf16 the values are kept unrounded (the reference).
#pragma once

#include <cstdint>
#include <vector>

#include "core/kv_dtype.h"
#include "model/config.h"

namespace lychee::cpu {

class KvCache {
 public:
  KvCache(const ModelConfig& c, int capacity, KvCacheDtype dtype = KvCacheDtype::kBf16);

  int capacity() const { return capacity_; }
  int length() const { return length_; }
  void set_length(int n);  // keeps the first n tokens (n <= length())
  void clear() { length_ = 0; }

  // [capacity, head_dim] f32 rows of one (layer, KV head).
  float* k(int layer, int kv_head) { return k_.data() + offset(layer, kv_head); }
  float* v(int layer, int kv_head) { return v_.data() + offset(layer, kv_head); }
  const float* k(int layer, int kv_head) const { return k_.data() + offset(layer, kv_head); }
  const float* v(int layer, int kv_head) const { return v_.data() + offset(layer, kv_head); }
  int n_layers() const { return n_layers_; }
  int n_kv_heads() const { return n_kv_heads_; }
  int head_dim() const { return head_dim_; }
  KvCacheDtype dtype() const { return dtype_; }
  size_t n_bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

  // Row `pos` of one (layer, KV head): k and v [head_dim] f32 (K after RoPE), rounded through
  // FP8 e4m3 with one scale each when dtype() is kFp8. The model writes rows [length, length + n)
  // of every layer this way, then calls advance(n).
  void write(int layer, int kv_head, int pos, const float* k, const float* v);
  // Called by the model after writing rows [length, length + n) of every layer.
  void advance(int n);
  // An empty cache takes a copy of the first n rows of `from` (same model shape): prefix reuse.
  void copy_prefix(const KvCache& from, int n);

 private:
  size_t offset(int layer, int kv_head) const {
    return (size_t(layer) * n_kv_heads_ + kv_head) * size_t(capacity_) * head_dim_;
  }
  int n_layers_, n_kv_heads_, head_dim_, capacity_;
  KvCacheDtype dtype_;
  int length_ = 0;
  std::vector<float> k_, v_;  // [n_layers][n_kv_heads][capacity][head_dim]
};

}  // namespace lychee::cpu
