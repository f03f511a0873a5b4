// Kernel launches with programmatic dependent launch (PDL, sm_90): the grid may start while the
// previous kernel in the stream drains; griddepcontrol.wait inside the kernel (ptx.cuh
// grid_dependency_wait) keeps the data order, and is a no-op without PDL. LYCHEE_NO_PDL=1 in the
// environment launches plainly, for A/B timing.
#pragma once

#include <cstdlib>

#include "cuda/common/common.h"

namespace lychee::cuda {

template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                const Args&... args) {
  static const bool use_pdl = std::getenv("LYCHEE_NO_PDL") == nullptr;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = stream;
  cfg.attrs = use_pdl ? &attr : nullptr;
  cfg.numAttrs = use_pdl ? 1 : 0;
  LY_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), int grid, int block, size_t smem_bytes, cudaStream_t stream,
                const Args&... args) {
  launch_pdl(kernel, dim3(unsigned(grid)), dim3(unsigned(block)), smem_bytes, stream, args...);
}

}  // namespace lychee::cuda
