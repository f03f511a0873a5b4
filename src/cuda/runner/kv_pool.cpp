#include "cuda/runner/kv_pool.h"

#include "core/error.h"

namespace lychee::cuda {

KvPool::KvPool(const ModelConfig& c, int page_size, size_t bytes, KvCacheDtype dtype)
    : dtype_(dtype), n_layers_(c.n_layers), n_kv_heads_(c.n_kv_heads), head_dim_(c.head_dim), page_size_(page_size) {
  LY_CHECK(page_size >= 1 && page_size <= 1024, ErrorCode::kInvalidArgument,
           "KV page size must be in 1..1024, got {}", page_size);
  elem_bytes_ = fp8() ? 1 : sizeof(bf16);
  page_bytes_ = size_t(2) * n_layers_ * n_kv_heads_ * size_t(page_size) *
                size_t(kv_bytes_per_token_head(dtype, head_dim_));
  n_pages_ = int(bytes / page_bytes_);
  LY_CHECK(n_pages_ >= 1, ErrorCode::kCapacity,
           "KV memory budget of {} MiB is less than one page ({} KiB for {} tokens of {} layers, {} KV cache)",
           bytes >> 20, page_bytes_ >> 10, page_size, n_layers_, kv_cache_dtype_name(dtype));
  layer_rows_ = size_t(n_pages_) * n_kv_heads_ * size_t(page_size);
  layer_elems_ = layer_rows_ * head_dim_;
  k_ = DeviceBuffer<uint8_t>(layer_elems_ * n_layers_ * elem_bytes_);
  v_ = DeviceBuffer<uint8_t>(layer_elems_ * n_layers_ * elem_bytes_);
  // Rows past a sequence's length are read by some attention kernels (and masked): keep them
  // finite (code 0 with scale 0 is 0 as well).
  LY_CUDA_CHECK(cudaMemset(k_.data(), 0, k_.bytes()));
  LY_CUDA_CHECK(cudaMemset(v_.data(), 0, v_.bytes()));
  if (fp8()) {
    k_scale_ = DeviceBuffer<float>(layer_rows_ * n_layers_);
    v_scale_ = DeviceBuffer<float>(layer_rows_ * n_layers_);
    LY_CUDA_CHECK(cudaMemset(k_scale_.data(), 0, k_scale_.bytes()));
    LY_CUDA_CHECK(cudaMemset(v_scale_.data(), 0, v_scale_.bytes()));
  }
  refs_.assign(size_t(n_pages_), 0);
  free_.reserve(size_t(n_pages_));
  for (int p = n_pages_ - 1; p >= 0; --p) free_.push_back(p);  // hand out low ids first
}

int32_t KvPool::alloc() {
  LY_CHECK(!free_.empty(), ErrorCode::kCapacity,
           "KV pool full: all {} pages of {} tokens ({:.2f} GiB) are in use; raise --kv-memory or "
           "shorten the sequences", n_pages_, page_size_, double(page_bytes_) * n_pages_ / (1 << 30));
  const int32_t p = free_.back();
  free_.pop_back();
  refs_[size_t(p)] = 1;
  return p;
}

void KvPool::retain(int32_t page) {
  LY_ASSERT(page >= 0 && page < n_pages_ && refs_[size_t(page)] > 0);
  ++refs_[size_t(page)];
}

void KvPool::release(std::span<const int32_t> pages) {
  for (int32_t p : pages) {
    LY_ASSERT(p >= 0 && p < n_pages_ && refs_[size_t(p)] > 0);
    if (--refs_[size_t(p)] == 0) free_.push_back(p);
  }
}

void KvPool::copy_page(int32_t from, int32_t to, cudaStream_t stream) {
  LY_ASSERT(from >= 0 && from < n_pages_ && to >= 0 && to < n_pages_);
  const size_t page_rows = size_t(n_kv_heads_) * page_size_;
  const size_t page_bytes = page_rows * head_dim_ * elem_bytes_;
  const size_t layer_bytes = layer_elems_ * elem_bytes_;
  auto copy = [&](void* layer_base, size_t bytes) {  // page `from` of one layer's array to page `to`
    auto* b = static_cast<uint8_t*>(layer_base);
    LY_CUDA_CHECK(cudaMemcpyAsync(b + size_t(to) * bytes, b + size_t(from) * bytes, bytes,
                                  cudaMemcpyDeviceToDevice, stream));
  };
  for (int l = 0; l < n_layers_; ++l) {
    copy(k_.data() + size_t(l) * layer_bytes, page_bytes);
    copy(v_.data() + size_t(l) * layer_bytes, page_bytes);
    if (fp8()) {
      copy(k_scale(l), page_rows * sizeof(float));
      copy(v_scale(l), page_rows * sizeof(float));
    }
  }
}

}  // namespace lychee::cuda
