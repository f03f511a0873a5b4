#include "runtime/membw.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/timer.h"

namespace lychee {

MemoryBandwidth measure_memory_bandwidth() {
  constexpr size_t kFloats = size_t(64) << 20;  // 256 MiB
  std::vector<float> a(kFloats, 1.0f), b(kFloats, 2.0f);
  MemoryBandwidth bw;
  bw.threads = omp_get_max_threads();
  double best_read = 1e30, best_copy = 1e30;
  volatile float sink = 0.0f;
  for (int rep = 0; rep < 5; ++rep) {
    Timer t;
    // Chunks of vectorised partial sums: bound by memory, not by the add latency (the same
    // loop shape as the CPU decode's matrix-vector product).
    constexpr size_t kChunk = 4096;
    float total = 0.0f;
#pragma omp parallel for reduction(+ : total) schedule(static)
    for (size_t c = 0; c < kFloats / kChunk; ++c) {
      const float* p = a.data() + c * kChunk;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (size_t i = 0; i < kChunk; ++i) acc += p[i];
      total += acc;
    }
    best_read = std::min(best_read, t.seconds());
    sink = sink + total;
    t.reset();
#pragma omp parallel
    {
      const size_t n_thr = size_t(omp_get_num_threads());
      const size_t id = size_t(omp_get_thread_num());
      const size_t chunk = (kFloats + n_thr - 1) / n_thr;
      const size_t begin = std::min(kFloats, id * chunk);
      const size_t end = std::min(kFloats, begin + chunk);
      std::memcpy(b.data() + begin, a.data() + begin, (end - begin) * sizeof(float));
    }
    best_copy = std::min(best_copy, t.seconds());
  }
  bw.read_gbps = double(kFloats) * sizeof(float) / best_read / 1e9;
  bw.copy_gbps = 2.0 * double(kFloats) * sizeof(float) / best_copy / 1e9;
  return bw;
}

}  // namespace lychee
