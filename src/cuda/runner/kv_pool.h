// The paged KV cache on the GPU, per layer K and V pools of pages; one (page, KV head) is one
// contiguous run. Sized once from a memory budget; pages are handed to sequences from a free
// list, and running out is Error(kCapacity), never an allocation. Pages are reference-counted:
// sequences that share a cached prefix hold its full pages together (prefix reuse; a shared page
// is never written: every sequence appends past its own prefix).
//
// Element types (RunnerOptions::kv_cache_dtype, core/kv_dtype.h):
//   kBf16: k(l), v(l)   [n_pages][n_kv_heads][page_size][head_dim] bf16
//   kFp8:  k8(l), v8(l) [n_pages][n_kv_heads][page_size][head_dim] e4m3 codes, and
//          k_scale(l), v_scale(l) [n_pages][n_kv_heads][page_size] f32, one scale per token and
//          KV head (a page's scales of one head are one contiguous run of page_size floats, so an
//          attention tile's scales are one 16-byte load per 4 tokens).
// Bytes per page: kv_bytes_per_token_head x tokens x heads x layers x 2, so the same budget
// holds about twice the pages with FP8 (head_dim 128: 132 bytes per token and head, not 256).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/kv_dtype.h"
#include "cuda/common/common.h"
#include "cuda/common/device_buffer.h"
#include "model/config.h"

namespace lychee::cuda {

class KvPool {
 public:
  KvPool(const ModelConfig& c, int page_size, size_t bytes, KvCacheDtype dtype = KvCacheDtype::kBf16);

  KvCacheDtype dtype() const { return dtype_; }
  bool fp8() const { return dtype_ == KvCacheDtype::kFp8; }
  int page_size() const { return page_size_; }
  int n_pages() const { return n_pages_; }
  int n_free() const { return int(free_.size()); }
  // Bytes of K and V one page takes across all layers (codes and scales with FP8).
  size_t bytes_per_page() const { return page_bytes_; }

  // kBf16 pools (null with FP8).
  bf16* k(int layer) { return fp8() ? nullptr : reinterpret_cast<bf16*>(k_.data()) + size_t(layer) * layer_elems_; }
  bf16* v(int layer) { return fp8() ? nullptr : reinterpret_cast<bf16*>(v_.data()) + size_t(layer) * layer_elems_; }
  // kFp8 codes and scales (null with bf16).
  uint8_t* k8(int layer) { return fp8() ? k_.data() + size_t(layer) * layer_elems_ : nullptr; }
  uint8_t* v8(int layer) { return fp8() ? v_.data() + size_t(layer) * layer_elems_ : nullptr; }
  float* k_scale(int layer) { return fp8() ? k_scale_.data() + size_t(layer) * layer_rows_ : nullptr; }
  float* v_scale(int layer) { return fp8() ? v_scale_.data() + size_t(layer) * layer_rows_ : nullptr; }

  // A free page id (one reference); Error(kCapacity) naming the pool size when none is left.
  int32_t alloc();
  // One more holder of a page in use.
  void retain(int32_t page);
  // Drops one reference per page; a page with none left is free again.
  void release(std::span<const int32_t> pages);
  int refs(int32_t page) const { return refs_[size_t(page)]; }
  // Copies page `from` to page `to` in every layer (K and V, with FP8 their codes and scales), on
  // `stream`.
  void copy_page(int32_t from, int32_t to, cudaStream_t stream);

 private:
  KvCacheDtype dtype_;
  int n_layers_, n_kv_heads_, head_dim_, page_size_, n_pages_;
  size_t page_bytes_;
  size_t elem_bytes_;   // 2 (bf16) or 1 (e4m3)
  size_t layer_elems_;  // elements of one layer's K (or V): n_pages * n_kv_heads * page_size * head_dim
  size_t layer_rows_;   // token rows of one layer's K (or V): n_pages * n_kv_heads * page_size
  DeviceBuffer<uint8_t> k_, v_;          // [n_layers][n_pages][n_kv_heads][page_size][head_dim] bf16 or e4m3
  DeviceBuffer<float> k_scale_, v_scale_;  // FP8: [n_layers][n_pages][n_kv_heads][page_size]
  std::vector<int32_t> free_;
  std::vector<int32_t> refs_;  // per page
};

}  // namespace lychee::cuda
