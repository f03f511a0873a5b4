// Shared CUDA helpers: error checking that throws lychee::Error(kCuda) naming the call, file and
// line, the bf16 type, and device facts. Kept free of fmt so every .cu file can include it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace lychee::cuda {

using bf16 = __nv_bfloat16;

[[noreturn]] void fail_cuda(cudaError_t err, const char* expr, const char* file, int line);
[[noreturn]] void fail_cuda_msg(const char* what, int code, const char* file, int line);

struct DeviceInfo {
  int device = 0;
  int sm_count = 0;
  size_t l2_bytes = 0;
  size_t smem_per_block_optin = 0;
  size_t smem_per_sm = 0;
  size_t total_memory = 0;
  int cc_major = 0, cc_minor = 0;
  char name[256] = {};
};

// The current device's properties (queried once).
const DeviceInfo& device_info();
// Whether a CUDA device is usable in this process.
bool cuda_available();
// "" when a CUDA device is usable (counted and a context created on it), else the CUDA error
// that stops it, e.g. "cudaGetDeviceCount: cudaErrorInsufficientDriver (CUDA driver version is
// insufficient for CUDA runtime version)" or "cudaGetDeviceCount: no CUDA device".
std::string cuda_device_status();
// Device-to-device copy bandwidth in GB/s counting bytes read plus written (median of 10 copies of
// 1 GiB, or of a third of the free memory where less is free; Error(kCapacity) below 4x the L2).
double device_copy_bandwidth_gbps();

// Whether this is the first call for the current CUDA device with this flag set (each device
// bit set once): what a kernel's one-time cudaFuncSetAttribute needs, since function
// attributes live in each device's context (tensor parallelism launches on several devices).
// Thread-safe; devices 0..63.
bool first_on_device(uint64_t& devices_done);

}  // namespace lychee::cuda

#define LY_CUDA_CHECK(expr)                                                 \
  do {                                                                      \
    cudaError_t ly_err_ = (expr);                                           \
    if (ly_err_ != cudaSuccess)                                             \
      ::lychee::cuda::fail_cuda(ly_err_, #expr, __FILE__, __LINE__);        \
  } while (0)

// After a kernel launch: catches launch-configuration errors without synchronising.
#define LY_CUDA_CHECK_LAUNCH() LY_CUDA_CHECK(cudaGetLastError())
