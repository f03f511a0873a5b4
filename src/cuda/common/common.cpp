#include "cuda/common/common.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <vector>

#include "core/error.h"

namespace lychee::cuda {

void fail_cuda(cudaError_t err, const char* expr, const char* file, int line) {
  fail(ErrorCode::kCuda, "CUDA error {} ({}: {}) in {} at {}:{}", int(err), cudaGetErrorName(err),
       cudaGetErrorString(err), expr, file, line);
}

void fail_cuda_msg(const char* what, int code, const char* file, int line) {
  fail(ErrorCode::kCuda, "{} failed with status {} at {}:{}", what, code, file, line);
}

bool cuda_available() { return cuda_device_status().empty(); }

std::string cuda_device_status() {
  auto error = [](const char* call, cudaError_t err) {
    return std::string(call) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  };
  int n = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&n); err != cudaSuccess) return error("cudaGetDeviceCount", err);
  if (n == 0) return "cudaGetDeviceCount: no CUDA device";
  // A counted device can still fail at context creation (driver mismatch, exclusive mode, ECC).
  if (const cudaError_t err = cudaFree(nullptr); err != cudaSuccess) return error("cudaFree(nullptr)", err);
  return "";
}

double device_copy_bandwidth_gbps() {
  const size_t n = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  LY_CUDA_CHECK(cudaMalloc(&a, n));
  LY_CUDA_CHECK(cudaMalloc(&b, n));
  LY_CUDA_CHECK(cudaMemset(a, 1, n));
  cudaEvent_t e0, e1;
  LY_CUDA_CHECK(cudaEventCreate(&e0));
  LY_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < 12; ++i) {
    LY_CUDA_CHECK(cudaEventRecord(e0));
    LY_CUDA_CHECK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    LY_CUDA_CHECK(cudaEventRecord(e1));
    LY_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    LY_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    if (i >= 2) ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  std::sort(ms.begin(), ms.end());
  return 2.0 * double(n) / (double(ms[ms.size() / 2]) * 1e-3) / 1e9;
}

const DeviceInfo& device_info() {
  static DeviceInfo info;
  static std::once_flag once;
  std::call_once(once, [] {
    LY_CUDA_CHECK(cudaGetDevice(&info.device));
    cudaDeviceProp p{};
    LY_CUDA_CHECK(cudaGetDeviceProperties(&p, info.device));
    info.sm_count = p.multiProcessorCount;
    info.l2_bytes = size_t(p.l2CacheSize);
    info.smem_per_block_optin = p.sharedMemPerBlockOptin;
    info.total_memory = p.totalGlobalMem;
    info.cc_major = p.major;
    info.cc_minor = p.minor;
    std::snprintf(info.name, sizeof info.name, "%s", p.name);
  });
  return info;
}

bool first_on_device(uint64_t& devices_done) {
  static std::mutex m;
  int d = 0;
  LY_CUDA_CHECK(cudaGetDevice(&d));
  const uint64_t bit = uint64_t(1) << (d & 63);
  std::lock_guard<std::mutex> lock(m);
  if ((devices_done & bit) != 0) return false;
  devices_done |= bit;
  return true;
}

}  // namespace lychee::cuda
