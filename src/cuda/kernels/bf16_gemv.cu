// bf16 weight GEMV for decode steps with a fused RMSNorm and residual-add / SwiGLU epilogues
// (bf16_gemv.h), Hopper (sm_90a). The FP8 GEMV's design (fp8_gemv.cu) with bf16 weights.
//
// Bytes: the 2 m k weight bytes, read once per call (QKV of Llama-3-8B: 50 MB, 16.8 µs at 3 TB/s),
// plus y and x: every block reads all of x through L1 and L2 (2 n k bytes), and with the norm the
// n ceil(k / 16) partial sums of squares once.
//
// Why tensor cores at batch 1: one mma.sync m16n8k16 (bf16 in, f32 accumulate) multiplies 16 rows
// x 16 k of weights by all 8 columns of x (the batch is the mma's N; rows >= n are zeros), so the
// issue cost per weight is 1/128 of an mma whatever n is, and no conversion is needed: the weights
// go from the load to the mma as they are.
//
// FP8 weights (w8, w_scale): the same kernel over e4m3 codes, as fp8_gemv.cu reads them. A lane's
// 16 bytes of a row per chunk are 16 codes, so chunks are 64 positions and x comes as two uint4;
// the codes are widened to bf16 exactly in registers (gemv_common.cuh) and byte 4 j + e of the
// lane's 16 goes to mma j in fp8_gemv.cu's slots, so with the same chunk order its sums are the FP8
// GEMV's bit for bit; the row's scale multiplies the block's sum before the norm factor and the
// epilogue. The fused decode layers run on FP8 weights through it (half the bytes, the same
// launches as bf16). FP8 weights take no x_lo: the norm's input is rounded to bf16 once, as the
// unfused FP8 path rounds it (the weights' own rounding, 2^-4, dwarfs it), and the second mma
// and its loads cost the FP8 QKV, output and gate/up products 0.2-1.6 µs each (H100, n = 1 and 8;
// not the down product) and pushed the QKV + RoPE form into spills
// (docs/results/fp8_gpu/fused_layers/).
//
// Layout. A block is 8 warps and R m16 tiles of rows (R = 1; SwiGLU's 16 outputs per block: R = 2,
// tiles of 16 gate rows and the 16 up rows of the same outputs, so the epilogue has both; its 8
// outputs per block: R = 1, the tile's rows g the gate rows and g + 8 their up rows, twice the
// blocks for the same bytes, which fills the last wave of a small grid better); every warp multiplies
// all the block's rows over its own part of k, and the 8 partial sums are added through shared
// memory at the end, in warp order. k is cut into chunks of 32: lane (g, t) = (lane / 4, lane % 4)
// loads weights [8 t, 8 t + 8) of the chunk for rows g and g + 8 of each tile (uint4, streamed past
// L1) and x row g at the same 8 positions (one uint4 of bf16).
// k is a sum, so a position may take any mma slot as long as A and B agree: of the lane's 8, pairs
// (0, 1), (2, 3) are slots (2t, 2t + 1), (2t + 8, 2t + 9) of the first mma, pairs (4, 5), (6, 7) of
// the second — each 32-bit word of the loads is an mma register as it stands. Chunks go to warps in
// slabs of 4 (warp w: slabs w, w + 8, ...), so a row's sum runs in the same order for every m, n
// and R. A warp takes 4 / R chunks per step (8 weight uint4 per lane, 4 KiB per warp); the first
// step's weights are loaded before griddepcontrol.wait (PDL), while the previous kernel drains,
// and what the norm and the epilogue read besides the sums is prefetched into L1 around it
// (epilogue_prefetch), so the tail of a product is no round trip to memory.
//
// Staging (S): 0 keeps one step ahead in registers; 2 keeps a shared-memory ring of 2 steps per warp
// filled by cp.async, which at ~70 registers fits three blocks per SM. The ring is the automatic
// choice for every grid: this kernel first took the FP8 GEMV's rule (fp8_gemv.cu: registers within
// one wave of two blocks per SM), but forcing the ring on the single-wave products too (the 8B
// output and down products, every product of a tensor-parallel rank) was faster end to end on
// every configuration measured, alternated twice (LYCHEE_BF16_GEMV_STAGES=2 against the old rule,
// docs/results/gpu/decode_step/ring_everywhere/): H100 8B b1 LycheeDecode 128K 6.81 -> 6.66 ms,
// 32K 6.22 -> 6.06, Full 11.39 -> 11.24, FP8 weights 4.78 -> 4.74, the default model 1585 -> 1668
// and 1701 tok/s; two H200s, TP=2 b1 128K Full 5.48 -> 5.35 ms. A/B-able with
// LYCHEE_BF16_GEMV_STAGES=0|2.
//
// The norm: RMSNorm(v)·w = r · Σ_t w[j][t]·(norm[t]·v[t]), so a product that takes the norm's
// output needs x = bf16(norm · v) and r, which needs all of v. The residual-add epilogue that
// produces v (kAddF32, 16 outputs per block) writes both pieces for the next product: x for its
// own 16 outputs, and their sum of squares into its block's slot of ss; the next product reads
// x like any bf16 input and, at the end, sums the slots in a fixed order (a warp per row) for r.
// With x_lo (the residues u - bf16(u) of u = norm · v, also bf16) the product runs a second mma on
// the same weights: x + x_lo carries ~16 significant bits, so the norm's output is not rounded to
// bf16 (the unfused path rounds it once per input; a tiny checkpoint's worst decode step against
// the f32 CPU reference went from 2.8e-2 unfused to 3.4e-2 fused without it; issue 17).
// Two earlier versions normalised the f32 residual inside the consuming product — before its
// main loop (a pass over v and a barrier in every block: +5 µs on the 8B QKV, +15 µs on gate/up
// at n = 1) and then inside it (the f32 v and the norm weights read by every block, 4x the bf16
// x's bytes through L2: still +4.6 and +14 µs; H100, docs/results/gpu/decode_step/fused/).

#include "cuda/kernels/bf16_gemv.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/kernels/gemv_common.cuh"

namespace lychee::cuda {
namespace {

using gemv::kThreads;
using gemv::kWarps;

// The weight format's geometry (F8: e4m3 codes). A lane's 16 weight bytes of a row per chunk are
// 8 bf16 weights or 16 codes; the chunk is 4 lanes of them, and the lane's x at the same positions
// is one or two uint4 of bf16.
template <bool F8>
struct Fmt {
  static constexpr int kPerLane = F8 ? 16 : 8;   // k positions per lane, row and chunk
  static constexpr int kChunk = 4 * kPerLane;    // k positions per chunk
  static constexpr int kXVecs = kPerLane / 8;    // uint4 of bf16 x per lane and chunk
};

// The weight row of row rr (< 16) of tile r of block b: rows [16 (b R + r), + 16); SwiGLU with two
// tiles: gate rows [16 b, 16 b + 16) (r = 0) and the up rows of the same outputs (r = 1); SwiGLU with
// one tile: gate rows [8 b, 8 b + 8) (rr < 8) and their up rows (rr >= 8); QKV + RoPE (R = 1): rows
// [8 j, 8 j + 8) of head h (rr < 8) and their RoPE partners half a head further (rr >= 8: the mma's
// rows g and g + 8 are partners), with h = b / (d / 16), j = b % (d / 16) for head_dim d.
template <int R, GemvOut OUT>
__device__ __forceinline__ int row_of(int r, int rr, int b, const Bf16GemvArgs& a) {
  if constexpr (OUT == GemvOut::kSwiGlu && R == 2) return r * (a.m / 2) + 16 * b + rr;
  if constexpr (OUT == GemvOut::kSwiGlu) return (rr / 8) * (a.m / 2) + 8 * b + rr % 8;  // rows g, g + 8: gate, up
  if constexpr (OUT == GemvOut::kQkvRope) {
    const int d = a.rope.head_dim, per_head = d / 16;
    return (b / per_head) * d + (rr / 8) * (d / 2) + 8 * (b % per_head) + rr % 8;
  }
  return (b * R + r) * 16 + rr;
}

// Whether row rr (< 16) of tile r of block b exists.
template <int R, GemvOut OUT>
__device__ __forceinline__ bool row_in(int r, int rr, int b, const Bf16GemvArgs& a) {
  if constexpr (OUT == GemvOut::kSwiGlu) return (R == 2 ? 16 * b + rr : 8 * b + rr % 8) < a.m / 2;
  return row_of<R, OUT>(r, rr, b, a) < a.m;
}

template <int R>
struct Step {
  static constexpr int kChunks = 4 / R;
  uint4 w[kChunks][R][2];  // [chunk][tile][rows g, g + 8] the lane's 16 weight bytes of the chunk
};
template <int R, bool F8>
struct StepX {
  uint4 x[Step<R>::kChunks][Fmt<F8>::kXVecs];   // [chunk] x row g at the same positions, bf16
  uint4 lo[Step<R>::kChunks][Fmt<F8>::kXVecs];  // with the norm and x_lo: x_lo at the same positions (bf16)
};

// The weights' first byte: bf16 values or e4m3 codes.
template <bool F8>
__device__ __forceinline__ const void* weights(const Bf16GemvArgs& a) {
  if constexpr (F8) return a.w8;
  return a.w;
}

// The 16 weight bytes a lane (g, t) loads for (chunk c + p, tile r, half h), or null past m and k
// (k is a multiple of the lane's width, so a lane's weights are all in or all out).
template <int R, GemvOut OUT, bool F8>
__device__ __forceinline__ const void* weight_ptr(const Bf16GemvArgs& a, int b, int c, int p, int r, int h, int g,
                                                  int t) {
  const int col = (c + p) * Fmt<F8>::kChunk + Fmt<F8>::kPerLane * t, rr = 8 * h + g;
  if (col >= a.k || !row_in<R, OUT>(r, rr, b, a)) return nullptr;
  const size_t at = size_t(row_of<R, OUT>(r, rr, b, a)) * size_t(a.k) + col;
  if constexpr (F8) return a.w8 + at;
  return a.w + at;
}

template <int R, GemvOut OUT, bool F8>
__device__ __forceinline__ void load_weights(Step<R>& s, const Bf16GemvArgs& a, int b, int c, int g, int t) {
#pragma unroll
  for (int p = 0; p < Step<R>::kChunks; ++p)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const void* src = weight_ptr<R, OUT, F8>(a, b, c, p, r, h, g, t);
        s.w[p][r][h] = src != nullptr ? gemv::load_stream16(src) : make_uint4(0, 0, 0, 0);
      }
}

// x row g at the lane's positions of the step's chunks; zeros for rows >= n. Plain loads (not the
// read-only path): under PDL the previous kernel may still be writing x when this grid starts, and
// griddepcontrol.wait orders plain loads after its writes.
template <int R, bool NORM, bool F8>
__device__ __forceinline__ void load_x(StepX<R, F8>& s, const Bf16GemvArgs& a, int c, int g, int t) {
#pragma unroll
  for (int p = 0; p < Step<R>::kChunks; ++p) {
    const int col = (c + p) * Fmt<F8>::kChunk + Fmt<F8>::kPerLane * t;
    const bool in = g < a.n && col < a.k;
    const size_t at = size_t(g) * size_t(a.k) + size_t(col);
#pragma unroll
    for (int v = 0; v < Fmt<F8>::kXVecs; ++v) {
      s.x[p][v] = in ? reinterpret_cast<const uint4*>(a.x + at)[v] : make_uint4(0, 0, 0, 0);
      if constexpr (NORM && !F8)
        s.lo[p][v] = in && a.x_lo != nullptr ? reinterpret_cast<const uint4*>(a.x_lo + at)[v] : make_uint4(0, 0, 0, 0);
    }
  }
}

// x at a lane's positions 4 j .. 4 j + 3 of its 16 (two uint4 of bf16) as the FP8 GEMV's B
// operand: (0, 1), (2, 3) -> b0 = (0, 2), b1 = (1, 3), the pairs the code widening gives A.
__device__ __forceinline__ void fp8_b(const uint4 (&x)[2], int j, uint32_t& b0, uint32_t& b1) {
  const uint32_t x01 = gemv::word(x[j / 2], 2 * (j % 2)), x23 = gemv::word(x[j / 2], 2 * (j % 2) + 1);
  b0 = __byte_perm(x01, x23, 0x5410);
  b1 = __byte_perm(x01, x23, 0x7632);
}

template <int R, bool NORM, bool F8>
__device__ __forceinline__ void mma_step(float (&acc)[R][4], const Step<R>& s, const StepX<R, F8>& xs, bool lo_in) {
  if constexpr (F8) {  // fp8_gemv.cu's order: byte 4 j + e of the lane's 16 to mma j; no x_lo (see the top)
#pragma unroll
    for (int p = 0; p < Step<R>::kChunks; ++p)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t b0, b1;
        fp8_b(xs.x[p], j, b0, b1);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          uint32_t a0, a1, a2, a3;  // rows g (a0, a2) and g + 8 (a1, a3)
          gemv::e4m3x4_to_bf16(gemv::word(s.w[p][r][0], j), a0, a2);
          gemv::e4m3x4_to_bf16(gemv::word(s.w[p][r][1], j), a1, a3);
          ptx::mma_bf16(acc[r], a0, a1, a2, a3, b0, b1);
        }
      }
  } else {
#pragma unroll
    for (int p = 0; p < Step<R>::kChunks; ++p)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint4 &lo = s.w[p][r][0], &hi = s.w[p][r][1];  // rows g and g + 8
        const uint4 &x = xs.x[p][0], &xl = xs.lo[p][0];
        ptx::mma_bf16(acc[r], lo.x, hi.x, lo.y, hi.y, x.x, x.y);
        ptx::mma_bf16(acc[r], lo.z, hi.z, lo.w, hi.w, x.z, x.w);
        if constexpr (NORM)
          if (lo_in) {  // the inputs' rounding residues: the same weights times x_lo
            ptx::mma_bf16(acc[r], lo.x, hi.x, lo.y, hi.y, xl.x, xl.y);
            ptx::mma_bf16(acc[r], lo.z, hi.z, lo.w, hi.w, xl.z, xl.w);
          }
      }
  }
}

// RoPE of the pair (x0, x1) by `angle`, as qkv_rope_append (kernels.cu). Not inlined: sincosf's
// large-argument path (positions past ~10^4) would otherwise push the main loop's registers into
// local memory in the kernels that fit three blocks per SM.
__device__ __noinline__ void rotate(float angle, float& x0, float& x1) {
  float sn, cs;
  sincosf(angle, &sn, &cs);
  const float y0 = x0 * cs - x1 * sn, y1 = x1 * cs + x0 * sn;
  x0 = y0, x1 = y1;
}

__device__ __forceinline__ float silu_times(float gate, float up) { return gate / (1.0f + __expf(-gate)) * up; }

// The rows' norm factors r_i = rsqrt(Σ_p ss[i][p] / k + eps), warp i summing row i's slots (lane
// p, p + 32, ..., then the butterfly): a fixed order, the same in every block.
__device__ __forceinline__ void norm_factors(const Bf16GemvArgs& a, float (&rs)[kBf16GemvMaxRows], int lane, int warp) {
  if (warp >= a.n) return;
  const float* ss = a.ss + size_t(warp) * size_t(a.ss_count);
  float q = 0.0f;
  for (int p = lane; p < a.ss_count; p += 32) q += ss[p];
#pragma unroll
  for (int o = 16; o > 0; o /= 2) q += __shfl_xor_sync(0xFFFFFFFFu, q, o);
  if (lane == 0) rs[warp] = rsqrtf(q / float(a.k) + a.eps);
}

// kAddF32: y[i][row] = (y + s) + bias, one output per thread of the first 16 n (R = 1: 16 rows);
// with next_norm also xn = bf16(next_norm · y) (xn_lo: its residue) and the block's slot of
// ss_out = Σ of its 16 rows' y² per x row (the 16 threads of a row are one half-warp: butterfly
// over offsets 8, 4, 2, 1).
__device__ __forceinline__ void add_epilogue(const Bf16GemvArgs& a, int b, float s, int i, int rr) {
  const int row = b * 16 + rr;
  const bool in = i < a.n && row < a.m;
  float v = 0.0f;
  if (in) {
    float* y = static_cast<float*>(a.y) + size_t(i) * size_t(a.m) + size_t(row);
    v = *y + s;
    if (a.bias != nullptr) v += a.bias[row];
    *y = v;
  }
  if (a.next_norm == nullptr) return;
  if (in) {
    const size_t at = size_t(i) * size_t(a.m) + size_t(row);
    const float u = a.next_norm[row] * v;
    const bf16 hi = __float2bfloat16_rn(u);
    a.xn[at] = hi;
    if (a.xn_lo != nullptr) a.xn_lo[at] = __float2bfloat16_rn(u - __bfloat162float(hi));
  }
  float q = v * v;
#pragma unroll
  for (int o = 8; o > 0; o /= 2) q += __shfl_xor_sync(0xFFFFFFFFu, q, o);
  if (rr == 0 && i < a.n) a.ss_out[size_t(i) * gridDim.x + size_t(b)] = q;
}

// The block's 8 partial sums of each (x row, tile row) added in warp order, scaled by r_i with the
// norm, then the epilogue.
template <int R, bool NORM, GemvOut OUT, bool F8>
__device__ __forceinline__ void reduce_store(float (&part)[kWarps][kBf16GemvMaxRows][16 * R + 4],
                                             float (&rs)[kBf16GemvMaxRows], const float (&acc)[R][4],
                                             const Bf16GemvArgs& a, int b, int lane, int warp, int g, int t) {
  constexpr int kRows = 16 * R;
  if constexpr (NORM) norm_factors(a, rs, lane, warp);
  gemv::scatter_partials<R>(part, acc, warp, g, t);
  __syncthreads();
  const auto sum = [&](int i, int rr) {
    float s = part[0][i][rr];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) s += part[w][i][rr];
    if constexpr (F8) {  // the row's scale (0 past m: the residual add's lanes of absent rows)
      const int r = rr / 16, in_tile = rr % 16;
      s *= row_in<R, OUT>(r, in_tile, b, a) ? a.w_scale[row_of<R, OUT>(r, in_tile, b, a)] : 0.0f;
    }
    if constexpr (NORM) s *= rs[i];
    return s;
  };
  if constexpr (OUT == GemvOut::kSwiGlu) {
    constexpr int kOut = 8 * R;  // outputs per block: the gate rows' sums first, then the up rows'
    const int f = a.m / 2;
    for (int o = int(threadIdx.x); o < a.n * kOut; o += kThreads) {
      const int i = o / kOut, j = kOut * b + o % kOut;
      if (j >= f) continue;
      float gate = sum(i, o % kOut), up = sum(i, kOut + o % kOut);
      if (a.bias != nullptr) gate += a.bias[j], up += a.bias[f + j];
      static_cast<bf16*>(a.y)[size_t(i) * f + j] = __float2bfloat16_rn(silu_times(gate, up));
    }
  } else if constexpr (OUT == GemvOut::kQkvRope) {
    // Output p of head h and its partner p + d/2: bias, then RoPE (Q and K heads) as
    // qkv_rope_append computes it, rounded once; Q to y, K and V into the token's page slot.
    const Bf16GemvRope& rp = a.rope;
    const int d = rp.head_dim, half = d / 2, per_head = d / 16;
    const int h = b / per_head, p0 = 8 * (b % per_head);
    for (int o = int(threadIdx.x); o < a.n * 8; o += kThreads) {
      const int i = o / 8, p = p0 + o % 8, c0 = h * d + p;
      float x0 = sum(i, o % 8), x1 = sum(i, 8 + o % 8);
      if (a.bias != nullptr) x0 += a.bias[c0], x1 += a.bias[c0 + half];
      bf16* dst;
      if (h < rp.n_heads) {
        dst = static_cast<bf16*>(a.y) + (size_t(i) * rp.n_heads + h) * d;
      } else {
        const bool v = h >= rp.n_heads + rp.n_kv_heads;
        const int kvh = h - rp.n_heads - (v ? rp.n_kv_heads : 0);
        dst = (v ? rp.v_pool : rp.k_pool) +
              ((size_t(rp.kv_page[i]) * rp.n_kv_heads + kvh) * rp.page_size + rp.kv_row[i]) * d;
      }
      if (h < rp.n_heads + rp.n_kv_heads) rotate(float(rp.positions[i]) * rp.inv_freq[p], x0, x1);
      dst[p] = __float2bfloat16_rn(x0);
      dst[p + half] = __float2bfloat16_rn(x1);
    }
  } else if constexpr (OUT == GemvOut::kAddF32) {
    static_assert(R == 1, "the residual add takes 16 rows per block");
    const int o = int(threadIdx.x);  // 16 n <= 128 outputs: warps 0-3 whole (their shuffles need every lane)
    if (o < kBf16GemvMaxRows * 16) {
      const int i = o / 16, rr = o % 16;
      add_epilogue(a, b, i < a.n ? sum(i, rr) : 0.0f, i, rr);
    }
  } else {
    for (int o = int(threadIdx.x); o < a.n * kRows; o += kThreads) {
      const int i = o / kRows, row = b * kRows + o % kRows;
      if (row >= a.m) continue;
      const float s = sum(i, o % kRows);
      const size_t at = size_t(i) * size_t(a.m) + size_t(row);
      if constexpr (OUT == GemvOut::kBf16)
        static_cast<bf16*>(a.y)[at] = __float2bfloat16_rn(s);
      else
        static_cast<float*>(a.y)[at] = s;
    }
  }
}

using gemv::chunk_of;

// What the norm and the epilogue read besides the sums, into L1 before the main loop, so that
// none of it is a round trip to L2 or memory after it (each was one, in turn, at the tail of every
// decode product: the sums of squares, the residual, the RoPE angles and KV slots, the constants).
// Before the PDL wait (after_wait false): what earlier work wrote (the constants; the step's
// positions and KV slots, copied in before the kernel before this one started, as every kernel
// of a step launches its dependents after its own wait); after it: what the previous kernel
// wrote (the norm's sums of squares, the residual).
template <int R, bool NORM, GemvOut OUT>
__device__ __forceinline__ void epilogue_prefetch(const Bf16GemvArgs& a, int b, int lane, int warp, bool after_wait) {
  const int tid = int(threadIdx.x);
  if (after_wait) {
    if constexpr (NORM) {  // warp i sums row i's slots: every 128-byte line of them, and the last
      if (warp < a.n)
        for (int p = 32 * lane; p < a.ss_count + 31; p += 32 * 32)
          ptx::prefetch_l1(a.ss + size_t(warp) * size_t(a.ss_count) + size_t(min(p, a.ss_count - 1)));
    }
    if constexpr (OUT == GemvOut::kAddF32) {
      const int i = tid / 16, row = b * 16 + tid % 16;
      if (i < a.n && row < a.m) ptx::prefetch_l1(static_cast<const float*>(a.y) + size_t(i) * size_t(a.m) + row);
    }
    return;
  }
  if constexpr (OUT == GemvOut::kAddF32) {
    const int i = tid / 16, row = b * 16 + tid % 16;
    if (i == 0 && row < a.m) {
      if (a.bias != nullptr) ptx::prefetch_l1(a.bias + row);
      if (a.next_norm != nullptr) ptx::prefetch_l1(a.next_norm + row);
    }
  } else if constexpr (OUT == GemvOut::kQkvRope) {
    const Bf16GemvRope& rp = a.rope;
    const int d = rp.head_dim, per_head = d / 16, h = b / per_head, p = 8 * (b % per_head);
    if (tid < a.n) {
      ptx::prefetch_l1(rp.positions + tid);
      ptx::prefetch_l1(rp.kv_page + tid);
      ptx::prefetch_l1(rp.kv_row + tid);
    } else if (tid == 32) {
      ptx::prefetch_l1(rp.inv_freq + p);
      if (a.bias != nullptr) {
        ptx::prefetch_l1(a.bias + h * d + p);
        ptx::prefetch_l1(a.bias + h * d + p + d / 2);
      }
    }
  } else if constexpr (OUT == GemvOut::kSwiGlu) {
    if (a.bias != nullptr && tid == 0) {
      const int per = 8 * R, f = a.m / 2;
      ptx::prefetch_l1(a.bias + min(per * b, f - 1));
      ptx::prefetch_l1(a.bias + f + min(per * b, f - 1));
    }
  }
}

// S = 0: the weights one step ahead in registers. S >= 2: a shared-memory ring of S steps per warp
// (dynamic shared memory, bf16_gemv_ring_bytes), each lane copying, waiting for and reading only its
// own 16-byte slots, so no barrier is needed and the sums are the register kernel's, bit for bit.
template <int R, int S, bool NORM, GemvOut OUT, bool F8>
__global__ void __launch_bounds__(kThreads, S > 0 ? 3 : 2) bf16_gemv_kernel(const Bf16GemvArgs a) {
  constexpr int kStep = Step<R>::kChunks, kSlots = kStep * R * 2;  // uint4 per lane and step
  __shared__ float part[kWarps][kBf16GemvMaxRows][16 * R + 4];      // +4: the 4 lanes t on different banks
  __shared__ float rs[kBf16GemvMaxRows];  // with the norm: the rows' factors r_i
  extern __shared__ uint4 ring[];  // S >= 2: [warp][stage][slot][lane]
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32, g = lane / 4, t = lane % 4;
  const int b = int(blockIdx.x);
  const int n_chunks = (a.k + Fmt<F8>::kChunk - 1) / Fmt<F8>::kChunk;
  uint4* const mine = ring + size_t(warp) * S * kSlots * 32 + lane;
  const auto issue = [&](int step) {  // S >= 2: the warp's step `step` into its stage
    const uint32_t base = ptx::smem_u32(mine + (step % (S > 0 ? S : 1)) * kSlots * 32);
    const int c = chunk_of(warp, step * kStep);
#pragma unroll
    for (int p = 0; p < kStep; ++p)
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const void* src = weight_ptr<R, OUT, F8>(a, b, c, p, r, h, g, t);
          gemv::cp_async_stream16(base + uint32_t(((p * R + r) * 2 + h) * 32 * 16),
                                  src != nullptr ? src : weights<F8>(a), src != nullptr ? 16 : 0);
        }
    ptx::cp_async_commit();
  };

  float acc[R][4] = {};
  Step<R> cur;
  if constexpr (S == 0) {
    load_weights<R, OUT, F8>(cur, a, b, chunk_of(warp, 0), g, t);  // earlier kernels do not write w
  } else {
#pragma unroll
    for (int s = 0; s < S - 1; ++s) issue(s);
  }
  epilogue_prefetch<R, NORM, OUT>(a, b, lane, warp, false);
  ptx::grid_dependency_wait();  // but they write x (and y, for the residual add)
  epilogue_prefetch<R, NORM, OUT>(a, b, lane, warp, true);
  for (int step = 0; chunk_of(warp, step * kStep) < n_chunks; ++step) {
    StepX<R, F8> xs;
    load_x<R, NORM, F8>(xs, a, chunk_of(warp, step * kStep), g, t);
    if constexpr (S == 0) {
      Step<R> next;
      load_weights<R, OUT, F8>(next, a, b, chunk_of(warp, (step + 1) * kStep), g, t);  // in flight during the mma
      mma_step<R, NORM, F8>(acc, cur, xs, a.x_lo != nullptr);
      cur = next;
    } else {
      issue(step + S - 1);  // past the end: zeros, no reads
      ptx::cp_async_wait<S - 1>();
      const uint4* slot = mine + (step % S) * kSlots * 32;
#pragma unroll
      for (int p = 0; p < kStep; ++p)
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int h = 0; h < 2; ++h) cur.w[p][r][h] = slot[((p * R + r) * 2 + h) * 32];
      mma_step<R, NORM, F8>(acc, cur, xs, a.x_lo != nullptr);
    }
  }
  if constexpr (S > 0) ptx::cp_async_wait<0>();  // no copy may land in the next block's shared memory
  // Under PDL the next grid may launch once every block is past its weights: its blocks then take
  // SM slots only as this grid's last blocks end, instead of waiting on the SMs from the start of
  // a multi-wave grid.
  ptx::grid_launch_dependents();
  reduce_store<R, NORM, OUT, F8>(part, rs, acc, a, b, lane, warp, g, t);
}

// The largest product (weight bytes) launched with PDL by default; see launch_kernel.
constexpr size_t kPdlMaxWeightBytes = size_t(16) << 20;

constexpr int ring_bytes(int stages) { return stages * kWarps * 32 * 8 * 16; }

// A product's staging: the argument, else LYCHEE_BF16_GEMV_STAGES=0|2 in the environment (lab
// A/B; both give the same bits), else the automatic choice: the ring, whatever the grid (see the
// top).
int stages_of(const Bf16GemvArgs& a) {
  static const int forced = gemv::env_setting("LYCHEE_BF16_GEMV_STAGES", {0, 2});
  return a.stages >= 0 ? a.stages : forced >= 0 ? forced : 2;
}

// Dynamic shared memory that leaves room for two blocks per SM, not three (228 KiB per SM).
constexpr size_t kTwoPerSmBytes = size_t(80) << 10;

template <int R, int S, bool NORM, GemvOut OUT, bool F8>
void launch_kernel(const Bf16GemvArgs& a, int grid, cudaStream_t stream) {
  constexpr size_t kRing = S > 0 ? size_t(ring_bytes(S)) : 0;
  {
    static uint64_t attribute_set = 0;  // more than 48 KiB of dynamic shared memory needs it, per device
    if (first_on_device(attribute_set))
      LY_CUDA_CHECK(cudaFuncSetAttribute(bf16_gemv_kernel<R, S, NORM, OUT, F8>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(std::max(kRing, kTwoPerSmBytes))));
  }
  // PDL for small products (weights <= kPdlMaxWeightBytes), where launch latency is most of the
  // kernel's time (the default model's decode step went from 1247 / 1229 to 1460 / 1449 tok/s,
  // docs/results/gpu/decode_step/gemv_pdl/), and for grids of at most two blocks per SM (the 8B's
  // output and down products), which are then launched with shared memory for two blocks per SM
  // only. Without that cap PDL made those products slower (b1 128K: Full 11.97 against 11.49 ms,
  // gemv_pdl/): their blocks, launched early, landed on the SMs the previous kernel freed first,
  // three deep, and spread a single wave unevenly. With it, on one H100 alternated twice
  // (docs/results/gpu/decode_step/pdl_spread/): b1 128K Full 11.19 -> 11.13 ms, LycheeDecode
  // 6.63 -> 6.57; PDL without the cap gained half of that. LYCHEE_BF16_GEMV_PDL=1 / =0 forces PDL
  // on / off, LYCHEE_BF16_GEMV_SPREAD=0 drops the cap (A/B runs).
  static const int forced_pdl = gemv::env_setting("LYCHEE_BF16_GEMV_PDL", {0, 1});
  static const bool spread = gemv::env_setting("LYCHEE_BF16_GEMV_SPREAD", {0}) != 0;
  const bool one_wave_of_two = grid <= 2 * device_info().sm_count;
  const bool pdl = forced_pdl >= 0 ? forced_pdl == 1
                   : a.pdl >= 0    ? a.pdl == 1
                                   : one_wave_of_two || size_t(a.m) * size_t(a.k) * (F8 ? 1 : 2) <= kPdlMaxWeightBytes;
  const bool two_per_sm = spread && one_wave_of_two;
  if (pdl)
    launch_pdl(bf16_gemv_kernel<R, S, NORM, OUT, F8>, grid, kThreads, two_per_sm ? std::max(kRing, kTwoPerSmBytes) : kRing,
               stream, a);
  else
    bf16_gemv_kernel<R, S, NORM, OUT, F8><<<grid, kThreads, kRing, stream>>>(a);
}

// The grid of a product: its blocks' outputs (16 R rows; SwiGLU 8 R outputs, each a gate and an up row).
template <int R, GemvOut OUT>
int grid_of(const Bf16GemvArgs& a) {
  const int rows = OUT == GemvOut::kSwiGlu ? a.m / 2 : a.m;
  const int per_block = OUT == GemvOut::kSwiGlu ? 8 * R : 16 * R;
  return (rows + per_block - 1) / per_block;
}

template <int R, bool NORM, GemvOut OUT, bool F8>
void launch_staging(const Bf16GemvArgs& a, cudaStream_t stream) {
  const int grid = grid_of<R, OUT>(a);
  if (stages_of(a) == 2)
    launch_kernel<R, 2, NORM, OUT, F8>(a, grid, stream);
  else
    launch_kernel<R, 0, NORM, OUT, F8>(a, grid, stream);
}

// A grid's waves over the GPU, with the staging's blocks per SM (3 with the ring, 2 without).
double waves_of(int grid, int stages) { return double(grid) / (double(device_info().sm_count) * (stages == 2 ? 3 : 2)); }

// SwiGLU's outputs per block (bf16_gemv.h): the argument, else LYCHEE_BF16_GEMV_SWIGLU=8|16, else
// 8 where its grid fills its last wave better (waves / ceil(waves)) and either n <= 2 or the grid
// of 16 is under 1.5 waves, else 16. Measured on the 8B shape (docs/results/gpu/decode_step/
// swiglu_tiles/): 8 was 0.6-2% faster per step at batch 1 and 2 on one H100 or H200 (2.26
// against 4.5 waves), on each of two H200s (1.13 against 2.26 waves) at batch 1 and 4, and the
// default model 1561 -> 1585 tok/s (H100); but equal at batch 4 and 2-4% slower at batch 8 on one
// H100, 0.7-2.4% slower at batch 4 on one H200 (each block reads all of x: twice the blocks,
// twice x's reads).
int swiglu_outputs(const Bf16GemvArgs& a) {
  static const int forced = gemv::env_setting("LYCHEE_BF16_GEMV_SWIGLU", {8, 16});
  if (a.swiglu_outputs > 0) return a.swiglu_outputs;
  if (forced > 0) return forced;
  const int stages = stages_of(a);
  const double w8 = waves_of(grid_of<1, GemvOut::kSwiGlu>(a), stages);
  const double w16 = waves_of(grid_of<2, GemvOut::kSwiGlu>(a), stages);
  const bool fills_better = w8 / std::ceil(w8) > w16 / std::ceil(w16) + 1e-9;
  return fills_better && (a.n <= 2 || w16 < 1.5) ? 8 : 16;
}

template <bool NORM, bool F8>
void launch_out(const Bf16GemvArgs& a, cudaStream_t stream) {
  switch (a.out) {
    case GemvOut::kBf16: launch_staging<1, NORM, GemvOut::kBf16, F8>(a, stream); break;
    case GemvOut::kF32: launch_staging<1, NORM, GemvOut::kF32, F8>(a, stream); break;
    case GemvOut::kAddF32: launch_staging<1, NORM, GemvOut::kAddF32, F8>(a, stream); break;
    case GemvOut::kSwiGlu:
      if (swiglu_outputs(a) == 8)
        launch_staging<1, NORM, GemvOut::kSwiGlu, F8>(a, stream);
      else
        launch_staging<2, NORM, GemvOut::kSwiGlu, F8>(a, stream);
      break;
    case GemvOut::kQkvRope: launch_staging<1, NORM, GemvOut::kQkvRope, F8>(a, stream); break;
  }
}

template <bool F8>
void launch_format(const Bf16GemvArgs& a, cudaStream_t stream) {
  if (a.ss != nullptr)
    launch_out<true, F8>(a, stream);
  else
    launch_out<false, F8>(a, stream);
}

}  // namespace

namespace detail {

void launch_bf16_gemv(const Bf16GemvArgs& a, cudaStream_t stream) {
  if (a.w8 != nullptr)
    launch_format<true>(a, stream);
  else
    launch_format<false>(a, stream);
  LY_CUDA_CHECK_LAUNCH();
}

}  // namespace detail
}  // namespace lychee::cuda
