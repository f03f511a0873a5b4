#include "cuda/runner/kv_pool.h"

#include "core/error.h"

namespace lychee::cuda {

KvPool::KvPool(const ModelConfig& c, int page_size, size_t bytes)
    : n_layers_(c.n_layers), n_kv_heads_(c.n_kv_heads), head_dim_(c.head_dim), page_size_(page_size) {
  LY_CHECK(page_size >= 1 && page_size <= 1024, ErrorCode::kInvalidArgument,
           "KV page size must be in 1..1024, got {}", page_size);
  page_bytes_ = size_t(2) * n_layers_ * n_kv_heads_ * size_t(page_size) * head_dim_ * sizeof(bf16);
  n_pages_ = int(bytes / page_bytes_);
  LY_CHECK(n_pages_ >= 1, ErrorCode::kCapacity,
           "KV memory budget of {} MiB is less than one page ({} KiB for {} tokens of {} layers)",
           bytes >> 20, page_bytes_ >> 10, page_size, n_layers_);
  layer_elems_ = size_t(n_pages_) * n_kv_heads_ * size_t(page_size) * head_dim_;
  k_ = DeviceBuffer<bf16>(layer_elems_ * n_layers_);
  v_ = DeviceBuffer<bf16>(layer_elems_ * n_layers_);
  // Rows past a sequence's length are read by some attention kernels (and masked): keep them
  // finite.
  LY_CUDA_CHECK(cudaMemset(k_.data(), 0, k_.bytes()));
  LY_CUDA_CHECK(cudaMemset(v_.data(), 0, v_.bytes()));
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
  const size_t page_elems = size_t(n_kv_heads_) * page_size_ * head_dim_;
  for (int l = 0; l < n_layers_; ++l) {
    LY_CUDA_CHECK(cudaMemcpyAsync(k(l) + size_t(to) * page_elems, k(l) + size_t(from) * page_elems,
                                  page_elems * sizeof(bf16), cudaMemcpyDeviceToDevice, stream));
    LY_CUDA_CHECK(cudaMemcpyAsync(v(l) + size_t(to) * page_elems, v(l) + size_t(from) * page_elems,
                                  page_elems * sizeof(bf16), cudaMemcpyDeviceToDevice, stream));
  }
}

}  // namespace lychee::cuda
