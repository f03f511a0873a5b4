// Split-KV paged decode attention for Hopper (sm_90a): kernels, launchers and dispatch.
// Design, byte count, napkin math and lab notes: docs/kernels/decode-attention.md.
//
// Main kernel: one CTA (4 warps) per work item = an entry range of one head's list (dense pages,
// selected pages, selected tokens or a window; all of a KV head's query rows or one). The CTA
// streams that range through shared memory in tiles of 64 tokens (K and V, 16-byte cp.async.cg,
// XOR-swizzled, kStages deep) and every warp attends to its own 16 tokens of each tile with
// mma.sync m16n8k16: S = Q K^T with the group's query heads as the 16 rows (rows >= group are
// zero), an online softmax in the log2 domain, O += P V with P taken straight from S's
// accumulators. The 4 warps' (m, l, O) are merged through shared memory at the end; the item
// writes `out` (bf16) when it is its head's only item, else a normalised partial O and its LSE.
// Retrieval items also write their page (or token) scores from the same S accumulators: no
// second read of K. The merge of the partials is decode_merge.cu.
#include "cuda/kernels/decode_attention.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

namespace lychee::cuda {
namespace {

constexpr int kThreads = 128;     // 4 warps per CTA
constexpr int kWarps = kThreads / 32;
constexpr int kTileTokens = 64;   // tokens per pipeline stage: 16 per warp, one mma k-step of P V
constexpr int kMaxGroup = 8;      // query heads per KV head: mma rows 0..7, rows 8..15 are padding
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Tile sizes per head dim (one traits struct, as TK does).
template <int HeadDim>
struct DecodeTraits {
  static constexpr int kRowBytes = HeadDim * 2;                // one token of K (or V), bf16
  static constexpr int kChunksPerRow = HeadDim / 8;            // 16-byte chunks per token
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow; // rows one cp.async per thread covers
  static constexpr int kPasses = kTileTokens / kRowsPerPass;
  static constexpr int kTileBytes = kTileTokens * kRowBytes;   // K (or V) of one tile
  static constexpr int kStageBytes = 2 * kTileBytes;           // K then V
  // 96 KiB of stages per CTA, two CTAs per SM: up to 4 tiles (128 KiB at d=128) in flight per SM,
  // several times the bandwidth-latency product (3 TB/s / 132 SMs x ~1 us = 23 KB).
  static constexpr int kStages = (96 * 1024) / kStageBytes;    // 3 at d=128, 6 at d=64
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static constexpr int kKSteps = HeadDim / 16;                 // mma k-steps of Q K^T
  static constexpr int kDimTiles = HeadDim / 8;                // mma n-tiles of P V
  static constexpr int kOutStride = HeadDim + 8;               // epilogue row, padded (floats)
  static_assert(kChunksPerRow >= 8, "the XOR swizzle needs at least 8 chunks per row");
  static_assert(kStages >= 2, "the pipeline needs two stages");
  static_assert(kWarps * kMaxGroup * kOutStride * 4 <= kSmemBytes, "epilogue reuses the stages");
};

// FP8 KV (DecodeAttentionArgs::k8_pool): a stage holds the tile's K codes, V codes, K scales and
// V scales ([64][HeadDim] e4m3 twice, unswizzled: the widening reads them 16 bytes a lane in
// order, conflict-free; then [64] f32 twice). Before attending, each warp widens its 16 rows of K
// and V into one bf16 tile pair laid out as the bf16 kernel's stage (swizzled), so attend_tile's
// ldmatrix / mma path is the bf16 one; the scales are applied to the scalars there. Half the
// bytes per stage, so the same 96 KiB of shared memory per CTA keeps the same tokens in flight.
template <int HeadDim>
struct Fp8DecodeTraits {
  using Bf = DecodeTraits<HeadDim>;
  static constexpr int kRowBytes = HeadDim;                      // one token's codes
  static constexpr int kChunksPerRow = HeadDim / 16;             // 16-byte chunks per token (8 or 4)
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;  // 16 or 32
  static constexpr int kPasses = kTileTokens / kRowsPerPass;
  static constexpr int kTileBytes = kTileTokens * kRowBytes;     // K (or V) codes of one tile
  static constexpr int kScaleBytes = kTileTokens * 4;            // K (or V) scales of one tile
  static constexpr int kStageBytes = 2 * kTileBytes + 2 * kScaleBytes;
  static constexpr int kWidenBytes = 2 * Bf::kTileBytes;         // the widened bf16 K and V tile
  static constexpr int kStages = (96 * 1024 - kWidenBytes) / kStageBytes;  // 3 at d=128, 9 at d=64
  static constexpr int kSmemBytes = kWidenBytes + kStages * kStageBytes;
  static_assert(kStages >= 2, "the pipeline needs two stages");
  static_assert(kWarps * kMaxGroup * Bf::kOutStride * 4 <= kSmemBytes, "epilogue reuses the stages");
};

// The stage geometry of either element type: Fp8 false, the bf16 stages at offset 0.
template <int HeadDim, bool Fp8>
struct StageTraits {
  static constexpr int kStages = DecodeTraits<HeadDim>::kStages;
  static constexpr int kStageBytes = DecodeTraits<HeadDim>::kStageBytes;
  static constexpr int kBase = 0;
  static constexpr int kSmemBytes = DecodeTraits<HeadDim>::kSmemBytes;
};
template <int HeadDim>
struct StageTraits<HeadDim, true> {
  static constexpr int kStages = Fp8DecodeTraits<HeadDim>::kStages;
  static constexpr int kStageBytes = Fp8DecodeTraits<HeadDim>::kStageBytes;
  static constexpr int kBase = Fp8DecodeTraits<HeadDim>::kWidenBytes;
  static constexpr int kSmemBytes = Fp8DecodeTraits<HeadDim>::kSmemBytes;
};

using namespace ptx;

// 4-byte global -> shared copy through L1 (cp.async.cg takes 16 bytes only): one token's scale on
// the gather path; src_bytes 0 writes zeros.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// Byte offset of 16-byte chunk `chunk` of token row `row` in a K or V tile. XOR-ing the chunk with
// row % 8 puts the 8 rows of every ldmatrix phase (and of every cp.async phase) in distinct banks.
__host__ __device__ constexpr uint32_t tile_offset(int row, int chunk, int row_bytes) {
  return uint32_t(row * row_bytes + ((chunk ^ (row & 7)) << 4));
}

// ------------------------------------------------------------------------------ main kernel

// An item's geometry, resolved once at the start of the CTA.
struct ItemView {
  const int32_t* bt;    // the sequence's block-table row
  const int32_t* list;  // kUnits: the head's unit list
  ListKind kind;
  int begin;            // first entry
  int unit, unit_shift; // tokens per entry (a power of two) and its log2
  int n_tok;            // tokens the item reads (0: empty, past the device-side length)
  bool has_last;        // the item reads the sequence's last token (the one this step appended)
  int len;              // sequence length
  int sink, recent;     // kWindow: effective sink and recent counts
};

// The unit id of entry e (absolute entry index).
__device__ __forceinline__ int unit_of_entry(const ItemView& v, int e) {
  if (v.kind == ListKind::kUnits) return __ldg(v.list + e);
  if (v.kind == ListKind::kWindow) return e < v.sink ? e : v.len - v.recent + (e - v.sink);
  return e;
}

__device__ __forceinline__ ItemView make_view(const DecodeAttentionArgs& a, const DecodeWorkItem& item) {
  ItemView v;
  v.bt = a.block_table + size_t(item.seq) * a.max_pages;
  v.list = item.kind == ListKind::kUnits ? a.unit_lists + item.list : nullptr;
  v.kind = item.kind;
  v.begin = item.begin;
  v.unit = item.unit;
  v.unit_shift = __ffs(item.unit) - 1;
  v.len = a.seq_lens[item.seq];
  v.sink = min(a.window_sink, v.len);
  v.recent = min(a.window_recent, v.len - v.sink);
  const int last_unit = (v.len - 1) >> v.unit_shift;
  int count = last_unit + 1;
  if (item.kind == ListKind::kUnits) count = a.list_counts[item.count];
  else if (item.kind == ListKind::kWindow) count = v.sink + v.recent;
  // Every list ends with the sequence's last unit, the only one that can be partial.
  const int e_end = min(item.end, count);
  v.n_tok = e_end > item.begin
                ? ((e_end - item.begin) << v.unit_shift) - (e_end == count ? ((last_unit + 1) << v.unit_shift) - v.len : 0)
                : 0;
  v.has_last = e_end > item.begin && e_end == count;
  return v;
}

// Copies tiles of an item's K and V into shared memory. Tile t holds the item's tokens
// [64 t, 64 t + 64); thread `tid` copies chunk tid % kChunksPerRow of rows tid / kChunksPerRow
// + kRowsPerPass * i. Two ways to find a row: the page path (entries are whole pages: one
// block-table lookup per page and tile, every warp instruction reads 512 contiguous bytes) and
// the gather path (entries of 1, 16 or 32 tokens: a lookup per row). Both fetch the lookups of
// a tile one tile ahead of its copies, so their latency hides behind the pipeline.
template <int HeadDim, int PageSize>
struct PageLoader {
  using Tr = DecodeTraits<HeadDim>;
  static constexpr int kPagesPerTile = PageSize >= kTileTokens ? 1 : kTileTokens / PageSize;
  static_assert(PageSize % Tr::kRowsPerPass == 0, "a pass must not straddle pages");

  const bf16* k;          // this KV head's rows in page 0 of the K pool
  const bf16* v;
  int64_t page_stride;    // elements from one page to the next: n_kv_heads * PageSize * HeadDim
  ItemView iv;
  int row0, chunk;
  int ids[kPagesPerTile];

  __device__ __forceinline__ void fetch(int t) {
    const int first = t * kTileTokens / PageSize;  // item-relative entry
#pragma unroll
    for (int j = 0; j < kPagesPerTile; ++j)
      ids[j] = (first + j) * PageSize < iv.n_tok ? __ldg(iv.bt + unit_of_entry(iv, iv.begin + first + j)) : 0;
  }

  __device__ __forceinline__ void issue(uint32_t stage, int t) const {
#pragma unroll
    for (int i = 0; i < Tr::kPasses; ++i) {
      const int row = row0 + i * Tr::kRowsPerPass;
      const int tok = t * kTileTokens + row;                  // item-relative token
      const int j = PageSize >= kTileTokens ? 0 : (i * Tr::kRowsPerPass) / PageSize;
      const int64_t off = int64_t(ids[j]) * page_stride + (tok % PageSize) * HeadDim + chunk * 8;
      const bool ok = tok < iv.n_tok;
      const uint32_t dst = stage + tile_offset(row, chunk, Tr::kRowBytes);
      cp_async_16(dst, ok ? k + off : k, ok ? 16 : 0);
      cp_async_16(dst + Tr::kTileBytes, ok ? v + off : v, ok ? 16 : 0);
    }
  }
};

template <int HeadDim, int PageSize>
struct GatherLoader {
  using Tr = DecodeTraits<HeadDim>;
  const bf16* k;
  const bf16* v;
  int64_t page_stride;
  ItemView iv;
  int row0, chunk;
  int64_t offs[Tr::kPasses];  // element offset of each of this thread's rows, -1 past the item

  __device__ __forceinline__ void fetch(int t) {
#pragma unroll
    for (int i = 0; i < Tr::kPasses; ++i) {
      const int tok = t * kTileTokens + row0 + i * Tr::kRowsPerPass;
      offs[i] = -1;
      if (tok < iv.n_tok) {
        const int e = iv.begin + (tok >> iv.unit_shift);
        const int pos = (unit_of_entry(iv, e) << iv.unit_shift) + (tok & (iv.unit - 1));
        offs[i] = int64_t(__ldg(iv.bt + pos / PageSize)) * page_stride + (pos % PageSize) * HeadDim + chunk * 8;
      }
    }
  }

  __device__ __forceinline__ void issue(uint32_t stage, int) const {
#pragma unroll
    for (int i = 0; i < Tr::kPasses; ++i) {
      const int row = row0 + i * Tr::kRowsPerPass;
      const bool ok = offs[i] >= 0;
      const uint32_t dst = stage + tile_offset(row, chunk, Tr::kRowBytes);
      cp_async_16(dst, ok ? k + offs[i] : k, ok ? 16 : 0);
      cp_async_16(dst + Tr::kTileBytes, ok ? v + offs[i] : v, ok ? 16 : 0);
    }
  }
};

// The FP8 loaders: as above, over codes (16 bytes = 16 dims a chunk) and with the tile's scales.
// Page path: threads 0..31 copy the K (0..15) and V (16..31) scales of 4 tokens each (a page's
// scales of one head are contiguous and pages hold >= 16 tokens, so 4 tokens never straddle).
template <int HeadDim, int PageSize>
struct Fp8PageLoader {
  using Tr = Fp8DecodeTraits<HeadDim>;
  static constexpr int kPagesPerTile = PageSize >= kTileTokens ? 1 : kTileTokens / PageSize;
  static_assert(PageSize % Tr::kRowsPerPass == 0, "a pass must not straddle pages");

  const uint8_t* k;       // this KV head's rows in page 0 of the code pools
  const uint8_t* v;
  const float* ks;        // this KV head's scales in page 0
  const float* vs;
  int64_t page_stride;    // bytes (codes) from one page to the next: n_kv_heads * PageSize * HeadDim
  int64_t scale_stride;   // floats from one page to the next: n_kv_heads * PageSize
  ItemView iv;
  int row0, chunk;
  int ids[kPagesPerTile];

  __device__ __forceinline__ void fetch(int t) {
    const int first = t * kTileTokens / PageSize;
#pragma unroll
    for (int j = 0; j < kPagesPerTile; ++j)
      ids[j] = (first + j) * PageSize < iv.n_tok ? __ldg(iv.bt + unit_of_entry(iv, iv.begin + first + j)) : 0;
  }

  __device__ __forceinline__ void issue(uint32_t stage, int t) const {
#pragma unroll
    for (int i = 0; i < Tr::kPasses; ++i) {
      const int row = row0 + i * Tr::kRowsPerPass;
      const int tok = t * kTileTokens + row;
      const int j = PageSize >= kTileTokens ? 0 : (i * Tr::kRowsPerPass) / PageSize;
      const int64_t off = int64_t(ids[j]) * page_stride + (tok % PageSize) * HeadDim + chunk * 16;
      const bool ok = tok < iv.n_tok;
      const uint32_t dst = stage + row * Tr::kRowBytes + chunk * 16;
      cp_async_16(dst, ok ? k + off : k, ok ? 16 : 0);
      cp_async_16(dst + Tr::kTileBytes, ok ? v + off : v, ok ? 16 : 0);
    }
    if (threadIdx.x < 32) {
      const int c = threadIdx.x & 15, row = 4 * c, tok = t * kTileTokens + row;
      const int jj = PageSize >= kTileTokens ? 0 : row / PageSize;
      int id = ids[0];  // ids[jj] without a dynamic index (which would put ids in local memory)
#pragma unroll
      for (int j = 1; j < kPagesPerTile; ++j) id = jj == j ? ids[j] : id;
      const bool ok = tok < iv.n_tok;
      const float* src = (threadIdx.x < 16 ? ks : vs) + int64_t(id) * scale_stride + tok % PageSize;
      const uint32_t dst = stage + 2 * Tr::kTileBytes + (threadIdx.x < 16 ? 0 : Tr::kScaleBytes) + row * 4;
      cp_async_16(dst, ok ? src : ks, ok ? 16 : 0);
    }
  }
};

// Gather path: a lookup per row; the thread copying a row's chunk 0 also copies its two scales.
template <int HeadDim, int PageSize>
struct Fp8GatherLoader {
  using Tr = Fp8DecodeTraits<HeadDim>;
  const uint8_t* k;
  const uint8_t* v;
  const float* ks;
  const float* vs;
  int64_t page_stride, scale_stride;
  ItemView iv;
  int row0, chunk;
  int64_t offs[Tr::kPasses];   // byte offset of each of this thread's code chunks, -1 past the item
  int64_t soffs[Tr::kPasses];  // its row's scale offset (floats)

  __device__ __forceinline__ void fetch(int t) {
#pragma unroll
    for (int i = 0; i < Tr::kPasses; ++i) {
      const int tok = t * kTileTokens + row0 + i * Tr::kRowsPerPass;
      offs[i] = -1;
      soffs[i] = 0;
      if (tok < iv.n_tok) {
        const int e = iv.begin + (tok >> iv.unit_shift);
        const int pos = (unit_of_entry(iv, e) << iv.unit_shift) + (tok & (iv.unit - 1));
        const int64_t page = __ldg(iv.bt + pos / PageSize);
        offs[i] = page * page_stride + (pos % PageSize) * HeadDim + chunk * 16;
        soffs[i] = page * scale_stride + pos % PageSize;
      }
    }
  }

  __device__ __forceinline__ void issue(uint32_t stage, int) const {
#pragma unroll
    for (int i = 0; i < Tr::kPasses; ++i) {
      const int row = row0 + i * Tr::kRowsPerPass;
      const bool ok = offs[i] >= 0;
      const uint32_t dst = stage + row * Tr::kRowBytes + chunk * 16;
      cp_async_16(dst, ok ? k + offs[i] : k, ok ? 16 : 0);
      cp_async_16(dst + Tr::kTileBytes, ok ? v + offs[i] : v, ok ? 16 : 0);
      if (chunk == 0) {
        const uint32_t sdst = stage + 2 * Tr::kTileBytes + row * 4;
        cp_async_4(sdst, ks + soffs[i], ok ? 4 : 0);
        cp_async_4(sdst + Tr::kScaleBytes, vs + soffs[i], ok ? 4 : 0);
      }
    }
  }
};

// 4 e4m3 codes (dims 0..3, lowest byte first) -> 2 bf16x2 words, exact: e4m3 -> f16 is exact
// (cvt.rn.f16x2.e4m3x2), and so are f16 -> f32 and, for these values, f32 -> bf16.
__device__ __forceinline__ uint2 widen_e4m3x4(uint32_t w) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w & 0xFFFFu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w >> 16), __NV_E4M3);
  const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
  return make_uint2(pack_bf16x2(a.x, a.y), pack_bf16x2(b.x, b.y));
}

// Warp `warp`'s 16 rows of a tile's K and V codes (stage layout above) into the bf16 tile pair at
// `out` (K tile, then V tile; each DecodeTraits::kTileBytes, swizzled as tile_offset).
template <int HeadDim>
__device__ __forceinline__ void widen_warp_rows(const uint8_t* codes, uint8_t* out) {
  using F8 = Fp8DecodeTraits<HeadDim>;
  using Tr = DecodeTraits<HeadDim>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int kv = 0; kv < 2; ++kv)
#pragma unroll
    for (int i = 0; i < 16 * F8::kChunksPerRow / 32; ++i) {
      const int q = lane + 32 * i;
      const int row = warp * 16 + q / F8::kChunksPerRow, c = q % F8::kChunksPerRow;
      const uint4 w = *reinterpret_cast<const uint4*>(codes + kv * F8::kTileBytes + row * HeadDim + c * 16);
      const uint2 a = widen_e4m3x4(w.x), b = widen_e4m3x4(w.y), d = widen_e4m3x4(w.z), e = widen_e4m3x4(w.w);
      uint8_t* o = out + kv * Tr::kTileBytes;
      *reinterpret_cast<uint4*>(o + tile_offset(row, 2 * c, Tr::kRowBytes)) = make_uint4(a.x, a.y, b.x, b.y);
      *reinterpret_cast<uint4*>(o + tile_offset(row, 2 * c + 1, Tr::kRowBytes)) = make_uint4(d.x, d.y, e.x, e.y);
    }
}

// Where a scoring item writes (fused scoring of retrieval heads; see ScoreKind).
struct ScoreSink {
  ScoreKind kind;
  float* row;       // group kinds: the (seq, kv head) row; kRowToken: the row of the item's first query row
  int stride;       // floats between rows (kRowToken)
  int pos0;         // position of the item's token 0
  int n_rows;
  float inv_rows;   // 1 / n_rows: the group mean
};

// One warp, one tile: its 16 tokens [tok0, tok0 + 16) against the group's queries. (m, l) are the
// running max (log2 domain, scaled) and sum of row g = lane / 4; o holds rows g (c0, c1) and the
// zero padding rows g + 8 (c2, c3).
// Fp8: k_sc / v_sc are the tile's K and V scales (shared memory, token 0 of the tile); the codes
// in k_tile / v_tile are widened but unscaled.
template <int HeadDim, bool Fp8 = false>
__device__ __forceinline__ void attend_tile(uint32_t k_tile, uint32_t v_tile,
                                            const uint32_t (&qf)[DecodeTraits<HeadDim>::kKSteps][2],
                                            float (&o)[DecodeTraits<HeadDim>::kDimTiles][4], float& m,
                                            float& l, int tok0, int n_tok, float scale_log2,
                                            const ScoreSink& sc, const float* k_sc = nullptr,
                                            const float* v_sc = nullptr) {
  using Tr = DecodeTraits<HeadDim>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r8 = lane & 7, t4 = lane & 3;

  // S = Q K^T. ldmatrix matrices: (tokens 0-7 | 8-15 of the warp) x (dims lo | hi of the k-step).
  const uint32_t k_row = k_tile + (warp * 16 + ((lane >> 4) << 3) + r8) * Tr::kRowBytes;
  const int k_hi = (lane >> 3) & 1;
  float s[2][4] = {};
#pragma unroll
  for (int ks = 0; ks < Tr::kKSteps; ++ks) {
    uint32_t b[4];
    ldmatrix_x4(b, k_row + (((2 * ks + k_hi) ^ r8) << 4));
    mma_bf16(s[0], qf[ks][0], 0u, qf[ks][1], 0u, b[0], b[1]);
    mma_bf16(s[1], qf[ks][0], 0u, qf[ks][1], 0u, b[2], b[3]);
  }
  if constexpr (Fp8) {  // logit = s_k[t] (q . code_k[t]); this thread's tokens are 8 n + 2 t4 + i
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const float2 sk = *reinterpret_cast<const float2*>(k_sc + warp * 16 + 8 * n + 2 * t4);
      s[n][0] *= sk.x;
      s[n][1] *= sk.y;
    }
  }

  // Fused scoring from the raw logits, before any scaling: the sum over the group's rows (rows
  // past n_rows have a zero query) lies in the lanes of one t4 column (lane bits 2..4).
  if (sc.kind != ScoreKind::kNone) {
    const int g = lane >> 2;
    if (sc.kind == ScoreKind::kRowToken) {
      if (g < sc.n_rows)
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int tok = tok0 + 8 * n + 2 * t4 + i;
            if (tok < n_tok) sc.row[size_t(g) * sc.stride + sc.pos0 + tok] = s[n][i];
          }
    } else {
      float mean[2][2];
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float x = s[n][i];
          x += __shfl_xor_sync(0xffffffffu, x, 4);
          x += __shfl_xor_sync(0xffffffffu, x, 8);
          x += __shfl_xor_sync(0xffffffffu, x, 16);
          mean[n][i] = x * sc.inv_rows;
        }
      if (sc.kind == ScoreKind::kGroupToken) {
        if (g == 0)
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              const int tok = tok0 + 8 * n + 2 * t4 + i;
              if (tok < n_tok) sc.row[sc.pos0 + tok] = mean[n][i];
            }
      } else {  // kGroupChunk16: the max over the warp's 16 tokens (one aligned chunk)
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int i = 0; i < 2; ++i)
            if (tok0 + 8 * n + 2 * t4 + i < n_tok) mx = fmaxf(mx, mean[n][i]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        if (lane == 0) sc.row[(sc.pos0 + tok0) >> 4] = mx;
      }
    }
  }

  // Online softmax of row g over this thread's 4 scores (tokens tok0 + 8n + 2 t4 + i); the row's
  // 4 threads are one quad.
  float mx = -INFINITY;
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int tok = tok0 + 8 * n + 2 * t4 + i;
      s[n][i] = tok < n_tok ? s[n][i] * scale_log2 : -INFINITY;
      mx = fmaxf(mx, s[n][i]);
    }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float m_new = fmaxf(m, mx);
  const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // nothing valid yet: keep exp2 off NaN
  const float alpha = ex2(m - m_use);                     // m == -inf gives 0; o and l are 0 then
  float p[2][2], p_sum = 0.0f;
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      p[n][i] = ex2(s[n][i] - m_use);
      p_sum += p[n][i];
    }
  l = l * alpha + p_sum;
  m = m_new;
#pragma unroll
  for (int j = 0; j < Tr::kDimTiles; ++j) {
    o[j][0] *= alpha;
    o[j][1] *= alpha;
  }

  // O += P V. S's accumulators are P's A fragment (k = the warp's 16 tokens). ldmatrix.trans
  // matrices: (tokens 0-7 | 8-15) x (dims of n-tile 2 np | 2 np + 1).
  if constexpr (Fp8) {  // V's scale folded into the probability (l above took p alone)
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const float2 sv = *reinterpret_cast<const float2*>(v_sc + warp * 16 + 8 * n + 2 * t4);
      p[n][0] *= sv.x;
      p[n][1] *= sv.y;
    }
  }
  const uint32_t pa0 = pack_bf16x2(p[0][0], p[0][1]), pa2 = pack_bf16x2(p[1][0], p[1][1]);
  const uint32_t v_row = v_tile + (warp * 16 + (((lane >> 3) & 1) << 3) + r8) * Tr::kRowBytes;
  const int v_hi = lane >> 4;
#pragma unroll
  for (int np = 0; np < Tr::kDimTiles / 2; ++np) {
    uint32_t b[4];
    ldmatrix_x4_trans(b, v_row + (((2 * np + v_hi) ^ r8) << 4));
    mma_bf16(o[2 * np], pa0, 0u, pa2, 0u, b[0], b[1]);
    mma_bf16(o[2 * np + 1], pa0, 0u, pa2, 0u, b[2], b[3]);
  }
}

// Merges the 4 warps' states and writes the item's result: bf16 `out` rows when it is its head's
// only item, else the normalised partial O and the natural-log LSE of its slot.
template <int HeadDim>
__device__ __forceinline__ void write_item(const DecodeAttentionArgs& a, const DecodeWorkItem& item,
                                           int group, uint8_t* smem,
                                           const float (&o)[DecodeTraits<HeadDim>::kDimTiles][4], float m,
                                           float l) {
  using Tr = DecodeTraits<HeadDim>;
  __shared__ float s_m[kWarps][kMaxGroup], s_l[kWarps][kMaxGroup], s_inv[kMaxGroup], s_lse[kMaxGroup];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (t4 == 0) {
    s_m[warp][g] = m;
    s_l[warp][g] = l;
  }
  __syncthreads();
  float m_max = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) m_max = fmaxf(m_max, s_m[w][g]);
  // A warp that saw no valid token has m == -inf and contributes nothing (no -inf - -inf).
  const float f = m == -INFINITY ? 0.0f : ex2(m - m_max);
  float* s_o = reinterpret_cast<float*>(smem);  // [kWarps][kMaxGroup][kOutStride] f32
#pragma unroll
  for (int j = 0; j < Tr::kDimTiles; ++j)
    *reinterpret_cast<float2*>(s_o + (warp * kMaxGroup + g) * Tr::kOutStride + 8 * j + 2 * t4) =
        make_float2(o[j][0] * f, o[j][1] * f);
  if (warp == 0 && t4 == 0) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      if (s_m[w][g] != -INFINITY) sum += s_l[w][g] * ex2(s_m[w][g] - m_max);
    s_inv[g] = sum > 0.0f ? 1.0f / sum : 0.0f;
    s_lse[g] = sum > 0.0f ? (m_max + __log2f(sum)) * kLn2 : -INFINITY;
  }
  __syncthreads();

  constexpr int kVec = HeadDim / 4;  // 4 dims per thread and step
  const int n_rows = item.n_rows, row_begin = item.row_begin;
  for (int idx = threadIdx.x; idx < n_rows * kVec; idx += kThreads) {
    const int r = idx / kVec, c = (idx % kVec) * 4;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float4 x = *reinterpret_cast<const float4*>(s_o + (w * kMaxGroup + r) * Tr::kOutStride + c);
      acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
    }
    const float inv = s_inv[r];
    acc.x *= inv, acc.y *= inv, acc.z *= inv, acc.w *= inv;
    if (item.slot < 0) {
      const size_t row = size_t(item.seq) * a.n_heads + size_t(item.kv_head) * group + row_begin + r;
      *reinterpret_cast<uint2*>(a.out + row * HeadDim + c) = pack_bf16x4(acc);
    } else {
      *reinterpret_cast<float4*>(a.partial_o + (size_t(item.slot) * group + row_begin + r) * HeadDim + c) = acc;
    }
  }
  if (item.slot >= 0 && int(threadIdx.x) < n_rows)
    a.partial_lse[size_t(item.slot) * group + row_begin + threadIdx.x] = s_lse[threadIdx.x];
}

// The pipeline over one item's tiles with either loader, then the epilogue. pre_wait (a CTA's
// first item): the grid has not yet waited for the kernel before it. Only the previous kernel
// writes what a decode step's attention reads (q, and K/V of the token it appended, which lies in
// the item's last tile when the item reads the sequence's last token); the plan, lists, lengths,
// block table and older K/V come from earlier work (wait_previous_kernel). So the first item's
// tiles before that one are copied in before the wait, hiding their lookups and their latency
// behind the previous kernel's tail.
template <int HeadDim, bool Fp8, typename Loader>
__device__ __forceinline__ void run_item(const DecodeAttentionArgs& a, const DecodeWorkItem& item, Loader& ld,
                                         const ScoreSink& sc, uint8_t* smem, bool pre_wait) {
  using Tr = StageTraits<HeadDim, Fp8>;
  const int group = a.n_heads / a.n_kv_heads;
  const int n_tok = ld.iv.n_tok;
  const int n_tiles = n_tok > 0 ? (n_tok + kTileTokens - 1) / kTileTokens : 0;

  const uint32_t smem0 = smem_u32(smem) + Tr::kBase;  // the stages
  // Commit groups stay one per prologue tile, in tile order, whichever side of the wait a tile is
  // issued on (the main loop's wait_group counts rely on it).
  const int early = pre_wait ? (ld.iv.has_last ? n_tiles - 1 : n_tiles) : 0;
  int s0 = 0;
  for (; s0 < Tr::kStages - 1 && s0 < early; ++s0) {
    ld.fetch(s0);
    ld.issue(smem0 + s0 * Tr::kStageBytes, s0);
    cp_async_commit();
  }
  if (pre_wait) wait_previous_kernel();
  for (int s = s0; s < Tr::kStages - 1; ++s) {
    if (s < n_tiles) {
      ld.fetch(s);
      ld.issue(smem0 + s * Tr::kStageBytes, s);
    }
    cp_async_commit();
  }
  if (Tr::kStages - 1 < n_tiles) ld.fetch(Tr::kStages - 1);  // one tile ahead of its issue

  // Q as A fragments, loaded while the first tiles are in flight: row g = query head
  // kv_head * group + row_begin + g (zero for g >= n_rows), k = dims.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  uint32_t qf[DecodeTraits<HeadDim>::kKSteps][2];
  const bool q_ok = g < item.n_rows;
  const uint32_t* q_row = reinterpret_cast<const uint32_t*>(
      a.q + (size_t(item.seq) * a.n_heads + size_t(item.kv_head) * group + item.row_begin + (q_ok ? g : 0)) * HeadDim);
#pragma unroll
  for (int ks = 0; ks < DecodeTraits<HeadDim>::kKSteps; ++ks) {
    qf[ks][0] = q_ok ? __ldg(q_row + 8 * ks + t4) : 0u;
    qf[ks][1] = q_ok ? __ldg(q_row + 8 * ks + 4 + t4) : 0u;
  }
  const float scale_log2 = a.scale * kLog2e;

  float o[DecodeTraits<HeadDim>::kDimTiles][4] = {};
  float m = -INFINITY, l = 0.0f;
  int stage = 0;  // stage holding tile t
  for (int t = 0; t < n_tiles; ++t) {
    cp_async_wait<Tr::kStages - 2>();
    __syncthreads();  // tile t is visible to all warps, and all are done with tile t - 1's stage
    const int t_next = t + Tr::kStages - 1;
    const int fill = stage == 0 ? Tr::kStages - 1 : stage - 1;  // tile t - 1's stage
    if (t_next < n_tiles) {
      ld.issue(smem0 + fill * Tr::kStageBytes, t_next);
      if (t_next + 1 < n_tiles) ld.fetch(t_next + 1);
    }
    cp_async_commit();  // possibly empty: keeps wait_group's count uniform
    const int tok0 = t * kTileTokens + warp * 16;
    if constexpr (Fp8) {
      if (tok0 < n_tok) {
        const uint8_t* st = smem + Tr::kBase + stage * Tr::kStageBytes;
        widen_warp_rows<HeadDim>(st, smem);
        __syncwarp();  // the warp's widened rows are visible to all its lanes
        const float* k_sc = reinterpret_cast<const float*>(st + 2 * Fp8DecodeTraits<HeadDim>::kTileBytes);
        attend_tile<HeadDim, true>(smem_u32(smem), smem_u32(smem) + DecodeTraits<HeadDim>::kTileBytes, qf, o, m, l,
                                   tok0, n_tok, scale_log2, sc, k_sc, k_sc + kTileTokens);
      }
    } else if (tok0 < n_tok) {
      const uint32_t k_tile = smem0 + stage * Tr::kStageBytes;
      attend_tile<HeadDim>(k_tile, k_tile + DecodeTraits<HeadDim>::kTileBytes, qf, o, m, l, tok0, n_tok, scale_log2,
                           sc);
    }
    stage = stage + 1 == Tr::kStages ? 0 : stage + 1;
  }
  cp_async_wait<0>();
  __syncthreads();  // the stages are free for the epilogue
  write_item<HeadDim>(a, item, group, smem, o, m, l);
}

template <int HeadDim, int PageSize, bool Fp8>
__device__ __forceinline__ void run_work_item(const DecodeAttentionArgs& a, const DecodeWorkItem item, uint8_t* smem,
                                              bool pre_wait);

template <int HeadDim, int PageSize, bool Fp8>
__global__ void __launch_bounds__(kThreads, 2) decode_attention_kernel(const DecodeAttentionArgs a) {
  // bf16: [kStages][K tile, V tile] bf16, swizzled. FP8: the widened [K tile, V tile] bf16, then
  // [kStages][K codes, V codes, K scales, V scales] (Fp8DecodeTraits).
  extern __shared__ __align__(128) uint8_t smem[];

  // A resident grid walks the plan: item i runs on CTA i % gridDim.x (items come longest first).
  // The plan is read before the wait (run_item says why); a CTA waits inside its first item.
  const int n_items = *a.n_items;
  const DecodeWorkItem* items = a.items + (a.item_offset != nullptr ? *a.item_offset : 0);
  if (int(blockIdx.x) >= n_items) return wait_previous_kernel();
  for (int i = int(blockIdx.x); i < n_items; i += int(gridDim.x)) {
    if (i != int(blockIdx.x)) __syncthreads();  // the last item's epilogue is done with the stages
    run_work_item<HeadDim, PageSize, Fp8>(a, items[i], smem, i == int(blockIdx.x));
  }
}

template <int HeadDim, int PageSize, bool Fp8>
__device__ __forceinline__ void run_work_item(const DecodeAttentionArgs& a, const DecodeWorkItem item, uint8_t* smem,
                                              bool pre_wait) {
  using Tr = DecodeTraits<HeadDim>;
  const int group = a.n_heads / a.n_kv_heads;
  const ItemView iv = make_view(a, item);
  if (a.token_reads != nullptr && threadIdx.x == 0 && item.n_rows == group && iv.n_tok > 0)
    atomicAdd(a.token_reads + item.seq, (unsigned long long)iv.n_tok);

  ScoreSink sc{item.score, nullptr, a.score_stride, item.begin * item.unit, item.n_rows, 1.0f / float(item.n_rows)};
  if (item.score == ScoreKind::kRowToken)
    sc.row = a.scores + (size_t(item.seq) * a.n_heads + size_t(item.kv_head) * group + item.row_begin) * a.score_stride;
  else if (item.score != ScoreKind::kNone)
    sc.row = a.scores + (size_t(item.seq) * a.n_kv_heads + item.kv_head) * a.score_stride;

  const int64_t head_rows = int64_t(item.kv_head) * PageSize * HeadDim;
  const int64_t page_stride = int64_t(a.n_kv_heads) * PageSize * HeadDim;
  if constexpr (Fp8) {
    using F8 = Fp8DecodeTraits<HeadDim>;
    const int row0 = threadIdx.x / F8::kChunksPerRow, chunk = threadIdx.x % F8::kChunksPerRow;
    const int64_t head_scales = int64_t(item.kv_head) * PageSize, scale_stride = int64_t(a.n_kv_heads) * PageSize;
    const uint8_t *k = a.k8_pool + head_rows, *v = a.v8_pool + head_rows;
    const float *ks = a.k_scale + head_scales, *vs = a.v_scale + head_scales;
    // A page path needs passes within one page: not so for 16-token pages at head_dim 64 (32 rows
    // a pass), which take the gather path.
    if constexpr (PageSize % F8::kRowsPerPass == 0) {
      if (item.unit == PageSize) {
        Fp8PageLoader<HeadDim, PageSize> ld{k, v, ks, vs, page_stride, scale_stride, iv, row0, chunk, {}};
        return run_item<HeadDim, true>(a, item, ld, sc, smem, pre_wait);
      }
    }
    Fp8GatherLoader<HeadDim, PageSize> ld{k, v, ks, vs, page_stride, scale_stride, iv, row0, chunk, {}, {}};
    run_item<HeadDim, true>(a, item, ld, sc, smem, pre_wait);
  } else {
    const int row0 = threadIdx.x / Tr::kChunksPerRow, chunk = threadIdx.x % Tr::kChunksPerRow;
    if (item.unit == PageSize) {
      PageLoader<HeadDim, PageSize> ld{a.k_pool + head_rows, a.v_pool + head_rows, page_stride, iv, row0, chunk, {}};
      run_item<HeadDim, false>(a, item, ld, sc, smem, pre_wait);
    } else {
      GatherLoader<HeadDim, PageSize> ld{a.k_pool + head_rows, a.v_pool + head_rows, page_stride, iv, row0, chunk, {}};
      run_item<HeadDim, false>(a, item, ld, sc, smem, pre_wait);
    }
  }
}

// ------------------------------------------------------------------------------ launchers

// The attention kernel for one (head_dim, page_size), its shared-memory limit raised once per
// device.
template <int HeadDim, int PageSize, bool Fp8>
auto attention_kernel() {
  auto* kernel = decode_attention_kernel<HeadDim, PageSize, Fp8>;
  static uint64_t configured = 0;
  if (first_on_device(configured)) {
    LY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       StageTraits<HeadDim, Fp8>::kSmemBytes));
    LY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       int(cudaSharedmemCarveoutMaxShared)));
  }
  return kernel;
}

template <int HeadDim, int PageSize, bool Fp8>
int ctas_per_sm();

// At most one resident wave of CTAs (ctas_per_sm x SMs): a plan with more items loops over them
// instead of launching CTAs that only find no item.
template <int HeadDim, int PageSize, bool Fp8>
void launch_decode(const DecodeAttentionArgs& a, cudaStream_t stream) {
  static const int resident = ctas_per_sm<HeadDim, PageSize, Fp8>() * device_info().sm_count;
  if (a.max_items > 0)
    launch_pdl(attention_kernel<HeadDim, PageSize, Fp8>(), std::min(a.max_items, resident), kThreads,
               StageTraits<HeadDim, Fp8>::kSmemBytes, stream, a);
  LY_CUDA_CHECK_LAUNCH();
  decode_merge(a, stream);
}

template <int HeadDim, int PageSize, bool Fp8>
int ctas_per_sm() {
  int n = 0;
  LY_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_kernel<HeadDim, PageSize, Fp8>(), kThreads,
                                                              StageTraits<HeadDim, Fp8>::kSmemBytes));
  return n;
}

// Small, closed dispatch over (head_dim, page_size); check_decode_args has rejected the rest.
// f receives both as std::integral_constant.
template <int HeadDim, typename F>
auto with_page_size(int page_size, F&& f) {
  using std::integral_constant;
  switch (page_size) {
    case 16: return f(integral_constant<int, HeadDim>{}, integral_constant<int, 16>{});
    case 32: return f(integral_constant<int, HeadDim>{}, integral_constant<int, 32>{});
    case 64: return f(integral_constant<int, HeadDim>{}, integral_constant<int, 64>{});
    default: return f(integral_constant<int, HeadDim>{}, integral_constant<int, 128>{});
  }
}
template <typename F>
auto with_variant(int head_dim, int page_size, F&& f) {
  if (head_dim == 64) return with_page_size<64>(page_size, f);
  return with_page_size<128>(page_size, f);
}

}  // namespace

void decode_attention(const DecodeAttentionArgs& a, cudaStream_t stream) {
  check_decode_args(a);
  with_variant(a.head_dim, a.page_size, [&](auto d, auto p) {
    if (a.k8_pool != nullptr) launch_decode<d.value, p.value, true>(a, stream);
    else launch_decode<d.value, p.value, false>(a, stream);
  });
}

int decode_attention_ctas_per_sm(int head_dim, int page_size) {
  const bool supported = (head_dim == 64 || head_dim == 128) &&
                         (page_size == 16 || page_size == 32 || page_size == 64 || page_size == 128);
  if (!supported) {  // the same "unsupported ..." message a launch would give
    DecodeAttentionArgs probe{};
    probe.head_dim = head_dim;
    probe.page_size = page_size;
    check_decode_args(probe);
  }
  return with_variant(head_dim, page_size, [](auto d, auto p) { return ctas_per_sm<d.value, p.value, false>(); });
}

}  // namespace lychee::cuda
