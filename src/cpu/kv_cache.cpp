#include "cpu/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace lychee::cpu {

KvCache::KvCache(const ModelConfig& c, int capacity)
    : n_layers_(c.n_layers), n_kv_heads_(c.n_kv_heads), head_dim_(c.head_dim), capacity_(capacity) {
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

void KvCache::copy_prefix(const KvCache& from, int n) {
  LY_CHECK(from.n_layers_ == n_layers_ && from.n_kv_heads_ == n_kv_heads_ && from.head_dim_ == head_dim_,
           ErrorCode::kInvalidArgument, "KV prefix copy between caches of different model shapes");
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
