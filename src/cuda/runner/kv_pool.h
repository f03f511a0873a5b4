// The paged KV cache on the GPU: per layer, K and V pools [n_pages][n_kv_heads][page_size][head_dim]
// bf16, so one (page, KV head) is one contiguous run. Sized once from a memory budget; pages are
// handed to sequences from a free list, and running out is Error(kCapacity), never an allocation.
// Pages are reference-counted: sequences that share a cached prefix hold its full pages together
// (prefix reuse; a shared page is never written: every sequence appends past its own prefix).
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

  // A free page id (one reference); Error(kCapacity) naming the pool size when none is left.
  int32_t alloc();
  // One more holder of a page in use.
  void retain(int32_t page);
  // Drops one reference per page; a page with none left is free again.
  void release(std::span<const int32_t> pages);
  int refs(int32_t page) const { return refs_[size_t(page)]; }
  // Copies page `from` to page `to` in every layer (K and V), on `stream`.
  void copy_page(int32_t from, int32_t to, cudaStream_t stream);

 private:
  int n_layers_, n_kv_heads_, head_dim_, page_size_, n_pages_;
  size_t page_bytes_, layer_elems_;
  DeviceBuffer<bf16> k_, v_;  // [n_layers][n_pages][n_kv_heads][page_size][head_dim]
  std::vector<int32_t> free_;
  std::vector<int32_t> refs_;  // per page
};

}  // namespace lychee::cuda
