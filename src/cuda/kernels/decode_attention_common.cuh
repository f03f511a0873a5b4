// Shared pieces of the split-KV decode attention kernels (decode_attention.cu): the CTA shape, the
// bf16 tile geometry, an item's view of its entry list, and the per-tile steps both element types
// take on S's accumulators (fused scoring, the online softmax). Included by decode_attention.cu
// only (one translation unit, anonymous namespace); decode_attention_fp8.cuh is the FP8 reader.
#pragma once

#include "cuda/kernels/decode_attention.h"
#include "cuda/common/ptx.cuh"

#include <cstdint>

namespace lychee::cuda {
namespace {

constexpr int kThreads = 128;     // 4 warps per CTA
constexpr int kWarps = kThreads / 32;
constexpr int kTileTokens = 64;   // tokens per pipeline stage: 16 per warp, one mma k-step of P V
constexpr int kMaxGroup = 8;      // query heads per KV head: mma rows 0..7, rows 8..15 are padding
constexpr int kMaxRows = kDecodeMaxTileRows;  // the 16-row variant (verification): rows 8..15 used too
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
  static_assert(kWarps * kMaxRows * kOutStride * 4 <= kSmemBytes, "epilogue reuses the stages");
};

// FP8 KV (DecodeAttentionArgs::k8_pool): a stage holds the tile's K codes, V codes, K scales and
// V scales ([64][HeadDim] e4m3 twice, unswizzled: the widening reads them 16 bytes a lane in
// order, conflict-free; then [64] f32 twice). Before attending, each warp widens its 16 rows of K
// and V into one bf16 tile pair laid out as the bf16 kernel's stage (swizzled), so attend_tile's
// ldmatrix / mma path is the bf16 one; the scales are applied to the scalars there. Half the

using namespace ptx;

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

// Where a scoring item writes (fused scoring of retrieval heads; see ScoreKind).
struct ScoreSink {
  ScoreKind kind;
  float* row;       // group kinds: the (seq, kv head) row; kRowToken: the row of the item's first query row
  int stride;       // floats between rows (kRowToken)
  int pos0;         // position of the item's token 0
  int n_rows;
  float inv_rows;   // 1 / n_rows: the group mean
};

// Fused scoring of one warp's tile from its logits s (row g = lane / 4, tokens tok0 + 8 n + 2 t4 + i),
// before the softmax scale. The sum over the group's rows (rows past n_rows have a zero query)
// lies in the lanes of one t4 column (lane bits 2..4).
__device__ __forceinline__ void score_tile(const ScoreSink& sc, const float (&s)[2][4], int tok0, int n_tok) {
  const int lane = threadIdx.x & 31, t4 = lane & 3;
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
}

// The online softmax of row g + 8 Half over this thread's 4 logits s[n][2 Half + i] (tokens tok0 +
// 8n + 2 t4 + i; the row's 4 threads are one quad): they become the scaled scores, masked from
// token `lim` on (the item's length, or a verification row's causal end), p their exp2 against
// the new running max; (m, l) are updated. Returns alpha, the factor the running output must be
// multiplied by.
template <int Half = 0>
__device__ __forceinline__ float online_softmax(float (&s)[2][4], int tok0, int lim, float scale_log2, float& m,
                                                float& l, float (&p)[2][2]) {
  const int t4 = threadIdx.x & 3;
  float mx = -INFINITY;
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int tok = tok0 + 8 * n + 2 * t4 + i;
      float& x = s[n][2 * Half + i];
      x = tok < lim ? x * scale_log2 : -INFINITY;
      mx = fmaxf(mx, x);
    }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float m_new = fmaxf(m, mx);
  const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // nothing valid yet: keep exp2 off NaN
  const float alpha = ex2(m - m_use);                     // m == -inf gives 0; o and l are 0 then
  float p_sum = 0.0f;
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      p[n][i] = ex2(s[n][2 * Half + i] - m_use);
      p_sum += p[n][i];
    }
  l = l * alpha + p_sum;
  m = m_new;
  return alpha;
}

}  // namespace
}  // namespace lychee::cuda
