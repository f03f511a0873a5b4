// The pieces the FP8 and bf16 decode GEMVs (fp8_gemv.cu, bf16_gemv.cu) share: 16-byte weight loads
// streamed past L1, their cp.async form, the chunk-to-warp order of k, and the scatter of a warp's
// mma accumulators into the block's partial-sum table. Both kernels are blocks of 8 warps over m16
// tiles of weight rows, every warp over its own slabs of k, the 8 partial sums added in warp order.
// Device code only.
#pragma once

#include <cstdint>

namespace lychee::cuda::gemv {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kSlab = 4;  // chunks per slab; slab s belongs to warp s % kWarps
constexpr int kMaxRows = 8;  // rows of x: the 8 columns of one mma.sync tile

// 16 weight bytes, read once: not allocated in L1 (x lives there); L2 fetches the aligned 256
// bytes around them, the warp's slab of the row when rows are long enough (its next steps hit L2).
__device__ __forceinline__ uint4 load_stream16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// 16 bytes global -> shared, past L1, 256-byte L2 fetches; src_bytes = 0 writes zeros and reads
// nothing. The "memory" clobber keeps the compiler from moving this lane's shared reads of the
// slot across the copy that refills it.
__device__ __forceinline__ void cp_async_stream16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}

// The warp's i-th chunk of k: slabs warp, warp + kWarps, ... of kSlab chunks each, so a row's sum
// runs in the same order whatever the tile width.
__device__ __forceinline__ int chunk_of(int warp, int i) { return (warp + kWarps * (i / kSlab)) * kSlab + i % kSlab; }

// A warp's m16n8 accumulators of R tiles into part[warp][x row][tile row]: lane (g, t) holds (row
// g, x rows 2t, 2t + 1), then row g + 8. The caller synchronises before reading.
template <int R, int kStride>
__device__ __forceinline__ void scatter_partials(float (&part)[kWarps][kMaxRows][kStride], const float (&acc)[R][4],
                                                 int warp, int g, int t) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    part[warp][2 * t][16 * r + g] = acc[r][0];
    part[warp][2 * t + 1][16 * r + g] = acc[r][1];
    part[warp][2 * t][16 * r + g + 8] = acc[r][2];
    part[warp][2 * t + 1][16 * r + g + 8] = acc[r][3];
  }
}

}  // namespace lychee::cuda::gemv
