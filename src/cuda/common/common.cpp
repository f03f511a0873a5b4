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
  // 1 GiB copies, or less where a runner already holds the memory (its KV pool leaves ~2 GiB: a
  // probe after the runs must not fail for want of 2 GiB), but never copies L2 could hold.
  size_t free_b = 0, total_b = 0;
  LY_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t mib = size_t(1) << 20;
  const size_t least = std::max<size_t>(64 * mib, 4 * device_info().l2_bytes);
  const size_t n = std::min<size_t>(size_t(1) << 30, free_b / 3 / mib * mib);
  LY_CHECK(n >= least, ErrorCode::kCapacity,
           "bandwidth probe: two copies of {} MiB need more than the {} MiB this GPU has free", least / mib,
           free_b / mib);
  struct Buffers {  // freed on every path (a failed launch throws)
    void* a = nullptr;
    void* b = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    ~Buffers() {
      cudaFree(a);
      cudaFree(b);
      if (e0 != nullptr) cudaEventDestroy(e0);
      if (e1 != nullptr) cudaEventDestroy(e1);
    }
  } m;
  LY_CUDA_CHECK(cudaMalloc(&m.a, n));
  LY_CUDA_CHECK(cudaMalloc(&m.b, n));
  LY_CUDA_CHECK(cudaMemset(m.a, 1, n));
  LY_CUDA_CHECK(cudaEventCreate(&m.e0));
  LY_CUDA_CHECK(cudaEventCreate(&m.e1));
  std::vector<float> ms;
  for (int i = 0; i < 12; ++i) {
    LY_CUDA_CHECK(cudaEventRecord(m.e0));
    LY_CUDA_CHECK(cudaMemcpy(m.b, m.a, n, cudaMemcpyDeviceToDevice));
    LY_CUDA_CHECK(cudaEventRecord(m.e1));
    LY_CUDA_CHECK(cudaEventSynchronize(m.e1));
    float t = 0;
    LY_CUDA_CHECK(cudaEventElapsedTime(&t, m.e0, m.e1));
    if (i >= 2) ms.push_back(t);
  }
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
    info.smem_per_sm = p.sharedMemPerMultiprocessor;
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
