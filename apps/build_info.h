// What this binary is, for `lychee --version`: the values cmake/BuildInfo.cmake writes into the
// generated build_info.cpp at build time.
#pragma once

#include <string>

namespace lychee::app {

extern const char* const kVersion;    // CMake's project version, e.g. "0.1.0"
extern const char* const kGitCommit;  // e.g. "6924a7f3c1d2", "6924a7f3c1d2-dirty"; "unknown" outside git
extern const char* const kBuildType;  // CMAKE_BUILD_TYPE
extern const char* const kCompiler;   // e.g. "GNU 12.2.0"

// The --version text: version, commit, build, and the GPU side (CUDA runtime, driver, cuDNN,
// NCCL, architectures built) or that this build is CPU-only.
std::string version_text();

}  // namespace lychee::app
