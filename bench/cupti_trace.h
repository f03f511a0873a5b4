// A timeline of a benchmark's GPU work through CUPTI's activity API (Nsight Systems is not on the
// GPU machine): every kernel, copy and memset on the device, and every synchronising runtime call
// (stream/event/device synchronize, blocking copies) on the host, between start() and stop().
// summary() folds it per step: kernel time by name, launches, device busy time and the idle gaps
// between the first and last activity, and the host waits. Used by bench_e2e --trace.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lychee::bench {

struct TraceRecord {
  enum Kind { kKernel, kMemcpy, kMemset, kSync, kRuntime } kind;
  std::string name;  // kernel name (demangled), copy direction, or runtime function
  uint64_t start_ns = 0, end_ns = 0;
  uint64_t bytes = 0;  // copies and memsets
  int device = -1;     // CUDA device of a kernel, copy or memset (-1: a host call)
};

class CuptiTrace {
 public:
  // Enables the activity kinds; records are collected until stop().
  void start();
  void stop();  // flushes; the records stay until the next start()
  const std::vector<TraceRecord>& records() const;
  // Per-step figures over `steps` steps of the traced interval: kernel time per name (µs per
  // step, launches per step), device busy and idle µs per step, host synchronisations per step.
  nlohmann::json summary(int steps) const;
};

}  // namespace lychee::bench
