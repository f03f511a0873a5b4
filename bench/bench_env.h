// What the GPU benchmarks stamp their results with, shared by the bench_*.cu programs.
#pragma once

#include <string>
#include <vector>

namespace lychee::bench {

// "CUDA driver API 13.0; NVRM version: ..." (the kernel module's line when /proc has it).
std::string driver_string();

// "1,4,16" -> {1, 4, 16}: a comma-separated list of integers (a command line's sizes or counts);
// std::invalid_argument naming the item for one that is not an integer.
std::vector<long long> parse_numbers(const std::string& s);

}  // namespace lychee::bench
