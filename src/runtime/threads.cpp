#include "runtime/threads.h"

#include <cblas.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

namespace lychee {

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return std::max(1, int(std::thread::hardware_concurrency()));
}

int resolve_compute_threads(int requested) { return requested > 0 ? requested : available_cores(); }

namespace {
int g_threads = 0;
}

int set_compute_threads(int n) {
  g_threads = resolve_compute_threads(n);
  omp_set_num_threads(g_threads);
  openblas_set_num_threads(g_threads);
  return g_threads;
}

int compute_threads() { return g_threads > 0 ? g_threads : omp_get_max_threads(); }

void reexec_with_short_spin_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (setenv("GOMP_SPINCOUNT", "1000", 1) != 0) return;
  execv("/proc/self/exe", argv);
  // exec failed (no /proc): carry on with libgomp's default waiting.
}

}  // namespace lychee
