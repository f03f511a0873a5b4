// A trace's records (kernels, copies and memsets on a device; synchronising and other runtime
// calls on the host) and their per-step summary: kernel time by name, each name's exposed time,
// device busy time and idle gaps, host calls. CuptiTrace (cupti_trace.h) collects the records;
// the summary is a pure function of them.
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

// Per step over `steps` steps: span (first device start to last end), device busy (the union of
// the device records' intervals) and idle (the gaps inside the span, and those over 5 µs), and per
// name its own time, calls and exposed time: what its records add to the union taken in start
// order (a record starting inside an earlier one adds only its part past that one's end), i.e.
// its share of the critical path when a kernel starts while its predecessor drains (PDL). Host
// calls by name (synchronising ones apart). With records of several devices, the same per device.
nlohmann::json summarize_trace(const std::vector<TraceRecord>& records, int steps);

}  // namespace lychee::bench
