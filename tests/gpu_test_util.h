// Helpers shared by the GPU tests (test_cuda_*.cpp): the require-a-GPU check and host <-> device
// copies. The check builds without CUDA too, for the placeholders of a build without nvcc.
//
// Without a usable device a GPU test is skipped with the CUDA error in the message; with
// LYCHEE_REQUIRE_GPU=1 (set by scripts/gpu/run_all.sh on the GPU machine) it fails instead, so a
// broken driver there cannot turn the GPU suite into a green run of skips.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "test_util.h"  // gpu_required(), LY_REQUIRE_DEFAULT_MODEL

#ifdef LYCHEE_HAS_CUDA
#include "core/dtype.h"
#include "cuda/common/common.h"
#include "cuda/common/device_buffer.h"
#include "cuda/common/nccl_comm.h"
#endif

namespace lychee::test {

// ‖gpu − cpu‖ / ‖cpu‖ on a model's logits when both read the same tokens. The GPU rounds weights
// and every matrix-product input to bf16 (8-bit significand: unit roundoff 2^-9 ≈ 2e-3, ≈ 1.1e-3
// rms per rounding) and accumulates in f32 (6e-8, negligible); the CPU is f32 throughout. Each
// layer adds a few such roundings to the residual stream, independently, so the error grows like
// sqrt(number of roundings): about 4 · sqrt(30 layers) · 1.1e-3 ≈ 2.4e-2 at the default model's
// depth, less on the tiny models. Shared by test_cuda_model.cpp and test_cuda_hybrid.cpp.
constexpr double kBf16LogitsTol = 3e-2;

// The token sequence of the GPU-vs-CPU logits test (test_cuda_model.cpp, CudaTinyParity) and of
// the bf16 weight format's cost on the CPU (test_model_parity.cpp, Bf16WeightsCost): 40 tokens,
// the first kParityPrefill prefilled, then one decode step per token.
constexpr size_t kParityPrefill = 30;
inline std::vector<int32_t> parity_sequence(int vocab) {
  std::vector<int32_t> ids(40);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 31 + 7) % size_t(vocab));
  return ids;
}

// Why GPU tests cannot run in this process; "" when they can. Asked once.
inline const std::string& gpu_unusable_reason() {
#ifdef LYCHEE_HAS_CUDA
  static const std::string why = cuda::cuda_device_status();
#else
  static const std::string why = "the CUDA backend was not built (no nvcc)";
#endif
  return why;
}

}  // namespace lychee::test

// First statement of every GPU test: passes through when a device is usable, else skips (or,
// with LYCHEE_REQUIRE_GPU=1, fails) naming the CUDA error.
#define LY_REQUIRE_GPU()                                                                            \
  if (const std::string& ly_why_ = ::lychee::test::gpu_unusable_reason(); ly_why_.empty()) {        \
  } else if (::lychee::test::gpu_required())                                                        \
    FAIL() << "LYCHEE_REQUIRE_GPU=1 but no usable CUDA device: " << ly_why_;                        \
  else                                                                                              \
    GTEST_SKIP() << "no usable CUDA device (" << ly_why_ << "): GPU test skipped"

// The placeholder test of a file whose tests need the CUDA build: a visible skip naming what did
// not run (a failure with LYCHEE_REQUIRE_GPU=1).
#define LY_CUDA_NOT_BUILT(what)                                                                   \
  if (::lychee::test::gpu_required())                                                             \
    FAIL() << "LYCHEE_REQUIRE_GPU=1 but the CUDA backend was not built: " << what << " did not run"; \
  else                                                                                            \
    GTEST_SKIP() << "CUDA backend not built (no nvcc): " << what << " skipped"

#ifdef LYCHEE_HAS_CUDA
// Passes through when this build links NCCL; else skips (or, with LYCHEE_REQUIRE_GPU=1, fails:
// the GPU machine's toolkit ships NCCL) saying that `what` did not run.
#define LY_REQUIRE_NCCL_BUILD(what)                                                               \
  if (::lychee::cuda::nccl_built()) {                                                             \
  } else                                                                                          \
    LY_SKIP_OR_FAIL_WITHOUT(std::string("this build does not link NCCL (no nccl.h / libnccl at "    \
                                        "configure time): ") + (what) + " did not run")

namespace lychee::test {

// CUDA devices this process sees (0 when it sees none or CUDA reports an error): the multi-GPU
// tests skip below 2.
inline int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// A device copy of v (at least one element, so that an empty list still has an address).
template <typename T>
cuda::DeviceBuffer<T> to_device(std::span<const T> v) {
  cuda::DeviceBuffer<T> d(std::max<size_t>(v.size(), 1));
  if (!v.empty()) LY_CUDA_CHECK(cudaMemcpy(d.data(), v.data(), v.size_bytes(), cudaMemcpyHostToDevice));
  return d;
}
template <typename T>
cuda::DeviceBuffer<T> to_device(const std::vector<T>& v) {
  return to_device(std::span<const T>(v));
}

// The first n elements of d (all of them by default).
template <typename T>
std::vector<T> to_host(const cuda::DeviceBuffer<T>& d, size_t n) {
  std::vector<T> v(n);
  if (n > 0) LY_CUDA_CHECK(cudaMemcpy(v.data(), d.data(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}
template <typename T>
std::vector<T> to_host(const cuda::DeviceBuffer<T>& d) {
  return to_host(d, d.size());
}

// bf16 values given as their bits ([n] bf16 bits -> [n] bf16 on the device), and back.
inline cuda::DeviceBuffer<cuda::bf16> to_device_bf16_bits(std::span<const uint16_t> bits) {
  static_assert(sizeof(cuda::bf16) == sizeof(uint16_t));
  cuda::DeviceBuffer<cuda::bf16> d(std::max<size_t>(bits.size(), 1));
  if (!bits.empty()) LY_CUDA_CHECK(cudaMemcpy(d.data(), bits.data(), bits.size_bytes(), cudaMemcpyHostToDevice));
  return d;
}
inline std::vector<uint16_t> to_host_bf16_bits(const cuda::DeviceBuffer<cuda::bf16>& d) {
  std::vector<uint16_t> bits(d.size());
  if (!bits.empty()) LY_CUDA_CHECK(cudaMemcpy(bits.data(), d.data(), d.bytes(), cudaMemcpyDeviceToHost));
  return bits;
}

// f32 values rounded to bf16 on the way up; bf16 widened to f32 on the way down.
inline cuda::DeviceBuffer<cuda::bf16> to_device_bf16(std::span<const float> v) {
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = f32_to_bf16(v[i]);
  return to_device_bf16_bits(bits);
}
inline std::vector<float> to_host_bf16(const cuda::DeviceBuffer<cuda::bf16>& d) {
  const std::vector<uint16_t> bits = to_host_bf16_bits(d);
  std::vector<float> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = bf16_to_f32(bits[i]);
  return v;
}

}  // namespace lychee::test
#endif  // LYCHEE_HAS_CUDA
