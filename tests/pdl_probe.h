// Test-only kernels for races under programmatic dependent launch (PDL, cuda/common/launch.cuh):
// a slow producer whose writes land milliseconds after the kernel behind it may have started,
// and a probe that records what it reads before and after its griddepcontrol.wait. With them a
// kernel that loads the producer's data before its wait reads the old values every time, not
// only when the scheduler happens to overlap the two (tests/test_cuda_decode_attention.cpp).
// Built into lychee_tests with the CUDA backend only (tests/CMakeLists.txt).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace lychee::test {

// dst[0, bytes) = src[0, bytes) (device memory; 4-byte aligned, bytes a multiple of 4).
struct CopyRange {
  void* dst;
  const void* src;
  uint32_t bytes;
};

// One CTA, launched plainly (so after everything before it in the stream): it lets the kernel
// after it launch at once (griddepcontrol.launch_dependents), spins for delay_ns on the GPU's
// global timer, then copies ranges[0, n_ranges) (an array in device memory). A kernel launched
// after it with PDL sees the destinations' old contents before its griddepcontrol.wait.
void launch_slow_producer(const CopyRange* ranges, int n_ranges, uint64_t delay_ns, cudaStream_t stream);

// One CTA, launched with PDL as the engine's kernels are (cuda::launch_pdl): copies src[0, bytes)
// to before[] ahead of its griddepcontrol.wait and to after[] past it, then lets its dependents
// launch (ptx::wait_previous_kernel). Loads bypass L1 (ld.global.cg). bytes a multiple of 4.
void launch_pdl_probe(const void* src, void* before, void* after, uint32_t bytes, cudaStream_t stream);

}  // namespace lychee::test
