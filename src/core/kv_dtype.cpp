#include "core/kv_dtype.h"

#include "core/fp8.h"

namespace lychee {

const char* kv_cache_dtype_name(KvCacheDtype d) { return d == KvCacheDtype::kFp8 ? "fp8" : "bf16"; }

std::optional<KvCacheDtype> kv_cache_dtype_from_name(const std::string& name) {
  if (name == "bf16" || name == "auto") return KvCacheDtype::kBf16;
  if (name == "fp8" || name == "fp8_e4m3") return KvCacheDtype::kFp8;
  return std::nullopt;
}

int64_t kv_bytes_per_token_head(KvCacheDtype d, int head_dim) {
  return d == KvCacheDtype::kFp8 ? int64_t(head_dim) + int64_t(sizeof(float)) : 2 * int64_t(head_dim);
}

void round_kv_through_e4m3(float* x, int64_t vectors, int head_dim) { round_rows_through_e4m3(x, vectors, head_dim); }

}  // namespace lychee
