// Block-wide radix select over order-preserving 32-bit keys of floats: the k-th largest of a set
// in four passes of 8 bits, the highest digit first. Each pass builds a 256-bin histogram of the
// candidates whose decided digits match (RadixCount), then one warp finds the bin holding the
// rank still wanted, counted from the largest (radix_find_bin). Sampling's top-k, the hybrid
// decode's selection (top-k / ratio by count, top-p by probability mass) and the trainer's
// top-k sets use it. Device code only.
//
// The result is exact and independent of thread timing for counts (integer sums). For a
// weighted walk (top-p) the float masses are summed in bin order by a warp scan.
#pragma once

#include <cstdint>

#include "cuda/common/reduce.cuh"

namespace lychee::cuda {

// a > b as floats  <=>  radix_key(a) > radix_key(b), for non-NaN a, b; the map is a bijection.
// -0 and +0 get distinct keys (-0 = 0x7fffffff just below +0 = 0x80000000), so they do NOT tie:
// callers for which they must tie pass x + 0.0f (−0 + 0 = +0 under round-to-nearest). NaNs get
// keys too (+NaN above +inf, -NaN below -inf), so every value has a place in the order and the
// select never loses a candidate.
__device__ __forceinline__ uint32_t radix_key(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
// The float whose key is k (inverse of radix_key).
__device__ __forceinline__ float radix_key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// The digits decided so far: a key is still a candidate while (key & mask) == prefix; the pass
// now decides bits shift .. shift + 7 (shift = 24, 16, 8, 0; -8 when the key is complete).
struct RadixPrefix {
  uint32_t prefix = 0u, mask = 0u;
  int shift = 24;
  __device__ __forceinline__ bool matches(uint32_t key) const { return (key & mask) == prefix; }
  __device__ __forceinline__ uint32_t digit(uint32_t key) const { return (key >> shift) & 0xffu; }
  __device__ __forceinline__ void descend(uint32_t bin) {
    prefix |= bin << shift;
    mask |= 0xffu << shift;
    shift -= 8;
  }
};

// How a pass counts its candidates into the shared histogram. Per lane: one shared atomic per
// candidate, in a plain strided loop. Warp-aggregated (radix_hist_add_warp): one atomic per
// distinct bin of the warp, which pays where many lanes of a warp hit the same bin (the
// trainer's group-summed rows). On an H100 the aggregated form was slower for sampling's
// 152k-logit rows (369 vs 317 us, batch 8, top-k 50) and the decode selection's 32k-unit rows
// (116 vs 109 us, 4 x 8 rows, top-k): those count per lane.
enum class RadixCount { kPerLane, kWarpAggregated };

// hist[bin] += 1 for every active lane, one shared atomic per distinct bin of the warp. Called
// by all 32 lanes of each warp (1-D block, blockDim.x a multiple of 32); lanes that diverged
// before are reconverged by the *_sync intrinsics.
__device__ __forceinline__ void radix_hist_add_warp(uint32_t* hist, bool active, uint32_t bin) {
  if (!__any_sync(kFullWarp, active)) return;  // after the first pass most warps hold no candidate
  const uint32_t peers = __match_any_sync(kFullWarp, active ? bin : 0x100u);
  if (active && int(threadIdx.x % kWarpSize) == __ffs(peers) - 1) atomicAdd(&hist[bin], uint32_t(__popc(peers)));
}

template <typename T>
struct RadixBin {
  uint32_t bin;    // the digit whose bin holds the rank
  T rank;          // the rank left within that bin (weighted: the weight still wanted)
  uint32_t count;  // candidates in that bin
};

namespace radix_detail {

// Warp 0 scans the bins from 255 down: lane l owns bins 255 - 8l .. 248 - 8l (8 per lane, in
// registers), a shuffle scan gives each lane the weight of the bins above its own, then the
// lane walks its 8. The chosen bin is the first non-empty one (from the top) where the weight
// from the top through it reaches `rank`; the lowest lane with such a bin wins (ballot), so the
// choice is unique even where a float scan is not monotone to the last ulp. None reaches it
// (float rounding in a weighted walk): the lowest non-empty bin, the rest of the weight wanted
// there. No candidate at all (or, for counts, a rank above their number, which the callers
// never ask for): bin 0, rank unchanged.
template <typename T, bool kWeighted>
__device__ RadixBin<T> find_bin(const uint32_t* count, const T* weight, T rank) {
  __shared__ RadixBin<T> result;
  if (threadIdx.x < kWarpSize) {
    const int lane = int(threadIdx.x);
    uint32_t c[8];
    T w[8], sum = T(0);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      c[i] = count[255 - 8 * lane - i];
      if constexpr (kWeighted) w[i] = weight[255 - 8 * lane - i];
      else w[i] = T(c[i]);
      sum += w[i];
    }
    T incl = sum;  // weight of bins 255 down to 248 - 8 lane
#pragma unroll
    for (int o = 1; o < kWarpSize; o <<= 1) {
      const T v = __shfl_up_sync(kFullWarp, incl, o);
      if (lane >= o) incl += v;
    }
    T cum = __shfl_up_sync(kFullWarp, incl, 1);  // weight of the bins above this lane's
    if (lane == 0) cum = T(0);
    RadixBin<T> hit{0u, T(0), 0u}, low{0u, T(0), 0u};
    bool has_hit = false, has_low = false;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (c[i] > 0u) {
        const RadixBin<T> here{uint32_t(255 - 8 * lane - i), rank - cum, c[i]};
        if (!has_hit && cum + w[i] >= rank) hit = here, has_hit = true;
        if constexpr (kWeighted) low = here, has_low = true;  // counts always reach a valid rank
      }
      cum += w[i];
    }
    const uint32_t hits = __ballot_sync(kFullWarp, has_hit), lows = __ballot_sync(kFullWarp, has_low);
    if (hits != 0u) {
      if (lane == __ffs(hits) - 1) result = hit;
    } else if (lows != 0u) {
      if (lane == 31 - __clz(lows)) result = low;
    } else if (lane == 0) {
      result = RadixBin<T>{0u, rank, 0u};
    }
  }
  __syncthreads();
  return result;
}

}  // namespace radix_detail

// Block-wide step of a pass: given hist[256], the candidates per digit under the decided prefix
// (filled, then a __syncthreads), the bin holding the candidate of rank `rank` (1 = the largest;
// 1 <= rank <= the candidates) and its rank within the bin. Every thread calls it and gets the
// result; the broadcast slot is rewritten by the next call, so a __syncthreads must separate two
// calls (every pass has two). hist may be rewritten as soon as it returns.
__device__ __forceinline__ RadixBin<uint32_t> radix_find_bin(const uint32_t* hist, uint32_t rank) {
  return radix_detail::find_bin<uint32_t, false>(hist, nullptr, rank);
}
// The same step weighted: mass[256] the summed weights per bin (0 where hist is 0), `rank` the
// weight wanted from the top; the bin where the running weight reaches it, and the weight still
// wanted there (rank minus the weight of the bins above).
__device__ __forceinline__ RadixBin<float> radix_find_bin(const uint32_t* hist, const float* mass, float rank) {
  return radix_detail::find_bin<float, true>(hist, mass, rank);
}

struct RadixKth {
  uint32_t key;   // τ: the key of the k-th largest candidate
  uint32_t take;  // how many candidates with key τ are among the k largest (>= 1)
  uint32_t ties;  // how many candidates have key τ (>= take)
};

// The k-th largest key among the candidates, 1 <= k <= their number. key_at(i, key) sets the key
// of element i in [0, n) and returns whether it is a candidate; every thread of the block (1-D,
// blockDim.x a multiple of 32) calls this, and key_at runs once per element per pass (4 times).
// kCount: how the passes count (RadixCount).
// hist: [256] u32 shared scratch. Ties to the lower index are the caller's: it takes every
// candidate with key > τ and the first `take` with key == τ in its own order.
template <RadixCount kCount, typename KeyAt>
__device__ RadixKth radix_kth_largest(uint32_t* hist, int n, uint32_t k, KeyAt key_at) {
  RadixPrefix px;
  RadixBin<uint32_t> r{0u, k, 0u};
  while (px.shift >= 0) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0u;
    __syncthreads();
    if constexpr (kCount == RadixCount::kPerLane) {
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        uint32_t key = 0u;
        if (key_at(i, key) && px.matches(key)) atomicAdd(&hist[px.digit(key)], 1u);
      }
    } else {
      for (int i0 = 0; i0 < n; i0 += blockDim.x) {  // i0 is block-uniform: each warp stays whole
        const int i = i0 + int(threadIdx.x);
        uint32_t key = 0u;
        const bool active = i < n && key_at(i, key) && px.matches(key);
        radix_hist_add_warp(hist, active, px.digit(key));
      }
    }
    __syncthreads();
    r = radix_find_bin(hist, r.rank);
    px.descend(r.bin);
  }
  return RadixKth{px.prefix, r.rank, r.count};
}

}  // namespace lychee::cuda
