// The paged KV cache on the GPU: per layer, K and V pools [n_pages][n_kv_heads][page_size][head_dim]
// bf16, so one (page, KV head) is one contiguous run. Sized once from a memory budget; pages are
// handed to sequences from a free list, and running out is Error(kCapacity), never an allocation.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cuda/common/common.h"
#include "cuda/common/device_buffer.h"
#include "model/config.h"

namespace lychee::cuda {

class KvPool {
 public:
  KvPool(const ModelConfig& c, int page_size, size_t bytes);

  int page_size() const { return page_size_; }
  int n_pages() const { return n_pages_; }
  int n_free() const { return int(free_.size()); }
  // Bytes of K and V one page takes across all layers.
  size_t bytes_per_page() const { return page_bytes_; }

  bf16* k(int layer) { return k_.data() + size_t(layer) * layer_elems_; }
  bf16* v(int layer) { return v_.data() + size_t(layer) * layer_elems_; }

  // A free page id; Error(kCapacity) naming the pool size when none is left.
  int32_t alloc();
  void release(std::span<const int32_t> pages);

 private:
  int n_layers_, n_kv_heads_, head_dim_, page_size_, n_pages_;
  size_t page_bytes_, layer_elems_;
  DeviceBuffer<bf16> k_, v_;  // [n_layers][n_pages][n_kv_heads][page_size][head_dim]
  std::vector<int32_t> free_;
};

}  // namespace lychee::cuda
