// The CUDA backend's entry points, for backends.cpp only (compiled only with CUDA; see
// backend.h for what each does).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/backend.h"

namespace lychee {

std::unique_ptr<Backend> make_cuda_backend(const Checkpoint& ck, const BackendOptions& o);
std::string cuda_backend_unsupported(const DecodeSpec& spec, const ModelConfig& c, int page_size);
std::string cuda_backend_device_status();
// After cuda_backend_device_status() found a usable device: "" when this build's kernels run on the
// current device, else why not (build_info.h's cuda_arch_mismatch, naming the GPU).
std::string cuda_backend_arch_status();
// build_info.h's gpu_library_versions.
std::vector<std::pair<std::string, std::string>> cuda_backend_library_versions();
std::unique_ptr<train::Student> make_cuda_student(const ModelConfig& c, const HostWeights& w,
                                                  const train::StudentOptions& options, int max_context,
                                                  int max_targets);
GpuStudentRanks make_cuda_student_ranks(const ModelConfig& c, const HostWeights& w,
                                        const train::StudentOptions& options, int max_context, int max_targets,
                                        std::span<const int> rank_devices, bool prefill_bf16,
                                        bool teacher_bf16);

}  // namespace lychee
