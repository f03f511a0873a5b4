// FP8 (e4m3) weight GEMV for decode steps (fp8_gemv.h), Hopper (sm_90a).
//
// Bytes: the m·k weight codes, read once per call (k = m = 4096: 16.8 MB, 5.7 µs at 2.95 TB/s),
// plus the m scales, y (n·m·2 bytes) and x: every block reads all of x (n·k·2 bytes) through L1 and
// L2, n / (8 R) bytes per weight byte with 16 R rows per block (≤ 0.5 at Llama-3-8B's shapes, n = 8).
//
// Why tensor cores: on CUDA cores, n = 8 costs 8 FMAs plus an e4m3 -> f32 conversion per weight
// byte; at 2.5 TB/s that is ~60% of an H100's FP32 issue rate before the conversions, so large
// batches would be issue-bound. One mma.sync m16n8k16 (bf16 in, f32 accumulate) multiplies 16 rows
// x 16 k of weights by all 8 rows of x at once (the batch is the mma's N = 8; rows >= n are zeros),
// so the issue cost per weight byte is the conversion (~2.5 integer / bf16x2 ops), whatever n is.
//
// Conversion, exact: the sign moved to bit 15 and the 7 magnitude bits under bf16's exponent and
// mantissa give value · 2^-120 for every code (the subnormal codes become bf16 subnormals with the
// same factor); one bf16x2 multiply by 2^120 restores the value (exact; bf16 arithmetic keeps
// subnormals). 4 codes -> the bf16 pairs (bytes 0, 2) and (bytes 1, 3).
//
// Layout. A block is 8 warps and a tile of 16 R rows (R = 1, 2 or 4 m16 tiles: kAutoTiles);
// every warp multiplies all the tile's rows over its own part of k and the 8 partial sums are added
// through shared memory at the end, in warp order. k is cut into chunks of 64: lane (g, t) =
// (lane / 4, lane % 4) loads codes [16 t, 16 t + 16) of the chunk for rows g and g + 8 of each m16
// tile (uint4, streamed past L1) and x row g at the same 16 positions (two uint4 of bf16, plain loads).
// x is not staged in shared memory: the warps of a block read disjoint parts of it (no reuse to
// gain), and all of it (224 KiB at k = 14336, n = 8) would leave room for one block per SM. k is a
// sum, so its positions may take any mma slot as long as A and B agree: byte 4 j + e of the lane's
// 16 goes to mma j, slot 2t (e = 0), 2t + 1 (e = 2), 2t + 8 (e = 1), 2t + 9 (e = 3). Chunks go to
// warps in slabs of 4 (warp w: slabs w, w + 8, ...), so a row's sum runs in the same order for
// every R. A warp takes 4 / R chunks per step (8 weight uint4 per lane, 32 KiB per block) and
// issues the next step's weight loads before the current step's mma; the first step's weights are
// loaded before griddepcontrol.wait (PDL), while the previous kernel drains.
//
// In flight: the register kernel keeps one step (4 KiB per warp) ahead, <= 64 KiB per SM; the
// staged variant (fp8_gemv_staged_kernel) keeps S - 1 steps per warp in a shared-memory ring and,
// at ~70 registers, fits three blocks per SM. Issue: per 256 codes (one mma) a warp spends ~20
// instructions (18 integer / bf16x2 for the conversion, the mma, 2 / R byte permutes of x).
// Lab numbers (H200, 132 SMs, copy bandwidth ~4.2 TB/s, run_all.sh bench-fp8 at 559e9ec, n = 1,
// graph timing; docs/results/fp8_gpu): qkv 9.1 µs (66% of copy), o 7.0 (57%), gate_up 31.2 (90%),
// down 17.3 (81%), the 526 MB lm_head shape 124 µs (101%). Small matrices lose ~2.5 µs a call to
// the launch, the first loads' latency and the tail.
#include "cuda/kernels/fp8_gemv.h"

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/kernels/gemv_common.cuh"

namespace lychee::cuda {
namespace {

using gemv::kThreads;
using gemv::kWarps;
constexpr int kChunk = 64;  // k positions per chunk: 4 lanes x 16 codes of a row

template <typename Out>
struct Fp8GemvArgs {
  const bf16* x;         // [n][k] bf16
  const uint8_t* w;      // [m][k] e4m3 codes
  const float* w_scale;  // [m] f32
  Out* y;                // [n][m] bf16 or f32
  int n, k, m;
};

using gemv::e4m3x4_to_bf16;
using gemv::word;

// A lane's operands of one step of its warp: 4 / R consecutive chunks of one slab.
template <int R>
struct Step {
  static constexpr int kChunks = 4 / R;
  uint4 w[kChunks][R][2];  // [chunk][m16 tile][rows g, g + 8] codes [16 t, 16 t + 16) of the chunk
};
template <int R>
struct StepX {
  uint4 x[Step<R>::kChunks][2];  // [chunk] x row g at the same positions, bf16
};

// Lane (g, t)'s codes of chunks c .. c + 4 / R - 1; zeros past m and k (k is a multiple of 16, so
// a lane's 16 codes are all in or all out).
template <int R, typename Out>
__device__ __forceinline__ void load_weights(Step<R>& s, const Fp8GemvArgs<Out>& a, int row0, int c, int g,
                                             int t) {
#pragma unroll
  for (int p = 0; p < Step<R>::kChunks; ++p) {
    const int col = (c + p) * kChunk + 16 * t;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + 16 * r + 8 * h + g;
        s.w[p][r][h] = row < a.m && col < a.k ? gemv::load_stream16(a.w + size_t(row) * a.k + col) : make_uint4(0, 0, 0, 0);
      }
  }
}

// x row g at the lane's positions of the same chunks; zeros for rows >= n (the mma's unused columns).
// Plain loads, not the read-only path (__ldg / ld.global.nc): under PDL this grid runs while the
// previous kernel (the attention merge, for wo) still writes x, which breaks the read-only path's
// premise that the data stays unchanged for the kernel's lifetime; griddepcontrol.wait orders
// plain loads after those writes.
template <int R, typename Out>
__device__ __forceinline__ void load_x(StepX<R>& s, const Fp8GemvArgs<Out>& a, int c, int g, int t) {
#pragma unroll
  for (int p = 0; p < Step<R>::kChunks; ++p) {
    const int col = (c + p) * kChunk + 16 * t;
    const bool in = g < a.n && col < a.k;
    const uint4* src = reinterpret_cast<const uint4*>(a.x + size_t(g) * a.k + col);
    s.x[p][0] = in ? src[0] : make_uint4(0, 0, 0, 0);
    s.x[p][1] = in ? src[1] : make_uint4(0, 0, 0, 0);
  }
}

template <int R>
__device__ __forceinline__ void mma_step(float (&acc)[R][4], const Step<R>& s, const StepX<R>& xs) {
#pragma unroll
  for (int p = 0; p < Step<R>::kChunks; ++p)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      // x at the lane's positions 4 j .. 4 j + 3 as (0, 1), (2, 3) -> b0 = (0, 2), b1 = (1, 3): A's pairs.
      const uint32_t x01 = word(xs.x[p][j / 2], 2 * (j % 2)), x23 = word(xs.x[p][j / 2], 2 * (j % 2) + 1);
      const uint32_t b0 = __byte_perm(x01, x23, 0x5410), b1 = __byte_perm(x01, x23, 0x7632);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        uint32_t a0, a1, a2, a3;  // rows g (a0, a2) and g + 8 (a1, a3); slots 2t, 2t + 1 (a0, a1), + 8 (a2, a3)
        e4m3x4_to_bf16(word(s.w[p][r][0], j), a0, a2);
        e4m3x4_to_bf16(word(s.w[p][r][1], j), a1, a3);
        ptx::mma_bf16(acc[r], a0, a1, a2, a3, b0, b1);
      }
    }
}

__device__ __forceinline__ void store(bf16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }

// The block's 8 partial sums of each (x row, tile row) added in warp order, scaled and stored.
template <int R, typename Out>
__device__ __forceinline__ void reduce_store(float (&part)[kWarps][kFp8GemvMaxRows][16 * R + 4],
                                             const float (&acc)[R][4], const Fp8GemvArgs<Out>& a, int row0,
                                             int warp, int g, int t) {
  constexpr int kRows = 16 * R;
  gemv::scatter_partials<R>(part, acc, warp, g, t);
  __syncthreads();
  for (int o = int(threadIdx.x); o < kFp8GemvMaxRows * kRows; o += kThreads) {
    const int i = o / kRows, rr = o % kRows, row = row0 + rr;
    if (i >= a.n || row >= a.m) continue;
    float sum = part[0][i][rr];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) sum += part[w][i][rr];
    store(a.y + size_t(i) * a.m + row, a.w_scale[row] * sum);
  }
}

// Grid: one block per 16 R rows of w. See the top of the file. Weights one step ahead in registers.
template <int R, typename Out>
__global__ void __launch_bounds__(kThreads, 2) fp8_gemv_kernel(const Fp8GemvArgs<Out> a) {
  constexpr int kRows = 16 * R, kStep = Step<R>::kChunks;
  // [warp][row of x][row of the tile] partial sums; +4 puts the 4 lanes t of a row on different banks.
  __shared__ float part[kWarps][kFp8GemvMaxRows][kRows + 4];
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32, g = lane / 4, t = lane % 4;
  const int row0 = int(blockIdx.x) * kRows;
  const int n_chunks = (a.k + kChunk - 1) / kChunk;
  const auto chunk = [warp](int i) { return gemv::chunk_of(warp, i); };

  float acc[R][4] = {};
  Step<R> cur;
  load_weights(cur, a, row0, chunk(0), g, t);  // earlier kernels in the stream do not write w
  ptx::wait_previous_kernel();                 // but they write x
  for (int i = 0; chunk(i) < n_chunks; i += kStep) {
    StepX<R> xs;
    load_x(xs, a, chunk(i), g, t);
    Step<R> next;
    load_weights(next, a, row0, chunk(i + kStep), g, t);  // in flight during this step's mma
    mma_step(acc, cur, xs);
    cur = next;
  }
  reduce_store<R>(part, acc, a, row0, warp, g, t);
}

// Staged weights: each warp streams its steps through a ring of S steps in shared memory
// (cp.async, S - 1 steps in flight while one is multiplied; 4 KiB per step and warp) where the
// register kernel keeps one step in flight. Each lane copies, waits for and reads only its own
// 16-byte slots (the same (g, t) positions as the register kernel), so no barrier is needed and
// the sums are the register kernel's, bit for bit. Dynamic shared memory: fp8_gemv_ring_bytes.
template <int R, int S, typename Out>
__global__ void __launch_bounds__(kThreads, 2) fp8_gemv_staged_kernel(const Fp8GemvArgs<Out> a) {
  constexpr int kRows = 16 * R, kStep = Step<R>::kChunks, kSlots = kStep * R * 2;  // uint4 per lane and step
  extern __shared__ uint4 ring[];  // [warp][stage][slot][lane]
  __shared__ float part[kWarps][kFp8GemvMaxRows][kRows + 4];
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32, g = lane / 4, t = lane % 4;
  const int row0 = int(blockIdx.x) * kRows;
  const int n_chunks = (a.k + kChunk - 1) / kChunk;
  const auto chunk = [warp](int i) { return gemv::chunk_of(warp, i); };
  uint4* const mine = ring + size_t(warp) * S * kSlots * 32 + lane;
  const auto issue = [&](int step) {  // the warp's step `step` (chunks from chunk(step * kStep)) into its stage
    const uint32_t base = uint32_t(__cvta_generic_to_shared(mine + (step % S) * kSlots * 32));
    const int c = chunk(step * kStep);
#pragma unroll
    for (int p = 0; p < kStep; ++p) {
      const int col = (c + p) * kChunk + 16 * t;
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = row0 + 16 * r + 8 * h + g;
          const bool in = row < a.m && col < a.k;
          gemv::cp_async_stream16(base + uint32_t(((p * R + r) * 2 + h) * 32 * 16),
                         in ? a.w + size_t(row) * a.k + col : a.w, in ? 16 : 0);
        }
    }
    ptx::cp_async_commit();
  };

  float acc[R][4] = {};
#pragma unroll
  for (int s = 0; s < S - 1; ++s) issue(s);  // earlier kernels in the stream do not write w
  ptx::wait_previous_kernel();               // but they write x
  for (int step = 0; chunk(step * kStep) < n_chunks; ++step) {
    issue(step + S - 1);  // past the end: zeros, no reads
    ptx::cp_async_wait<S - 1>();
    StepX<R> xs;
    load_x(xs, a, chunk(step * kStep), g, t);
    Step<R> cur;
    const uint4* slot = mine + (step % S) * kSlots * 32;
#pragma unroll
    for (int p = 0; p < kStep; ++p)
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) cur.w[p][r][h] = slot[((p * R + r) * 2 + h) * 32];
    mma_step(acc, cur, xs);
  }
  ptx::cp_async_wait<0>();  // no copy may land in the next block's shared memory
  reduce_store<R>(part, acc, a, row0, warp, g, t);
}

// Dynamic shared memory of the staged kernel: S steps of 4 KiB for each of the 8 warps.
constexpr int fp8_gemv_ring_bytes(int stages) { return stages * kWarps * 32 * 8 * 16; }

// m16 tiles per block, unless a variant says otherwise: 1. Wider tiles read x once for more rows (n / (8 R) bytes per weight byte,
// small either way) but give fewer, longer blocks; with the ring of fp8_gemv_stages, one tile is
// the fastest or within 3% at every 8B shape (H200 sweep, µs at n = 1 for 1 / 2 / 4 tiles, each
// with its best staging): m = 4096, k = 4096: 7.07 / 8.25 / 10.4; k = 14336: 17.2 / 19.9 / 31.1;
// m = 6144: 9.40 / 11.1 / 12.2; m = 28672: 31.5 / 34.2 / 39.8 (at n = 8 two tiles: 37.0 vs 37.9).
constexpr int kAutoTiles = 1;

// Weight staging: 0 (registers, one step ahead) or 2..4 (a shared-memory ring of that many steps).
// The ring of 2 where the grid takes more than one wave of two blocks per SM: with ~70 registers
// and 69 KiB of shared memory a third block fits on an SM, and many blocks keep every SM full;
// within one wave (m = 4096) the third slot makes SMs uneven (some get three blocks, some one)
// and the register kernel is faster. The H200 sweep (run_all.sh bench-fp8, µs at n = 1, one tile
// per block, registers / ring of 2 / 3 / 4): m = 6144, k = 4096: 11.3 / 9.40 / 11.3 / 12.6;
// m = 28672: 38.8 / 31.5 / 35.9 / 51.0; m = 4096, k = 4096: 7.07 / 8.09 / 7.63 / 8.90;
// k = 14336: 17.2 / 21.3 / 18.9 / 24.4.
int fp8_gemv_stages(int m, int tiles, int sm_count) {
  return (m + 16 * tiles - 1) / (16 * tiles) > 2 * sm_count ? 2 : 0;
}

// The GEMV is launched plainly (its griddepcontrol instructions are then no-ops) unless
// LYCHEE_FP8_GEMV_PDL=1, as the bf16 GEMV (bf16_gemv.cu): with PDL the FP8 decode step was 1-2%
// slower (8B shape, FP8 weights, batch 1, 128K, alternated twice on an H100: Full 9.81 against
// 9.68-9.69 ms, LycheeDecode 5.45 against 5.36; docs/results/fp8_gpu/pdl/).
template <typename Kernel, typename Args>
void launch_gemv(Kernel kernel, int grid, size_t smem, cudaStream_t stream, const Args& a) {
  static const bool pdl = gemv::env_setting("LYCHEE_FP8_GEMV_PDL", {1}) == 1;
  if (pdl)
    launch_pdl(kernel, grid, kThreads, smem, stream, a);
  else
    kernel<<<grid, kThreads, smem, stream>>>(a);
}

// One instantiation per (R, S, Out), so each staged kernel gets its own attribute call per
// device (more than 48 KiB of dynamic shared memory needs it).
template <int R, int S, typename Out>
void launch_staged(const Fp8GemvArgs<Out>& a, int grid, cudaStream_t stream) {
  static uint64_t attribute_set = 0;
  if (first_on_device(attribute_set))
    LY_CUDA_CHECK(cudaFuncSetAttribute(fp8_gemv_staged_kernel<R, S, Out>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       fp8_gemv_ring_bytes(S)));
  launch_gemv(fp8_gemv_staged_kernel<R, S, Out>, grid, size_t(fp8_gemv_ring_bytes(S)), stream, a);
}

template <int R, typename Out>
void launch_tiles(const Fp8GemvArgs<Out>& a, int stages, cudaStream_t stream) {
  const int grid = (a.m + 16 * R - 1) / (16 * R);
  switch (stages) {
    case 2: launch_staged<R, 2>(a, grid, stream); break;
    case 3: launch_staged<R, 3>(a, grid, stream); break;
    case 4: launch_staged<R, 4>(a, grid, stream); break;
    default: launch_gemv(fp8_gemv_kernel<R, Out>, grid, 0, stream, a); break;
  }
}

template <typename Out>
void launch(const Fp8GemvArgs<Out>& a, Fp8GemvVariant v, cudaStream_t stream) {
  // LYCHEE_FP8_GEMV_TILES=1|2|4 and LYCHEE_FP8_GEMV_STAGES=0|2|3|4 override kAutoTiles and
  // fp8_gemv_stages (gemv::env_setting).
  static const int env_tiles = gemv::env_setting("LYCHEE_FP8_GEMV_TILES", {1, 2, 4});
  static const int env_stages = gemv::env_setting("LYCHEE_FP8_GEMV_STAGES", {0, 2, 3, 4});
  const int sms = device_info().sm_count;
  const int tiles = v.tiles > 0 ? v.tiles : env_tiles > 0 ? env_tiles : kAutoTiles;
  const int stages = v.stages >= 0 ? v.stages : env_stages >= 0 ? env_stages : fp8_gemv_stages(a.m, tiles, sms);
  switch (tiles) {
    case 4: launch_tiles<4>(a, stages, stream); break;
    case 2: launch_tiles<2>(a, stages, stream); break;
    default: launch_tiles<1>(a, stages, stream); break;
  }
  LY_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace detail {

void launch_fp8_gemv(const bf16* x, const uint8_t* w, const float* w_scale, bf16* y, int n, int k, int m,
                     cudaStream_t stream, Fp8GemvVariant v) {
  launch(Fp8GemvArgs<bf16>{x, w, w_scale, y, n, k, m}, v, stream);
}

void launch_fp8_gemv_f32_out(const bf16* x, const uint8_t* w, const float* w_scale, float* y, int n, int k,
                             int m, cudaStream_t stream, Fp8GemvVariant v) {
  launch(Fp8GemvArgs<float>{x, w, w_scale, y, n, k, m}, v, stream);
}

}  // namespace detail
}  // namespace lychee::cuda
