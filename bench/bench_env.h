// What the GPU benchmarks stamp their results with, shared by the bench_*.cu programs.
#pragma once

#include <string>

namespace lychee::bench {

// "CUDA driver API 13.0; NVRM version: ..." (the kernel module's line when /proc has it).
std::string driver_string();

}  // namespace lychee::bench
