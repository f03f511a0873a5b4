// Test-only kernels for PDL races: see pdl_probe.h.
#include "pdl_probe.h"

#include "cuda/common/common.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"

namespace lychee::test {
namespace {

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

__global__ void slow_producer_kernel(const CopyRange* ranges, int n_ranges, uint64_t delay_ns) {
  cuda::ptx::grid_launch_dependents();  // first: the kernel after this one may start now
  if (threadIdx.x == 0) {
    const uint64_t t0 = global_ns();
    while (global_ns() - t0 < delay_ns) {
    }
  }
  __syncthreads();
  for (int r = 0; r < n_ranges; ++r) {
    const auto* src = static_cast<const uint32_t*>(ranges[r].src);
    auto* dst = static_cast<uint32_t*>(ranges[r].dst);
    for (uint32_t i = threadIdx.x; i < ranges[r].bytes / 4; i += blockDim.x) dst[i] = src[i];
  }
}

__global__ void pdl_probe_kernel(const uint32_t* src, uint32_t* before, uint32_t* after, uint32_t n) {
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) before[i] = __ldcg(src + i);
  cuda::ptx::wait_previous_kernel();
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) after[i] = __ldcg(src + i);
}

}  // namespace

void launch_slow_producer(const CopyRange* ranges, int n_ranges, uint64_t delay_ns, cudaStream_t stream) {
  slow_producer_kernel<<<1, 256, 0, stream>>>(ranges, n_ranges, delay_ns);
  LY_CUDA_CHECK(cudaGetLastError());
}

void launch_pdl_probe(const void* src, void* before, void* after, uint32_t bytes, cudaStream_t stream) {
  cuda::launch_pdl(pdl_probe_kernel, 1, 256, 0, stream, static_cast<const uint32_t*>(src),
                   static_cast<uint32_t*>(before), static_cast<uint32_t*>(after), bytes / 4);
}

}  // namespace lychee::test
