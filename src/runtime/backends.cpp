// Which backends this build has: the one file that knows whether the CUDA backend was compiled
// (LYCHEE_HAS_CUDA is defined for this layer only when it was; see src/CMakeLists.txt).
#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "runtime/backend.h"
#ifdef LYCHEE_HAS_CUDA
#include "runtime/cuda_backend.h"
#endif

namespace lychee {

namespace {

// "" when CUDA reaches a device (counted, a context created), else why not.
std::string device_reachable_status() {
#ifdef LYCHEE_HAS_CUDA
  return cuda_backend_device_status();
#else
  return "this build has no CUDA backend (nvcc was not found at configure time)";
#endif
}

}  // namespace

std::string cuda_device_status() {
  std::string status = device_reachable_status();
#ifdef LYCHEE_HAS_CUDA
  // Before any kernel: a GPU this build has no kernels for is refused here, by name, instead of
  // failing at the first launch with cudaErrorNoKernelImageForDevice.
  if (status.empty()) status = cuda_backend_arch_status();
#endif
  return status;
}

std::string resolve_device(const std::string& requested) {
  LY_CHECK(requested == "auto" || requested == "cpu" || requested == "cuda", ErrorCode::kInvalidArgument,
           "--device: must be auto, cpu or cuda, got '{}'", requested);
  if (requested == "cpu") return requested;
  const std::string status = cuda_device_status();
  if (requested == "auto") {
    // A GPU is there but this build cannot use it: said, since its owner expects it used.
    if (!status.empty() && device_reachable_status().empty()) LY_LOG_WARN("{}; running on the CPU (--device auto)", status);
    return status.empty() ? "cuda" : "cpu";
  }
  LY_CHECK(status.empty(), ErrorCode::kUnsupported, "--device cuda: {}", status);
  return requested;
}

std::unique_ptr<Backend> make_backend(const std::string& device, const Checkpoint& ck, const BackendOptions& o) {
  LY_CHECK(o.random_shape == nullptr || device == "cuda", ErrorCode::kUnsupported,
           "random weights (--random-weights) run on the GPU only (--device cuda)");
  LY_CHECK(o.gpu_weights == GpuWeightFormat::kBf16 || device == "cuda", ErrorCode::kInvalidArgument,
           "--weights {} is a GPU weight format and this backend is the CPU; the CPU reference's FP8 weights "
           "are --cpu-weights fp8", gpu_weight_format_name(o.gpu_weights));
  if (device == "cpu") return make_cpu_backend(ck, o.cpu_weights, o.fp8_keep, o.kv_cache_dtype);
#ifdef LYCHEE_HAS_CUDA
  if (device == "cuda") return make_cuda_backend(ck, o);
#else
  (void)o;
#endif
  fail(ErrorCode::kUnsupported, "no '{}' backend in this build (resolve the device first)", device);
}

std::string cuda_unsupported(const DecodeSpec& spec, const ModelConfig& c, int page_size) {
#ifdef LYCHEE_HAS_CUDA
  return cuda_backend_unsupported(spec, c, page_size);
#else
  (void)spec, (void)c, (void)page_size;
  return cuda_device_status();
#endif
}

std::unique_ptr<train::Student> make_gpu_student(const ModelConfig& c, const HostWeights& w,
                                                 const train::StudentOptions& options, int max_context,
                                                 int max_targets) {
#ifdef LYCHEE_HAS_CUDA
  return make_cuda_student(c, w, options, max_context, max_targets);
#else
  (void)c, (void)w, (void)options, (void)max_context, (void)max_targets;
  fail(ErrorCode::kUnsupported, "--device cuda: {}", cuda_device_status());
#endif
}

GpuStudentRanks make_gpu_student_ranks(const ModelConfig& c, const HostWeights& w,
                                       const train::StudentOptions& options, int max_context, int max_targets,
                                       std::span<const int> rank_devices, bool prefill_bf16,
                                       bool teacher_bf16) {
#ifdef LYCHEE_HAS_CUDA
  return make_cuda_student_ranks(c, w, options, max_context, max_targets, rank_devices, prefill_bf16,
                                 teacher_bf16);
#else
  (void)c, (void)w, (void)options, (void)max_context, (void)max_targets, (void)rank_devices, (void)prefill_bf16;
  (void)teacher_bf16;
  fail(ErrorCode::kUnsupported, "--device cuda: {}", cuda_device_status());
#endif
}

}  // namespace lychee
