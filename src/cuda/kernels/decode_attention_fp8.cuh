// The FP8 KV cache's reader for the decode attention kernel (decode_attention.cu; included there
// only): stage geometry, loaders over e4m3 codes and their per-token scales, and the per-tile
// attention with the codes widened in registers.
//
// Why in registers: widening a tile in shared memory (the first version: e4m3 -> bf16 stores, then
// the bf16 ldmatrix path) spends per tile 16 shared stores, 8 loads and 192 conversions a thread
// beside the mma work, and measured 59-86% of copy bandwidth at >= 32K on the H100
// (docs/results/gpu/kv8_h100). Here the codes go from shared memory straight into the fragments:
// - S = Q K^T on f16 tensor cores (mma m16n8k16 f16, f32 accumulate): e4m3 -> f16 is one exact
//   cvt per two codes, while e4m3 -> bf16 has no instruction. Q K^T sums over dims, so Q and K may
//   share any permutation of them: lane t4 takes dims [t4 d/4, (t4 + 1) d/4) of its row, k-step ks
//   the 4 dims t4 d/4 + 4 ks + 0..3 (its fragment's k = 2 t4, 2 t4 + 1, 2 t4 + 8, 2 t4 + 9), so a
//   lane reads its K codes with d/64 16-byte loads per row and no shuffle. Q is bf16: scaled per row
//   by a power of two to max |q| <= 2^14 it converts to f16 exactly (its components smaller than
//   max |q| 2^-28 become f16 subnormals: below the bf16 rounding of the larger ones).
// - O += P V: ldmatrix.trans over the codes as 16-bit pairs gives a lane tokens 2 t4, 2 t4 + 1 of
//   dims 2 g, 2 g + 1 in one register; a byte permute splits it into the B fragments of two n-tiles,
//   dims 16 c + 2 g (even) and 16 c + 2 g + 1 (odd), so o[2 c + j] column 2 t4 + i holds dim
//   16 c + 4 t4 + 2 i + j (write_item's kPairedDims layout).
// - Scales on scalars: logit = s_k[t] (q . code_k[t]); V's scale goes into P, normalised per warp
//   tile by a power of two c >= the tile's 16 scales so that P' = p s_v / c lies in [0, 1] for f16:
//   O is kept in units of the last tile's c (o_scale), rescaled with the softmax's alpha at no cost.
//   The row sum l takes p alone, in f32.
// - Shared memory: no widened tile, so 5 stages of 16.5 KiB at d = 128 (11 of 8.5 KiB at d = 64)
//   in the same 96 KiB as bf16: 4 tiles in flight per CTA, two CTAs per SM.
#pragma once

#include "cuda/kernels/decode_attention_common.cuh"

#include <cuda_fp16.h>

namespace lychee::cuda {
namespace {

// A stage: [K codes 64 x d][V codes 64 x d] e4m3, swizzled (fp8_tile_offset), then [K scales 64]
// [V scales 64] f32.
template <int HeadDim>
struct Fp8DecodeTraits {
  static constexpr int kRowBytes = HeadDim;                      // one token's codes
  static constexpr int kChunksPerRow = HeadDim / 16;             // 16-byte chunks per token (8 or 4)
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;  // 16 or 32
  static constexpr int kPasses = kTileTokens / kRowsPerPass;
  static constexpr int kTileBytes = kTileTokens * kRowBytes;     // K (or V) codes of one tile
  static constexpr int kScaleBytes = kTileTokens * 4;            // K (or V) scales of one tile
  static constexpr int kStageBytes = 2 * kTileBytes + 2 * kScaleBytes;
  static constexpr int kStages = (96 * 1024) / kStageBytes;      // 5 at d=128, 11 at d=64
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static constexpr int kKSteps = HeadDim / 16;                   // mma k-steps of Q K^T
  static constexpr int kLaneChunks = kKSteps / 4;                // a lane's 16-byte chunks of a K row
  static constexpr int kDimTiles = HeadDim / 8;                  // mma n-tiles of P V
  static_assert(kStages >= 2, "the pipeline needs two stages");
  static_assert(kWarps * kMaxRows * DecodeTraits<HeadDim>::kOutStride * 4 <= kSmemBytes,
                "epilogue reuses the stages");
};

// Byte offset of 16-byte chunk `chunk` of token row `row` in a K or V code tile. The swizzle puts
// the 8 rows of every ldmatrix phase (V: 8 tokens, one chunk) in distinct bank groups, and keeps
// every K load phase (2 rows x 4 lanes) and cp.async phase (a row, or two at d = 64) distinct too:
// at d = 128 (8 chunks a row) chunk ^ (row % 8); at d = 64 (4 chunks, two rows per 128 bytes) chunk
// ^ ((row / 2) % 4).
template <int HeadDim>
__host__ __device__ constexpr uint32_t fp8_tile_offset(int row, int chunk) {
  return uint32_t(row * HeadDim + ((chunk ^ (HeadDim >= 128 ? (row & 7) : ((row >> 1) & 3))) << 4));
}

// 4-byte global -> shared copy through L1 (cp.async.cg takes 16 bytes only): one token's scale on
// the gather path; src_bytes 0 writes zeros.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// The loaders: as the bf16 ones (decode_attention.cu), over codes (16 bytes = 16 dims a chunk)
// and with the tile's scales. Page path: threads 0..31 copy the K (0..15) and V (16..31) scales of
// 4 tokens each (a page's scales of one head are contiguous and pages hold >= 16 tokens, so 4
// tokens never straddle).
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
      const uint32_t dst = stage + fp8_tile_offset<HeadDim>(row, chunk);
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
      const uint32_t dst = stage + fp8_tile_offset<HeadDim>(row, chunk);
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


// 4 e4m3 codes (lowest byte first) -> f16x2 of codes 0, 1 (lo) and of codes 2, 3 (hi); exact.
__device__ __forceinline__ void e4m3x4_to_f16x2x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e4m3x2 %0, a;\n cvt.rn.f16x2.e4m3x2 %1, b;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
// The power of two >= x > 0 (x normal), and 1 for x <= 0 or tiny x.
__device__ __forceinline__ float pow2_ceil(float x) {
  return x > 1e-30f ? __uint_as_float((__float_as_uint(x) + 0x7FFFFFu) & 0x7F800000u) : 1.0f;
}

// Q as f16 A fragments in the permuted dims (above): row g = query head kv_head * group + row_begin
// + g (zero for g >= n_rows); qf[ks][0] = dims t4 d/4 + 4 ks + 0, 1, qf[ks][1] = + 2, 3, each scaled
// by the row's power of two; logit = descale (q16 . code) s_k.
template <int HeadDim>
struct Fp8Query {
  uint32_t qf[Fp8DecodeTraits<HeadDim>::kKSteps][2];
  float descale;

  __device__ __forceinline__ void load(const bf16* q_row, bool q_ok) {
    constexpr int kDims = HeadDim / 4;  // this lane's dims
    const int t4 = threadIdx.x & 3;
    float x[kDims];
#pragma unroll
    for (int c = 0; c < kDims / 8; ++c) {
      const uint4 w = q_ok ? __ldg(reinterpret_cast<const uint4*>(q_row + t4 * kDims) + c) : make_uint4(0, 0, 0, 0);
      const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        x[8 * c + 2 * j] = __uint_as_float(u[j] << 16);
        x[8 * c + 2 * j + 1] = __uint_as_float(u[j] & 0xFFFF0000u);
      }
    }
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kDims; ++i) amax = fmaxf(amax, fabsf(x[i]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));  // the row's quad
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    const float p2 = pow2_ceil(amax);
    const float mul = 16384.0f / p2;  // exact: powers of two
    descale = p2 * (1.0f / 16384.0f);
#pragma unroll
    for (int ks = 0; ks < Fp8DecodeTraits<HeadDim>::kKSteps; ++ks) {
      qf[ks][0] = pack_f16x2(x[4 * ks] * mul, x[4 * ks + 1] * mul);
      qf[ks][1] = pack_f16x2(x[4 * ks + 2] * mul, x[4 * ks + 3] * mul);
    }
  }
};

__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

// One warp, one tile of FP8 codes (stage at `stage`, shared address `stage_addr`): its 16 tokens
// [tok0, tok0 + 16) against the group's queries; (m, l) as the bf16 attend_tile's, o in units of
// o_scale (updated here).
template <int HeadDim>
__device__ __forceinline__ void attend_tile_fp8(const uint8_t* stage, uint32_t stage_addr, const Fp8Query<HeadDim>& q,
                                                float (&o)[Fp8DecodeTraits<HeadDim>::kDimTiles][4], float& m,
                                                float& l, float& o_scale, int tok0, int n_tok, float scale_log2,
                                                const ScoreSink& sc) {
  using F8 = Fp8DecodeTraits<HeadDim>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  const float* k_sc = reinterpret_cast<const float*>(stage + 2 * F8::kTileBytes);
  const float* v_sc = k_sc + kTileTokens;

  // S = Q K^T: n-tile n is the warp's tokens 8 n .. 8 n + 7; this lane's B column is token 8 n + g.
  float s[2][4] = {};
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    const int row = warp * 16 + 8 * n + g;
    uint32_t w[F8::kKSteps];
#pragma unroll
    for (int c = 0; c < F8::kLaneChunks; ++c) {
      const uint4 x = *reinterpret_cast<const uint4*>(stage + fp8_tile_offset<HeadDim>(row, t4 * F8::kLaneChunks + c));
      w[4 * c] = x.x, w[4 * c + 1] = x.y, w[4 * c + 2] = x.z, w[4 * c + 3] = x.w;
    }
#pragma unroll
    for (int ks = 0; ks < F8::kKSteps; ++ks) {
      uint32_t b0, b1;
      e4m3x4_to_f16x2x2(w[ks], b0, b1);
      mma_f16(s[n], q.qf[ks][0], q.qf[ks][1], b0, b1);
    }
  }
  // logit = s_k[t] (q . code_k[t]); this thread's tokens are 8 n + 2 t4 + i.
  float2 sv[2];
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    const float2 sk = *reinterpret_cast<const float2*>(k_sc + warp * 16 + 8 * n + 2 * t4);
    sv[n] = *reinterpret_cast<const float2*>(v_sc + warp * 16 + 8 * n + 2 * t4);
    s[n][0] *= sk.x * q.descale;
    s[n][1] *= sk.y * q.descale;
  }
  score_tile(sc, s, tok0, n_tok);
  float p[2][2];
  const float alpha = online_softmax(s, tok0, n_tok, scale_log2, m, l, p);

  // P' = p s_v / c with c the power of two >= the warp's valid V scales (the page path copies
  // scales 4 tokens at a time, so a tile's last ones may be a page's unwritten rows: masked here);
  // O moves to units of c with the softmax's rescale.
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    const int tok = tok0 + 8 * n + 2 * t4;
    sv[n].x = tok < n_tok ? sv[n].x : 0.0f;
    sv[n].y = tok + 1 < n_tok ? sv[n].y : 0.0f;
  }
  float vmax = fmaxf(fmaxf(sv[0].x, sv[0].y), fmaxf(sv[1].x, sv[1].y));
  vmax = fmaxf(vmax, __shfl_xor_sync(0xffffffffu, vmax, 1));
  vmax = fmaxf(vmax, __shfl_xor_sync(0xffffffffu, vmax, 2));
  const float c = pow2_ceil(vmax), inv_c = 1.0f / c;  // exact
  const float r = alpha * (o_scale * inv_c);
  o_scale = c;
#pragma unroll
  for (int j = 0; j < F8::kDimTiles; ++j) {
    o[j][0] *= r;
    o[j][1] *= r;
  }
  const uint32_t pa0 = pack_f16x2(p[0][0] * sv[0].x * inv_c, p[0][1] * sv[0].y * inv_c);
  const uint32_t pa2 = pack_f16x2(p[1][0] * sv[1].x * inv_c, p[1][1] * sv[1].y * inv_c);

  // O += P' V: ldmatrix.trans matrices (tokens 0-7 | 8-15) x (chunk 2 np | 2 np + 1), each lane
  // getting tokens 2 t4, 2 t4 + 1 x dims 2 g, 2 g + 1 of a chunk; bytes [t 2g, t 2g+1, t' 2g, t' 2g+1]
  // permuted to [t 2g, t' 2g | t 2g+1, t' 2g+1]: the even and the odd n-tile's B halves.
  const int v_row = warp * 16 + (((lane >> 3) & 1) << 3) + (lane & 7), v_hi = lane >> 4;
#pragma unroll
  for (int np = 0; np < F8::kChunksPerRow / 2; ++np) {
    uint32_t b[4];
    ldmatrix_x4_trans(b, stage_addr + F8::kTileBytes + fp8_tile_offset<HeadDim>(v_row, 2 * np + v_hi));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t e0, o0, e1, o1;
      e4m3x4_to_f16x2x2(__byte_perm(b[2 * h], 0, 0x3120), e0, o0);
      e4m3x4_to_f16x2x2(__byte_perm(b[2 * h + 1], 0, 0x3120), e1, o1);
      mma_f16(o[4 * np + 2 * h], pa0, pa2, e0, e1);
      mma_f16(o[4 * np + 2 * h + 1], pa0, pa2, o0, o1);
    }
  }
}

}  // namespace
}  // namespace lychee::cuda
