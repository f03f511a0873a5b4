// Warp and block reductions the row kernels share (inference kernels, the trainer's row kernels
// and attention rows). Device code only.
//
// The summation order is part of the contract: results are compared bit-exactly between runs
// and against earlier builds, so every reduction here is
//   1. a butterfly within each warp: v = op(v, shfl_xor(v, o)) for o = 16, 8, 4, 2, 1;
//   2. lane 0 of each warp stores its warp's value in part[warp];
//   3. warp 0 reads part[lane] (the identity for lanes >= the number of warps) and runs the
//      same butterfly; lane 0 broadcasts the result through shared memory.
// op(own, partner) is always called with the thread's own value first.
#pragma once

#include <cuda_runtime.h>

namespace lychee::cuda {

constexpr int kWarpSize = 32;
constexpr unsigned kFullWarp = 0xffffffffu;

__device__ __forceinline__ float shfl_xor(float v, int o) { return __shfl_xor_sync(kFullWarp, v, o); }
__device__ __forceinline__ float2 shfl_xor(float2 v, int o) {
  return make_float2(__shfl_xor_sync(kFullWarp, v.x, o), __shfl_xor_sync(kFullWarp, v.y, o));
}
__device__ __forceinline__ float4 shfl_xor(float4 v, int o) {
  return make_float4(__shfl_xor_sync(kFullWarp, v.x, o), __shfl_xor_sync(kFullWarp, v.y, o),
                     __shfl_xor_sync(kFullWarp, v.z, o), __shfl_xor_sync(kFullWarp, v.w, o));
}

// Component-wise sum; float2's components never mix, so a float2 sum is two float sums.
struct AddOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
  __device__ __forceinline__ float2 operator()(float2 a, float2 b) const { return make_float2(a.x + b.x, a.y + b.y); }
};

// Every lane of the (converged, full) warp gets op over the warp's 32 values.
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v = op(v, shfl_xor(v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, AddOp{}); }

// op over a block of blockDim.x threads (a multiple of 32, <= 1024); every thread gets it.
// `identity` fills warp 0's lanes beyond the number of warps. Every thread must call it (it
// has barriers); back-to-back calls are safe (the trailing barrier protects part/total).
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T identity) {
  __shared__ T part[kWarpSize];  // [n_warps] per-warp values
  __shared__ T total;
  v = warp_reduce(v, op);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T s = lane < int(blockDim.x / kWarpSize) ? part[lane] : identity;
    s = warp_reduce(s, op);
    if (lane == 0) total = s;
  }
  __syncthreads();
  const T r = total;
  __syncthreads();
  return r;
}

// Sum over the block of a float or float2 (two independent sums for the price of one set of
// barriers); every thread gets it.
template <typename T>
__device__ __forceinline__ T block_sum(T v) {
  return block_reduce(v, AddOp{}, T{});
}

}  // namespace lychee::cuda
