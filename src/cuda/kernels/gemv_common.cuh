// The pieces the FP8 and bf16 decode GEMVs (fp8_gemv.cu, bf16_gemv.cu) share: 16-byte weight loads
// streamed past L1, their cp.async form, the exact e4m3 -> bf16 widening, the chunk-to-warp order of k, and the scatter of a warp's
// mma accumulators into the block's partial-sum table. Both kernels are blocks of 8 warps over m16
// tiles of weight rows, every warp over its own slabs of k, the 8 partial sums added in warp order.
// Device code, and the host's reading of their lab knobs (env_setting).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <initializer_list>

namespace lychee::cuda::gemv {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kSlab = 4;  // chunks per slab; slab s belongs to warp s % kWarps
constexpr int kMaxRows = 8;  // rows of x: the 8 columns of one mma.sync tile

// A lab knob of the GEMVs (A/B runs; every setting gives the same bits): the integer in the
// environment variable `name` when it is one of `allowed`, else -1 (unset, empty, "auto" or
// anything else: the automatic choice).
inline int env_setting(const char* name, std::initializer_list<int> allowed) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return -1;
  char* end = nullptr;
  const long r = std::strtol(v, &end, 10);
  if (*end != 0) return -1;
  for (const int a : allowed)
    if (r == a) return a;
  return -1;
}

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

// Word i of a uint4.
__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// e4m3 codes q = bytes (c0, c1, c2, c3) -> bf16 pairs lo = (c0, c2), hi = (c1, c3), exactly: the
// sign moved to bit 15 and the 7 magnitude bits under bf16's exponent and mantissa give
// value · 2^-120 for every code (subnormal codes become bf16 subnormals with the same factor); one
// bf16x2 multiply by 2^120 restores the value (exact; bf16 arithmetic keeps subnormals).
__device__ __forceinline__ void e4m3x4_to_bf16(uint32_t q, uint32_t& lo, uint32_t& hi) {
  constexpr uint32_t kSign = 0x80008000u, kTwoPow120 = 0x7B807B80u;  // 2^120 in both bf16 halves
  hi = mul_bf16x2((q & kSign) | ((q & 0x7F007F00u) >> 4), kTwoPow120);
  lo = mul_bf16x2(((q << 8) & kSign) | ((q & 0x007F007Fu) << 4), kTwoPow120);
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
