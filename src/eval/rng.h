// Deterministic sampling for the task generators. std::mt19937_64's output sequence is fixed by
// the standard, but std::uniform_int_distribution and std::shuffle are not (libstdc++ and libc++
// differ), so the selection below is written out by hand: a (spec, haystack) pair gives the same
// sample on every platform.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "core/error.h"

namespace lychee {

// splitmix64 of seed and a stream number: independent seeds for sub-streams of one sample.
inline uint64_t mix_seed(uint64_t seed, uint64_t stream) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (stream + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class SampleRng {
 public:
  explicit SampleRng(uint64_t seed) : engine_(seed) {}

  uint64_t next() { return engine_(); }

  // Uniform in [0, n), n > 0: rejection of the top partial range, so no modulo bias.
  uint64_t below(uint64_t n) {
    LY_ASSERT(n > 0);
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x = engine_();
    while (x >= limit) x = engine_();
    return x % n;
  }

  // Uniform in [lo, hi], inclusive; lo <= hi.
  int64_t between(int64_t lo, int64_t hi) {
    LY_ASSERT(lo <= hi);
    return lo + int64_t(below(uint64_t(hi - lo) + 1));
  }

  // Fisher-Yates, last element first.
  template <typename T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }

  // k distinct indices in [0, n), in the order drawn; k <= n.
  std::vector<size_t> distinct(size_t k, size_t n) {
    LY_ASSERT(k <= n);
    std::vector<size_t> pool(n);
    for (size_t i = 0; i < n; ++i) pool[i] = i;
    for (size_t i = 0; i < k; ++i) std::swap(pool[i], pool[i + below(n - i)]);
    pool.resize(k);
    return pool;
  }

 private:
  std::mt19937_64 engine_;
};

}  // namespace lychee
