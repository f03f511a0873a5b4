#include "cpu/kv_cache.h"

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

void KvCache::advance(int n) {
  LY_ASSERT(n >= 0 && length_ + n <= capacity_);
  length_ += n;
}

}  // namespace lychee::cpu
