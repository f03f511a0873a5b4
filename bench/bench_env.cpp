#include "bench_env.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>

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

std::vector<long long> parse_numbers(const std::string& s) {
  std::vector<long long> v;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = std::min(s.find(',', start), s.size());
    const std::string item = s.substr(start, end - start);
    size_t used = 0;
    long long x = 0;
    try {
      x = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size()) throw std::invalid_argument("'" + item + "' in '" + s + "' is not an integer");
    v.push_back(x);
    start = end + 1;
  }
  return v;
}

}  // namespace lychee::bench
