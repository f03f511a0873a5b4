#include "cpu/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace lychee::cpu {

KvCache::KvCache(const ModelConfig& c, int capacity, KvCacheDtype dtype)
    : n_layers_(c.n_layers), n_kv_heads_(c.n_kv_heads), head_dim_(c.head_dim), capacity_(capacity), dtype_(dtype) {
  LY_CHECK(capacity > 0, ErrorCode::kInvalidArgument, "KV cache capacity must be positive, got {}",
           capacity);
  const size_t n = size_t(n_layers_) * n_kv_heads_ * size_t(capacity_) * head_dim_;
  k_.assign(n, 0.0f);
  v_.assign(n, 0.0f);
}

void KvCache::set_length(int n) {
  LY_CHECK(n >= 0 && n <= length_, ErrorCode::kInvalidArgument,
           "cannot set KV length to {} (current length {})", n, length_);
  length_ = n;
}

void KvCache::write(int layer, int kv_head, int pos, const float* k, const float* v) {
  LY_ASSERT(layer >= 0 && layer < n_layers_ && kv_head >= 0 && kv_head < n_kv_heads_ && pos >= 0 && pos < capacity_);
  float* k_row = this->k(layer, kv_head) + size_t(pos) * head_dim_;
  float* v_row = this->v(layer, kv_head) + size_t(pos) * head_dim_;
  std::memcpy(k_row, k, size_t(head_dim_) * sizeof(float));
  std::memcpy(v_row, v, size_t(head_dim_) * sizeof(float));
  if (dtype_ == KvCacheDtype::kFp8) {  // one scale per token and KV head, for K and V apart
    round_kv_through_e4m3(k_row, 1, head_dim_);
    round_kv_through_e4m3(v_row, 1, head_dim_);
  }
}

void KvCache::copy_prefix(const KvCache& from, int n) {
  LY_CHECK(from.n_layers_ == n_layers_ && from.n_kv_heads_ == n_kv_heads_ && from.head_dim_ == head_dim_,
           ErrorCode::kInvalidArgument, "KV prefix copy between caches of different model shapes");
  LY_CHECK(from.dtype_ == dtype_, ErrorCode::kInvalidArgument,
           "KV prefix copy from a {} cache into a {} cache (--kv-cache-dtype must match)", kv_cache_dtype_name(from.dtype_),
           kv_cache_dtype_name(dtype_));
  LY_CHECK(length_ == 0 && n >= 0 && n <= from.length_ && n <= capacity_, ErrorCode::kInvalidArgument,
           "KV prefix copy of {} rows: the source holds {}, this cache {} of {} (must be empty)", n, from.length_,
           length_, capacity_);
  const size_t row = size_t(head_dim_), count = size_t(n) * row;
  for (int l = 0; l < n_layers_; ++l)
    for (int h = 0; h < n_kv_heads_; ++h) {
      std::copy_n(from.k(l, h), count, k(l, h));
      std::copy_n(from.v(l, h), count, v(l, h));
    }
  length_ = n;
}

void KvCache::advance(int n) {
  LY_ASSERT(n >= 0 && length_ + n <= capacity_);
  length_ += n;
}

}  // namespace lychee::cpu
