// The CUDA backend's entry points, for backends.cpp only (compiled only with CUDA; see
// backend.h for what each does).
#pragma once

#include <memory>
#include <string>

#include "runtime/backend.h"

namespace lychee {

std::unique_ptr<Backend> make_cuda_backend(const Checkpoint& ck, const BackendOptions& o);
std::string cuda_backend_unsupported(const DecodeSpec& spec, const ModelConfig& c, int page_size);
std::string cuda_backend_device_status();
std::unique_ptr<train::Student> make_cuda_student(const ModelConfig& c, const HostWeights& w,
                                                  const train::StudentOptions& options, int max_context,
                                                  int max_targets);

}  // namespace lychee
