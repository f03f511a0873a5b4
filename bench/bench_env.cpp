#include "bench_env.h"

#include <cuda_runtime.h>

#include <cstdio>

namespace lychee::bench {

std::string driver_string() {
  int v = 0;
  cudaDriverGetVersion(&v);
  std::string s = "CUDA driver API " + std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  if (FILE* f = std::fopen("/proc/driver/nvidia/version", "r")) {
    char line[512] = {};
    if (std::fgets(line, sizeof line, f)) {
      std::string l(line);
      while (!l.empty() && (l.back() == '\n' || l.back() == ' ')) l.pop_back();
      s += "; " + l;
    }
    std::fclose(f);
  }
  return s;
}

}  // namespace lychee::bench
