// Dense causal prefill (chunked) attention over the paged KV cache: cuDNN's fused SDPA through the
// header-only cudnn-frontend, with our own FA2-style kernel as the fallback and the peer it is
// measured against (bench/bench_prefill_attention.cu).
//
// Semantics, per sequence b, query head h, query i < q_lens[b]:
//   out[b][i][h] = softmax_t(scale * q[b][i][h] . K[t]) V[t]  over t <= kv_lens[b] - q_lens[b] + i
// (causal, aligned bottom-right: the chunk's queries are the last q_len of the kv_len cached tokens).
// K[t], V[t] are token t of the sequence's KV head h / (n_heads / n_kv_heads), found at page
// page_table[b][t / page_size], row t % page_size of the pools.
//
// Preconditions the host cannot check (the lengths live on the device):
//   1 <= q_lens[b] <= q_len_max, q_lens[b] <= kv_lens[b] <= max_kv_len <= max_pages * page_size;
//   page_table[b][j] is a valid page id (0 <= id < n_pages) for EVERY j < max_pages, also past the
//   sequence's last page (write 0 there): cuDNN's loader may read a whole tile of table entries;
//   K/V rows past kv_len hold finite values (zero the pool once at allocation): a kernel that
//   loads a whole page masks those rows with P = 0, and 0 * NaN is NaN. (Our kernel reads neither;
//   test PrefillAttentionGarbage reports whether the cuDNN in use does.)
// Rows i >= q_lens[b] of out are unspecified afterwards (the fallback leaves them untouched).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cuda/common/common.h"

namespace lychee::cuda {

struct PrefillAttentionArgs {
  const bf16* q = nullptr;              // [batch][q_len_max][n_heads][head_dim], padded per sequence
  const bf16* k_pool = nullptr;         // [n_pages][n_kv_heads][page_size][head_dim], one layer
  const bf16* v_pool = nullptr;         // [n_pages][n_kv_heads][page_size][head_dim]
  const int32_t* page_table = nullptr;  // [batch][max_pages] device
  const int32_t* q_lens = nullptr;      // [batch] device: new tokens of each sequence in this chunk
  const int32_t* kv_lens = nullptr;     // [batch] device: tokens cached after the chunk (>= q_len)
  bf16* out = nullptr;                  // [batch][q_len_max][n_heads][head_dim]
  int batch = 0, q_len_max = 0, max_kv_len = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int page_size = 0, n_pages = 0, max_pages = 0;
  float scale = 0.0f;  // softmax scale, usually 1 / sqrt(head_dim)
  // FP8 KV (core/kv_dtype.h), in place of k_pool / v_pool (exactly one kind set): codes
  // [n_pages][n_kv_heads][page_size][head_dim] e4m3 and scales [n_pages][n_kv_heads][page_size]
  // f32, one layer. run() widens the kv bucket's pages of every sequence (bf16(scale · code), one
  // rounding) into [batch][n_kv_heads][kv_bucket][head_dim] bf16 and runs the bf16 path over that
  // (cuDNN reads it as its contiguous K/V; the fallback and split-KV kernels as one page of
  // kv_bucket tokens per sequence). The widening reads 1 byte and writes 2 per element, about
  // what the bf16 path's own gather of the pages moves (2 and 2).
  const uint8_t* k8_pool = nullptr;
  const uint8_t* v8_pool = nullptr;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  // bf16 pools that already hold one page per sequence (max_pages 1, page_table[b] = b, page_size
  // >= max_kv_len): the layout [batch][n_kv_heads][page_size][head_dim] cuDNN's graph reads, so
  // run() skips its gather of the pages into a contiguous copy (the trainer's context K/V).
  bool kv_contiguous = false;
};

// Checks the host-visible shape fields; Error(kInvalidArgument) naming the field otherwise.
void validate_prefill_args(const PrefillAttentionArgs& a);

// Graph-cache buckets (pure, unit-tested). The cuDNN graph is built for a padded maximum query
// length and a padded maximum KV length; the true lengths come per run from q_lens / kv_lens.
// kv bucket: max_kv_len rounded up to a power-of-two number of pages, capped at the table capacity.
int prefill_kv_bucket(int max_kv_len, int page_size, int max_pages);
// q bucket: q_len_max rounded up to a power of two (at least 64), never above the kv bucket.
int prefill_q_bucket(int q_len_max, int kv_bucket);

// Split-KV count for a chunk (pure, unit-tested): 1 (no split) when the (64-query tile, head,
// sequence) blocks fill a third of the SMs or more (cuDNN's faster kernel then wins) or the cache
// is short; otherwise enough slices of the KV tiles for about two blocks per SM, each slice at
// least 8 tiles (512 keys), at most 64 slices, and the f32 partial results (n x batch x q_len_max
// x n_heads x (head_dim + 1) x 4 bytes) within max_workspace_bytes.
int prefill_kv_splits(int batch, int q_len_max, int n_heads, int head_dim, int max_kv_len, int sm_count,
                      size_t max_workspace_bytes);
// Bytes of f32 partial results (outputs and log-sum-exps) n_splits slices of a chunk need.
size_t prefill_split_workspace_bytes(int n_splits, int batch, int q_len_max, int n_heads, int head_dim);

// The fallback kernel alone (FA2-style, mma.sync bf16, 64 queries x 64 keys a tile).
// head_dim 64 or 128. Launch only; no synchronisation.
void prefill_attention_fallback(const PrefillAttentionArgs& a, cudaStream_t stream);

namespace detail {
// out[i] = i * stride for 0 <= i < n (the ragged offsets, in elements, of cuDNN's Q and O).
void fill_ragged_offsets(int32_t* out, int n, int32_t stride, cudaStream_t stream);
// Launches the fallback kernel for head_dim 64 or 128; false (nothing launched) otherwise.
bool launch_prefill_fallback(const PrefillAttentionArgs& a, cudaStream_t stream);
// The same kernel over n_splits slices of the KV tiles (n_splits >= 2), writing f32 partial
// results into part_o [n_splits][batch][q_len_max][n_heads][head_dim] and part_lse
// [n_splits][batch][q_len_max][n_heads], then the merge into a.out. n_splits <= 1: the plain kernel.
bool launch_prefill_split(const PrefillAttentionArgs& a, int n_splits, float* part_o, float* part_lse,
                          cudaStream_t stream);
// Copies each sequence's first kv_bucket tokens of K and V from the pages into
// k_out/v_out [batch][n_kv_heads][kv_bucket][head_dim] (rows past kv_len copied as they are).
void gather_pages(const PrefillAttentionArgs& a, int kv_bucket, bf16* k_out, bf16* v_out, cudaStream_t stream);
// FP8 pages: the same copy widened, k_out[b][h][t] = bf16(k_scale[row] · e4m3(k8_pool[row])) for
// t < kv_bucket (rows past kv_len widened as they are: finite), and table_out[b] = b (the output
// as one page of kv_bucket tokens per sequence).
void widen_fp8_pages(const PrefillAttentionArgs& a, int kv_bucket, bf16* k_out, bf16* v_out, int32_t* table_out,
                     cudaStream_t stream);
}  // namespace detail

// Owns the cuDNN handle, a cache of built graphs keyed by shape, and the cuDNN workspace.
// Not thread-safe; one instance per stream-owning thread. The first run of each new shape bucket
// builds a graph (tens to hundreds of ms) and may grow the workspace (a device synchronisation):
// warm up every bucket before capturing run() into a CUDA graph (a build during capture throws).
class PrefillAttention {
 public:
  // kSplitKv is what ran, never a setting: the fallback kernel over slices of the KV cache, which
  // run() takes for a short chunk over a long cache (prefill_kv_splits > 1) whichever backend is
  // set, since both others leave most SMs idle there.
  enum class Backend { kCudnn, kFallback, kSplitKv };

  PrefillAttention();
  ~PrefillAttention();
  PrefillAttention(const PrefillAttention&) = delete;
  PrefillAttention& operator=(const PrefillAttention&) = delete;

  // kCudnn (default) drops to the fallback, with one warning, when cuDNN is missing, too old or
  // rejects the graph; kFallback always runs our kernel.
  void set_backend(Backend b);  // kCudnn or kFallback (kSplitKv is an outcome: kInvalidArgument)
  Backend backend() const { return backend_; }
  // Split-KV for short chunks over long caches: 0 (default) prefill_kv_splits decides; -1 never;
  // n >= 2 always n slices (tests, benchmarks).
  void set_kv_splits(int n) { kv_splits_ = n; }
  // Slices the last run() used (1: no split).
  int last_kv_splits() const { return last_kv_splits_; }
  // Which backend the last run() used, and why cuDNN was not used (empty when it was).
  Backend last_backend() const { return last_backend_; }
  const std::string& fallback_reason() const { return fallback_reason_; }

  // Causal, bottom-right aligned (see the top of this file). Enqueues on `stream`.
  void run(const PrefillAttentionArgs& a, cudaStream_t stream);

  // The cuDNN library loaded at run time (cudnnGetVersion(), e.g. 91900 for 9.19.0).
  static int cudnn_version();
  // The oldest cuDNN the cuDNN path accepts: paged K/V with ragged (padded-offset) Q and O and a
  // bottom-right causal mask at any length.
  static constexpr int kMinCudnnVersion = 90800;

  // Graphs built so far (for tests and logs).
  int n_graphs() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Backend backend_ = Backend::kCudnn;
  Backend last_backend_ = Backend::kCudnn;
  int kv_splits_ = 0, last_kv_splits_ = 1;
  std::string fallback_reason_;
  bool warned_ = false;

  void use_fallback(const PrefillAttentionArgs& a, cudaStream_t stream, std::string reason);
  void run_bf16(const PrefillAttentionArgs& a, cudaStream_t stream);
  void run_widened(const PrefillAttentionArgs& a, cudaStream_t stream);
};

}  // namespace lychee::cuda
