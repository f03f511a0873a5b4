// Measures this machine's memory bandwidth (for the bounds that benchmarks report beside
// their timings).
#pragma once

namespace lychee {

struct MemoryBandwidth {
  double read_gbps = 0.0;  // streaming reads (a sum over a large array)
  double copy_gbps = 0.0;  // a large copy, counting bytes read plus bytes written
  int threads = 1;
};

// Uses buffers far larger than the caches (256 MiB); takes about a second.
MemoryBandwidth measure_memory_bandwidth();

}  // namespace lychee
