// What this build is: the CUDA architectures its kernels were compiled for and the versions of the
// GPU libraries it runs with (`lychee --version`), and the check that a GPU is one of those
// architectures, made before any kernel runs (backends.cpp's cuda_device_status).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace lychee {

// CMAKE_CUDA_ARCHITECTURES as configured, e.g. "90a" or "80-real;90a"; "" in a build without CUDA.
std::string cuda_architectures();

// Why kernels built for `archs` (CMAKE_CUDA_ARCHITECTURES' syntax: "90a", "86", "80-real",
// "90-virtual", "100f", entries split by ';' or ',') cannot run on a GPU of compute capability
// major.minor, or "" when one of them can. The rules are nvcc's: "XY" builds SASS sm_XY and PTX
// compute_XY; SASS runs on the same major with a minor >= Y, PTX (JIT-compiled) on any capability
// >= X.Y; "-real" is the SASS alone, "-virtual" the PTX alone; "XYa" runs on X.Y only; "XYf" on
// the same major with a minor >= Y. "native", "all" and "all-major" are not checked (""), nor is
// an empty list.
std::string cuda_arch_mismatch(const std::string& archs, int major, int minor);

// (library, version) pairs for --version: the CUDA runtime (and the version built with), the
// driver, cuDNN and NCCL; empty in a build without CUDA.
std::vector<std::pair<std::string, std::string>> gpu_library_versions();

}  // namespace lychee
