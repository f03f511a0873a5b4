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

#include "trace_summary.h"

namespace lychee::bench {

class CuptiTrace {
 public:
  // Enables the activity kinds; records are collected until stop().
  void start();
  void stop();  // flushes; the records stay until the next start()
  const std::vector<TraceRecord>& records() const;
  // summarize_trace of the records (trace_summary.h): per-step figures over `steps` steps.
  nlohmann::json summary(int steps) const;
};

}  // namespace lychee::bench
