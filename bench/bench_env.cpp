#include "bench_env.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "attention/policies.h"
#include "core/log.h"

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

std::vector<std::string> parse_names(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) v.push_back(item);
  return v;
}

HeadRoles bench_roles(const ModelConfig& c, int n_retrieval) {
  return seeded_head_roles(c, std::clamp(n_retrieval, c.n_kv_heads, c.n_layers * c.n_kv_heads), 7);
}

DecodeSpec bench_policy(const std::string& name, const ModelConfig& c, int budget, int n_retrieval, int block_size) {
  if (name == "full") return full_spec(c);
  if (name == "tidal") return tidal_spec(c, budget, default_tidal_layers(c.n_layers), 2);
  if (name == "quest") return quest_spec(c, budget, 16, 2);
  const HeadRoles roles = bench_roles(c, n_retrieval);
  if (name == "duo") return duo_spec(c, roles, 64, budget - 64);
  if (name == "lychee") {
    SelectParams select;
    select.budget = budget;
    return lychee_spec(c, roles, block_size, select);
  }
  throw std::runtime_error("unknown policy " + name);
}

void show_info_logs() {
  if (log_level() > LogLevel::kInfo) set_log_level(LogLevel::kInfo);
}

}  // namespace lychee::bench
