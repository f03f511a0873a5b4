// Split-KV paged decode attention for Hopper (sm_90a): kernels, launchers and dispatch.
// Design, byte count, napkin math and lab notes: docs/kernels/decode-attention.md.
//
// Main kernel: one CTA (4 warps) per work item = an entry range of one head's list (dense pages,
// selected pages, selected tokens or a window; all of a KV head's query rows or one). The CTA
// streams that range through shared memory in tiles of 64 tokens (K and V, 16-byte cp.async.cg,
// XOR-swizzled, kStages deep) and every warp attends to its own 16 tokens of each tile with
// mma.sync m16n8k16: S = Q K^T with the group's query heads as the 16 rows (rows >= group are
// zero; a verification step's rows_per_seq positions stack their groups in the same rows, up to
// 8 in the narrow variant and 16 in the Wide one, each row masked at its causal end), an online
// softmax in the log2 domain, O += P V with P taken straight from S's
// accumulators. The 4 warps' (m, l, O) are merged through shared memory at the end; the item
// writes `out` (bf16) when it is its head's only item, else a normalised partial O and its LSE.
// Retrieval items also write their page (or token) scores from the same S accumulators: no
// second read of K. The merge of the partials is decode_merge.cu. Pieces both element types
// share (item view, fused scoring, online softmax) are in decode_attention_common.cuh; the FP8
// KV cache's reader (codes widened in registers, f16 tensor cores) in decode_attention_fp8.cuh.
#include "cuda/kernels/decode_attention.h"
#include "cuda/kernels/decode_attention_common.cuh"
#include "cuda/kernels/decode_attention_fp8.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

namespace lychee::cuda {
namespace {


// The stage geometry of either element type: the bf16 stages (DecodeTraits) or the FP8 ones
// (Fp8DecodeTraits: codes and scales).
template <int HeadDim, bool Fp8>
struct StageTraits {
  static constexpr int kStages = DecodeTraits<HeadDim>::kStages;
  static constexpr int kStageBytes = DecodeTraits<HeadDim>::kStageBytes;
  static constexpr int kSmemBytes = DecodeTraits<HeadDim>::kSmemBytes;
};
template <int HeadDim>
struct StageTraits<HeadDim, true> {
  static constexpr int kStages = Fp8DecodeTraits<HeadDim>::kStages;
  static constexpr int kStageBytes = Fp8DecodeTraits<HeadDim>::kStageBytes;
  static constexpr int kSmemBytes = Fp8DecodeTraits<HeadDim>::kSmemBytes;
};

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

// One warp, one tile: its 16 tokens [tok0, tok0 + 16) against the group's queries. (m[h], l[h]) are
// the running max (log2 domain, scaled) and sum of row g + 8 h, g = lane / 4; o holds rows g (c0,
// c1) and g + 8 (c2, c3): zero padding but in the Wide variant (a group x rows_per_seq of 9..16
// rows; qf[ks][2..3] are those rows' fragments). lim[h]: row g + 8 h sees tokens below it.
template <int HeadDim, bool Wide>
__device__ __forceinline__ void attend_tile(uint32_t k_tile, uint32_t v_tile,
                                            const uint32_t (&qf)[DecodeTraits<HeadDim>::kKSteps][4],
                                            float (&o)[DecodeTraits<HeadDim>::kDimTiles][4], float (&m)[2],
                                            float (&l)[2], int tok0, int n_tok, const int (&lim)[2],
                                            float scale_log2, const ScoreSink& sc) {
  using Tr = DecodeTraits<HeadDim>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r8 = lane & 7;

  // S = Q K^T. ldmatrix matrices: (tokens 0-7 | 8-15 of the warp) x (dims lo | hi of the k-step).
  const uint32_t k_row = k_tile + (warp * 16 + ((lane >> 4) << 3) + r8) * Tr::kRowBytes;
  const int k_hi = (lane >> 3) & 1;
  float s[2][4] = {};
#pragma unroll
  for (int ks = 0; ks < Tr::kKSteps; ++ks) {
    uint32_t b[4];
    ldmatrix_x4(b, k_row + (((2 * ks + k_hi) ^ r8) << 4));
    const uint32_t a1 = Wide ? qf[ks][2] : 0u, a3 = Wide ? qf[ks][3] : 0u;
    mma_bf16(s[0], qf[ks][0], a1, qf[ks][1], a3, b[0], b[1]);
    mma_bf16(s[1], qf[ks][0], a1, qf[ks][1], a3, b[2], b[3]);
  }
  score_tile(sc, s, tok0, n_tok);  // R = 1 items only (check_decode_args): rows 0..7
  float p[2][2], p_hi[2][2] = {};
  const float alpha = online_softmax<0>(s, tok0, lim[0], scale_log2, m[0], l[0], p);
  const float alpha_hi = Wide ? online_softmax<1>(s, tok0, lim[1], scale_log2, m[1], l[1], p_hi) : 1.0f;
#pragma unroll
  for (int j = 0; j < Tr::kDimTiles; ++j) {
    o[j][0] *= alpha;
    o[j][1] *= alpha;
    if constexpr (Wide) {
      o[j][2] *= alpha_hi;
      o[j][3] *= alpha_hi;
    }
  }

  // O += P V. S's accumulators are P's A fragment (k = the warp's 16 tokens). ldmatrix.trans
  // matrices: (tokens 0-7 | 8-15) x (dims of n-tile 2 np | 2 np + 1).
  const uint32_t pa0 = pack_bf16x2(p[0][0], p[0][1]), pa2 = pack_bf16x2(p[1][0], p[1][1]);
  const uint32_t pa1 = Wide ? pack_bf16x2(p_hi[0][0], p_hi[0][1]) : 0u;
  const uint32_t pa3 = Wide ? pack_bf16x2(p_hi[1][0], p_hi[1][1]) : 0u;
  const uint32_t v_row = v_tile + (warp * 16 + (((lane >> 3) & 1) << 3) + r8) * Tr::kRowBytes;
  const int v_hi = lane >> 4;
#pragma unroll
  for (int np = 0; np < Tr::kDimTiles / 2; ++np) {
    uint32_t b[4];
    ldmatrix_x4_trans(b, v_row + (((2 * np + v_hi) ^ r8) << 4));
    mma_bf16(o[2 * np], pa0, pa1, pa2, pa3, b[0], b[1]);
    mma_bf16(o[2 * np + 1], pa0, pa1, pa2, pa3, b[2], b[3]);
  }
}

// Merges the 4 warps' states and writes the item's result: bf16 `out` rows when it is its head's
// only item, else the normalised partial O and the natural-log LSE of its slot.
// kPairedDims (the FP8 reader): o[2 c + j][i] holds dim 16 c + 4 t4 + 2 i + j, in units of o_scale;
// else o[j][i] holds dim 8 j + 2 t4 + i (and o[j][2 + i] row g + 8's in the Wide variant).
// Tile row j is new position pos_begin + j / n_rows of the sequence, query row j % n_rows of the item
// (Rows false, a plain decode step's R = 1: position 0, query row j).
template <int HeadDim, bool kPairedDims = false, bool Wide = false, bool Rows = false>
__device__ __forceinline__ void write_item(const DecodeAttentionArgs& a, const DecodeWorkItem& item,
                                           int group, uint8_t* smem,
                                           const float (&o)[DecodeTraits<HeadDim>::kDimTiles][4], const float (&m)[2],
                                           float (&l)[2], float o_scale = 1.0f) {
  using Tr = DecodeTraits<HeadDim>;
  constexpr int kHalves = Wide ? 2 : 1;
  __shared__ float s_m[kWarps][kMaxRows], s_l[kWarps][kMaxRows], s_inv[kMaxRows], s_lse[kMaxRows];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    if (t4 == 0) {
      s_m[warp][g + 8 * h] = m[h];
      s_l[warp][g + 8 * h] = l[h];
    }
  }
  __syncthreads();
  float m_max[2] = {-INFINITY, -INFINITY}, f[2];
  float* s_o = reinterpret_cast<float*>(smem);  // [kWarps][kMaxRows][kOutStride] f32
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m_max[h] = fmaxf(m_max[h], s_m[w][g + 8 * h]);
    // A warp that saw no valid token has m == -inf and contributes nothing (no -inf - -inf).
    f[h] = m[h] == -INFINITY ? 0.0f : ex2(m[h] - m_max[h]);
  }
  if constexpr (kPairedDims) {
    const float fs = f[0] * o_scale;
#pragma unroll
    for (int c = 0; c < Tr::kDimTiles / 2; ++c)
      *reinterpret_cast<float4*>(s_o + (warp * kMaxRows + g) * Tr::kOutStride + 16 * c + 4 * t4) =
          make_float4(o[2 * c][0] * fs, o[2 * c + 1][0] * fs, o[2 * c][1] * fs, o[2 * c + 1][1] * fs);
  } else {
#pragma unroll
    for (int h = 0; h < kHalves; ++h)
#pragma unroll
      for (int j = 0; j < Tr::kDimTiles; ++j)
        *reinterpret_cast<float2*>(s_o + (warp * kMaxRows + g + 8 * h) * Tr::kOutStride + 8 * j + 2 * t4) =
            make_float2(o[j][2 * h] * f[h], o[j][2 * h + 1] * f[h]);
  }
  if (warp == 0 && t4 == 0) {
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      const int row = g + 8 * h;
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w)
        if (s_m[w][row] != -INFINITY) sum += s_l[w][row] * ex2(s_m[w][row] - m_max[h]);
      s_inv[row] = sum > 0.0f ? 1.0f / sum : 0.0f;
      s_lse[row] = sum > 0.0f ? (m_max[h] + __log2f(sum)) * kLn2 : -INFINITY;
    }
  }
  __syncthreads();

  constexpr int kVec = HeadDim / 4;  // 4 dims per thread and step
  // R = 1 (Rows false) as a constant: no position arithmetic in a plain decode step (the plan's
  // R = 1 items have pos_begin 0 and n_pos 0).
  const int n_rows = item.n_rows, row_begin = item.row_begin, R = Rows ? a.rows_per_seq : 1;
  const int n_pos = Rows ? (item.n_pos > 0 ? item.n_pos : R) : 1, p0 = Rows ? int(item.pos_begin) : 0;
  const int slot_rows = group * R;   // a slot's rows: every position's group
  for (int idx = threadIdx.x; idx < n_rows * n_pos * kVec; idx += kThreads) {
    const int j = idx / kVec, c = (idx % kVec) * 4;
    const int pos = Rows ? p0 + j / n_rows : 0, r = row_begin + (Rows ? j % n_rows : j);
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float4 x = *reinterpret_cast<const float4*>(s_o + (w * kMaxRows + j) * Tr::kOutStride + c);
      acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
    }
    const float inv = s_inv[j];
    acc.x *= inv, acc.y *= inv, acc.z *= inv, acc.w *= inv;
    if (item.slot < 0) {
      const size_t row = (size_t(item.seq) * R + pos) * a.n_heads + size_t(item.kv_head) * group + r;
      *reinterpret_cast<uint2*>(a.out + row * HeadDim + c) = pack_bf16x4(acc);
    } else {
      *reinterpret_cast<float4*>(a.partial_o + (size_t(item.slot) * slot_rows + pos * group + r) * HeadDim + c) = acc;
    }
  }
  if (item.slot >= 0 && int(threadIdx.x) < n_rows * n_pos) {
    const int j = threadIdx.x, pos = Rows ? p0 + j / n_rows : 0, r = row_begin + (Rows ? j % n_rows : j);
    a.partial_lse[size_t(item.slot) * slot_rows + pos * group + r] = s_lse[j];
  }
}

// The pipeline over one item's tiles with either loader, then the epilogue. pre_wait (a CTA's
// first item): the grid has not yet waited for the kernel before it. Only the previous kernel
// writes what a decode step's attention reads (q, and K/V of the token it appended, which lies in
// the item's last tile when the item reads the sequence's last token); the plan, lists, lengths,
// block table and older K/V come from earlier work (wait_previous_kernel). So the first item's
// tiles before that one are copied in before the wait, hiding their lookups and their latency
// behind the previous kernel's tail. With rows_per_seq R > 1 (dense items) the step appended the
// last R tokens, which may span two tiles and two items: only tiles wholly before them go early.
// Rows: R > 1 (a verification step); false compiles R = 1 in, without the per-row positions and
// causal ends (issue 37: the R-generic kernel made the plain step 8.20 -> 8.30 ms, H200, Full b1
// 128K), the same arithmetic.
template <int HeadDim, bool Fp8, bool Wide, bool Rows, typename Loader>
__device__ __forceinline__ void run_item(const DecodeAttentionArgs& a, const DecodeWorkItem& item, Loader& ld,
                                         const ScoreSink& sc, uint8_t* smem, bool pre_wait) {
  static_assert(!(Fp8 && Wide), "the FP8 reader serves 8 rows");
  static_assert(!(Fp8 && Rows) && !(Wide && !Rows), "FP8 pages take R = 1 only; 9..16 rows come from R > 1");
  using Tr = StageTraits<HeadDim, Fp8>;
  const int group = a.n_heads / a.n_kv_heads, R = Rows ? a.rows_per_seq : 1;
  const int n_tok = ld.iv.n_tok;
  const int n_tiles = n_tok > 0 ? (n_tok + kTileTokens - 1) / kTileTokens : 0;
  const int pos0 = item.begin * item.unit;  // kDense: the position of the item's token 0
  const int new0 = ld.iv.len - R - pos0;    // R > 1: item-relative first appended token

  const uint32_t smem0 = smem_u32(smem);  // the stages
  // Commit groups stay one per prologue tile, in tile order, whichever side of the wait a tile is
  // issued on (the main loop's wait_group counts rely on it).
  const int early = !pre_wait  ? 0
                    : R == 1   ? (ld.iv.has_last ? n_tiles - 1 : n_tiles)
                    : new0 >= n_tok ? n_tiles
                                    : max(0, new0) / kTileTokens;
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

  // Q as A fragments, loaded while the first tiles are in flight: tile row j = g + 8 h (h = 1: the
  // Wide variant) is query head kv_head * group + row_begin + j % n_rows at new position
  // pos_begin + j / n_rows (zero for j >= n_rows x the item's positions), k = dims (FP8:
  // Fp8Query's f16 layout). lim[h]: the row's causal end in item tokens (R > 1: dense items),
  // n_tok otherwise.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  uint32_t qf[DecodeTraits<HeadDim>::kKSteps][4];
  Fp8Query<HeadDim> q8;
  int lim[2] = {n_tok, n_tok};
  const bf16* q_rows[2];
  bool q_ok[2];
#pragma unroll
  for (int h = 0; h < (Wide ? 2 : 1); ++h) {
    const int j = g + 8 * h, n_rows = item.n_rows, n_pos = Rows ? (item.n_pos > 0 ? item.n_pos : R) : 1;
    q_ok[h] = j < n_rows * n_pos;
    const int pos = Rows && q_ok[h] ? item.pos_begin + j / n_rows : 0;
    const int r = !q_ok[h] ? 0 : Rows ? j % n_rows : j;
    q_rows[h] = a.q + ((size_t(item.seq) * R + pos) * a.n_heads + size_t(item.kv_head) * group + item.row_begin + r) *
                          HeadDim;
    if (Rows && R > 1 && q_ok[h]) lim[h] = min(n_tok, max(0, new0 + pos + 1));
  }
  if constexpr (Fp8) {
    q8.load(q_rows[0], q_ok[0]);
  } else {
#pragma unroll
    for (int h = 0; h < (Wide ? 2 : 1); ++h) {
      const uint32_t* q_words = reinterpret_cast<const uint32_t*>(q_rows[h]);
#pragma unroll
      for (int ks = 0; ks < DecodeTraits<HeadDim>::kKSteps; ++ks) {
        qf[ks][2 * h] = q_ok[h] ? __ldg(q_words + 8 * ks + t4) : 0u;
        qf[ks][2 * h + 1] = q_ok[h] ? __ldg(q_words + 8 * ks + 4 + t4) : 0u;
      }
    }
  }
  const float scale_log2 = a.scale * kLog2e;

  float o[DecodeTraits<HeadDim>::kDimTiles][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o_scale = 1.0f;  // FP8: o is in units of o_scale (attend_tile_fp8)
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
      if (tok0 < n_tok)
        attend_tile_fp8<HeadDim>(smem + stage * Tr::kStageBytes, smem0 + stage * Tr::kStageBytes, q8, o, m[0], l[0],
                                 o_scale, tok0, n_tok, scale_log2, sc);
    } else if (tok0 < n_tok) {
      const uint32_t k_tile = smem0 + stage * Tr::kStageBytes;
      attend_tile<HeadDim, Wide>(k_tile, k_tile + DecodeTraits<HeadDim>::kTileBytes, qf, o, m, l, tok0, n_tok, lim,
                                 scale_log2, sc);
    }
    stage = stage + 1 == Tr::kStages ? 0 : stage + 1;
  }
  cp_async_wait<0>();
  __syncthreads();  // the stages are free for the epilogue
  write_item<HeadDim, Fp8, Wide, Rows>(a, item, group, smem, o, m, l, o_scale);
}

template <int HeadDim, int PageSize, bool Fp8, bool Wide, bool Rows>
__device__ __forceinline__ void run_work_item(const DecodeAttentionArgs& a, const DecodeWorkItem item, uint8_t* smem,
                                              bool pre_wait);

// Wide: the 16-row variant (a KV head's group x rows_per_seq of 9..16 rows, bf16 KV). Rows:
// rows_per_seq > 1 (run_item); the instances are (Fp8, R = 1), (bf16, R = 1), (bf16, R > 1) and
// (bf16, Wide, R > 1) per head dim and page size.
template <int HeadDim, int PageSize, bool Fp8, bool Wide, bool Rows>
__global__ void __launch_bounds__(kThreads, 2) decode_attention_kernel(const DecodeAttentionArgs a) {
  // bf16: [kStages][K tile, V tile] bf16, swizzled. FP8: [kStages][K codes, V codes, K scales,
  // V scales] (Fp8DecodeTraits).
  extern __shared__ __align__(128) uint8_t smem[];

  // A resident grid walks the plan: item i runs on CTA i % gridDim.x (items come longest first).
  // The plan is read before the wait (run_item says why); a CTA waits inside its first item.
  const int n_items = *a.n_items;
  const DecodeWorkItem* items = a.items + (a.item_offset != nullptr ? *a.item_offset : 0);
  if (int(blockIdx.x) >= n_items) return wait_previous_kernel();
  for (int i = int(blockIdx.x); i < n_items; i += int(gridDim.x)) {
    if (i != int(blockIdx.x)) __syncthreads();  // the last item's epilogue is done with the stages
    run_work_item<HeadDim, PageSize, Fp8, Wide, Rows>(a, items[i], smem, i == int(blockIdx.x));
  }
}

template <int HeadDim, int PageSize, bool Fp8, bool Wide, bool Rows>
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
        return run_item<HeadDim, true, false, false>(a, item, ld, sc, smem, pre_wait);
      }
    }
    Fp8GatherLoader<HeadDim, PageSize> ld{k, v, ks, vs, page_stride, scale_stride, iv, row0, chunk, {}, {}};
    run_item<HeadDim, true, false, false>(a, item, ld, sc, smem, pre_wait);
  } else {
    const int row0 = threadIdx.x / Tr::kChunksPerRow, chunk = threadIdx.x % Tr::kChunksPerRow;
    if (item.unit == PageSize) {
      PageLoader<HeadDim, PageSize> ld{a.k_pool + head_rows, a.v_pool + head_rows, page_stride, iv, row0, chunk, {}};
      run_item<HeadDim, false, Wide, Rows>(a, item, ld, sc, smem, pre_wait);
    } else {
      GatherLoader<HeadDim, PageSize> ld{a.k_pool + head_rows, a.v_pool + head_rows, page_stride, iv, row0, chunk, {}};
      run_item<HeadDim, false, Wide, Rows>(a, item, ld, sc, smem, pre_wait);
    }
  }
}

// ------------------------------------------------------------------------------ launchers

// The attention kernel for one (head_dim, page_size), its shared-memory limit raised once per
// device.
template <int HeadDim, int PageSize, bool Fp8, bool Wide = false, bool Rows = false>
auto attention_kernel() {
  auto* kernel = decode_attention_kernel<HeadDim, PageSize, Fp8, Wide, Rows>;
  static uint64_t configured = 0;
  if (first_on_device(configured)) {
    LY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       StageTraits<HeadDim, Fp8>::kSmemBytes));
    LY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       int(cudaSharedmemCarveoutMaxShared)));
  }
  return kernel;
}

template <int HeadDim, int PageSize, bool Fp8, bool Wide = false, bool Rows = false>
int ctas_per_sm();

// At most one resident wave of CTAs (ctas_per_sm x SMs): a plan with more items loops over them
// instead of launching CTAs that only find no item.
template <int HeadDim, int PageSize, bool Fp8, bool Wide, bool Rows>
void launch_decode(const DecodeAttentionArgs& a, cudaStream_t stream) {
  static const int resident = ctas_per_sm<HeadDim, PageSize, Fp8, Wide, Rows>() * device_info().sm_count;
  if (a.max_items > 0)
    launch_pdl(attention_kernel<HeadDim, PageSize, Fp8, Wide, Rows>(), std::min(a.max_items, resident), kThreads,
               StageTraits<HeadDim, Fp8>::kSmemBytes, stream, a);
  LY_CUDA_CHECK_LAUNCH();
  decode_merge(a, stream);
}

template <int HeadDim, int PageSize, bool Fp8, bool Wide, bool Rows>
int ctas_per_sm() {
  int n = 0;
  LY_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_kernel<HeadDim, PageSize, Fp8, Wide, Rows>(), kThreads,
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
  const int group = a.n_heads / a.n_kv_heads;
  with_variant(a.head_dim, a.page_size, [&](auto d, auto p) {
    // R = 1 (every plain decode step; FP8 pages always) takes the Rows-false kernels; group <= 8
    // (check_decode_args), so only R > 1 needs the 16-row variant.
    if (a.k8_pool != nullptr) launch_decode<d.value, p.value, true, false, false>(a, stream);
    else if (a.rows_per_seq == 1) launch_decode<d.value, p.value, false, false, false>(a, stream);
    else if (group * decode_positions_per_item(group, a.rows_per_seq) > kMaxGroup)
      launch_decode<d.value, p.value, false, true, true>(a, stream);
    else launch_decode<d.value, p.value, false, false, true>(a, stream);
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
