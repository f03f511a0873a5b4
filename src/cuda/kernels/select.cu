// Selection kernels of the hybrid-head decode (select.h). One CTA per selector (sequence, head):
// unit scores from the fused scores, then the strategy, then an ordered compaction into an
// ascending list. Top-k is an exact radix select on order-preserving 32-bit keys with ties to the
// lower index (the CPU reference's stable sort); top-p is the same radix walk weighted by
// probability mass.
#include "cuda/kernels/select.h"

#include <cub/block/block_reduce.cuh>

#include <cmath>

#include "cuda/common/radix_select.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/kernels/kv_fp8.cuh"

namespace lychee::cuda {
namespace {

constexpr int kSelThreads = 512;

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

struct Forced {
  int sink_units, recent_from, last;
  __device__ bool operator()(int u) const { return u < sink_units || u >= recent_from || u == last; }
};

// Top-k / ratio: the left-th largest unit key among the non-forced units (forced ones are taken
// anyway and do not use up the budget). Every key here is of x + 0.0f, which turns -0 into +0:
// the CPU reference (a stable sort on `>`) ties them, so the lower index goes first here too.
__device__ RadixKth top_k_key(uint32_t* hist, const float* us, int n_units, Forced forced, int left) {
  const auto key_at = [&](int u, uint32_t& key) {
    if (forced(u)) return false;
    key = radix_key(us[u] + 0.0f);
    return true;
  };
  return radix_kth_largest<RadixCount::kPerLane>(hist, n_units, uint32_t(left), key_at);
}

struct TopPKey {
  uint32_t key;  // τ: the key of the unit where the mass from the top reaches p · sum
  float rem;     // the mass still wanted among the units with key τ
};

// Top-p over every unit (forced ones count where they fall in the order): the radix walk of
// radix_kth_largest weighted by probability mass exp(us·scale − ms) (float masses, summed by
// shared float atomics: their order, hence the last bits, varies from run to run; the CPU
// reference agrees away from the boundary). A bin is chosen where the running mass from the top
// reaches rem; rounding may leave it unreached: then the lowest non-empty bin (everything left
// is taken). hist, mass: [256] shared scratch.
__device__ TopPKey top_p_key(uint32_t* hist, float* mass, const float* us, int n_units, float scale, float ms,
                             float rem) {
  RadixPrefix px;
  while (px.shift >= 0) {
    for (int i = threadIdx.x; i < 256; i += kSelThreads) hist[i] = 0, mass[i] = 0.0f;
    __syncthreads();
    for (int u = threadIdx.x; u < n_units; u += kSelThreads) {  // per-lane atomics (RadixCount)
      const uint32_t key = radix_key(us[u] + 0.0f);  // -0 ties +0, as on the CPU
      if (px.matches(key)) {
        atomicAdd(&hist[px.digit(key)], 1u);
        atomicAdd(&mass[px.digit(key)], __expf(us[u] * scale - ms));
      }
    }
    __syncthreads();
    const RadixBin<float> r = radix_find_bin(hist, mass, rem);
    px.descend(r.bin);
    rem = r.rank;
  }
  return TopPKey{px.prefix, rem};
}

// Unit scores kept in shared memory (kShared) where the longest row's fit kMaxSharedUnits: the
// radix passes and the compaction then read them from shared memory instead of global scratch
// (an H200 trace of the 8B shape at 128K, unit 16: 37.5 us per launch with global scratch, 516 us
// of a 5.12 ms LycheeDecode step).
constexpr int kMaxSharedUnits = 32768;  // 128 KiB: one CTA per SM where a row is that long
constexpr int kSelWarps = kSelThreads / kWarpSize;

template <bool kShared>
__global__ void __launch_bounds__(kSelThreads) select_kernel(const SelectArgs a) {
  using Reduce = cub::BlockReduce<float, kSelThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ uint32_t hist[256];  // radix pass: candidates per digit
  __shared__ float mass[256];     // top-p pass: their probability mass per digit
  __shared__ int s_warp_eq[kSelWarps], s_warp_sel[kSelWarps];
  __shared__ float s_max, s_sum;
  extern __shared__ float s_units[];  // kShared: [list_stride]

  const int seq = blockIdx.y, head = a.heads[blockIdx.x];
  const size_t row = size_t(seq) * a.row_heads + head;
  const int n = a.seq_lens[seq];
  const int U = a.unit, per_unit = a.unit / a.score_unit;
  const int n_units = (n + U - 1) / U, n_score = (n + a.score_unit - 1) / a.score_unit;
  const float* sc = a.scores + row * a.score_stride;
  float* us = kShared ? s_units : a.unit_scores + row * a.list_stride;
  int32_t* out = a.lists + row * a.list_stride;
  const Forced forced{(min(a.sink, n) + U - 1) / U, max(0, n - a.recent) / U, n_units - 1};
  const int b0 = min(forced.recent_from, n_units - 1);
  const int n_forced = min(n_units, forced.sink_units + n_units - b0);

  float local_max = -INFINITY;
  for (int u = threadIdx.x; u < n_units; u += kSelThreads) {
    float m = -INFINITY;
    for (int j = 0; j < per_unit && u * per_unit + j < n_score; ++j) m = fmaxf(m, sc[u * per_unit + j]);
    us[u] = m;
    local_max = fmaxf(local_max, m);
  }
  const float mx = Reduce(tmp).Reduce(local_max, MaxOp{});
  if (threadIdx.x == 0) s_max = mx;
  __syncthreads();  // us is visible to the block; s_max set

  // mode: 0 = forced only, 1 = everything, 2 = rank by key (top-k / top-p), 3 = threshold
  int mode = 2;
  uint32_t threshold_key = 0;
  int eq_take = 0;
  float sum = 0.0f;
  const float ms = s_max * a.scale;
  if (a.strategy == SelectStrategy::kTopP || a.strategy == SelectStrategy::kThreshold) {
    float local = 0.0f;
    for (int u = threadIdx.x; u < n_units; u += kSelThreads) local += __expf(us[u] * a.scale - ms);
    const float total = Reduce(tmp).Sum(local);
    if (threadIdx.x == 0) s_sum = total;
    __syncthreads();
    sum = s_sum;
  }
  if (a.strategy == SelectStrategy::kThreshold) {
    mode = 3;
  } else if (a.strategy == SelectStrategy::kTopK || a.strategy == SelectStrategy::kRatio) {
    const double tokens = a.strategy == SelectStrategy::kRatio ? ceil(a.value * double(n)) : double(a.budget);
    const int k_units = max(1, int(tokens) / U);
    const int left = k_units - n_forced;
    if (left <= 0) mode = 0;
    else if (left >= n_units - n_forced) mode = 1;
    else {
      const RadixKth r = top_k_key(hist, us, n_units, forced, left);
      threshold_key = r.key;
      eq_take = int(r.take);
    }
  } else {  // top-p over every unit (forced ones count where they fall in the order)
    if (a.value >= 1.0) mode = 1;
    else {
      const TopPKey r = top_p_key(hist, mass, us, n_units, a.scale, ms, float(a.value) * sum);
      threshold_key = r.key;
      const float w = __expf(radix_key_value(r.key) * a.scale - ms);
      eq_take = max(1, int(ceilf(r.rem / w)));
    }
  }

  // Ordered compaction: warp w takes the units [w * chunk, (w + 1) * chunk), 32 at a time, lanes
  // over consecutive units. Three walks: each warp counts its threshold ties; then, with the ties
  // before it known, it takes the first eq_take ties in index order and counts what it selects;
  // then it writes its selection at its offset. The list comes out ascending; ties go to the
  // lower index (the CPU reference's stable sort).
  const double thr = a.value;
  const auto classify = [&](int u, bool& sel, bool& eq) {
    sel = eq = false;
    if (u >= n_units) return;
    const bool f = forced(u);
    if (mode == 0) sel = f;
    else if (mode == 1) sel = true;
    else if (mode == 3) sel = f || double(__expf(us[u] * a.scale - ms)) / double(sum) > thr;
    else {
      const uint32_t key = radix_key(us[u] + 0.0f);  // the same keys as the walks above
      const bool candidate = a.strategy == SelectStrategy::kTopP || !f;  // top-k ranks the non-forced only
      sel = f || (candidate && key > threshold_key);
      eq = candidate && key == threshold_key;
    }
  };
  const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
  const uint32_t below = (1u << lane) - 1u;
  const int chunk = (n_units + kSelThreads - 1) / kSelThreads * kWarpSize;
  const int w_begin = min(n_units, warp * chunk), w_end = min(n_units, w_begin + chunk);
  int eq_count = 0;
  for (int b = w_begin; b < w_end; b += kWarpSize) {
    bool sel, eq;
    classify(b + lane < w_end ? b + lane : n_units, sel, eq);
    eq_count += __popc(__ballot_sync(kFullWarp, eq));
  }
  if (lane == 0) s_warp_eq[warp] = eq_count;
  __syncthreads();
  int eq_base = 0;
  for (int w = 0; w < warp; ++w) eq_base += s_warp_eq[w];
  // sel with the ties taken: the tie of rank eq_base + (ties of lower lanes) is taken below eq_take
  const auto take = [&](int b, int& eqb) {
    bool sel, eq;
    classify(b + lane < w_end ? b + lane : n_units, sel, eq);
    const uint32_t eqm = __ballot_sync(kFullWarp, eq);
    if (eq && !sel && eqb + __popc(eqm & below) < eq_take) sel = true;
    eqb += __popc(eqm);
    return sel;
  };
  int sel_count = 0, eqb = eq_base;
  for (int b = w_begin; b < w_end; b += kWarpSize) sel_count += __popc(__ballot_sync(kFullWarp, take(b, eqb)));
  if (lane == 0) s_warp_sel[warp] = sel_count;
  __syncthreads();
  int base = 0, total = 0;
  for (int w = 0; w < kSelWarps; ++w) {
    if (w < warp) base += s_warp_sel[w];
    total += s_warp_sel[w];
  }
  eqb = eq_base;
  for (int b = w_begin; b < w_end; b += kWarpSize) {
    const bool sel = take(b, eqb);
    const uint32_t selm = __ballot_sync(kFullWarp, sel);
    if (sel) out[base + __popc(selm & below)] = b + lane;
    base += __popc(selm);
  }
  if (threadIdx.x == 0) a.counts[row] = total;
}

__global__ void __launch_bounds__(256) union_reads_kernel(const UnionReadsArgs a) {
  extern __shared__ uint32_t bits[];
  const int kv = blockIdx.x, seq = blockIdx.y, group = a.n_heads / a.n_kv_heads;
  const int n = a.seq_lens[seq];
  const int n_units = (n + a.unit - 1) / a.unit, words = (n_units + 31) / 32;
  for (int w = threadIdx.x; w < words; w += blockDim.x) bits[w] = 0;
  __syncthreads();
  for (int g = 0; g < group; ++g) {
    const size_t row = size_t(seq) * a.n_heads + size_t(kv) * group + g;
    const int count = a.counts[row];
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
      const int u = a.lists[row * a.list_stride + i];
      atomicOr(&bits[u >> 5], 1u << (u & 31));
    }
  }
  __syncthreads();
  unsigned long long local = 0;
  for (int w = threadIdx.x; w < words; w += blockDim.x) local += __popc(bits[w]);
  using Reduce = cub::BlockReduce<unsigned long long, 256>;
  __shared__ typename Reduce::TempStorage tmp;
  const unsigned long long units = Reduce(tmp).Sum(local);
  if (threadIdx.x == 0) {
    const int last = n_units - 1;
    const bool has_last = (bits[last >> 5] >> (last & 31)) & 1u;
    const unsigned long long tokens = units * a.unit - (has_last ? uint64_t(n_units) * a.unit - n : 0);
    atomicAdd(a.token_reads + seq, tokens);
  }
}

// One warp per (seq, chunk, kv head) to recompute; lanes over the head dims.
__global__ void __launch_bounds__(256) quest_update_kernel(const QuestArgs a, int batch) {
  const int warps = gridDim.x * (blockDim.x / 32);
  const int lane = threadIdx.x & 31;
  const int chunks_per_page = a.page_size / a.qpage;
  const int64_t first = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  for (int s = 0; s < batch; ++s) {
    const int n = a.seq_lens[s];
    const int c0 = min(a.from[s], n) / a.qpage, c1 = (n + a.qpage - 1) / a.qpage;
    const int64_t work = int64_t(c1 - c0) * a.n_kv_heads;
    for (int64_t w = first; w < work; w += warps) {
      const int c = c0 + int(w / a.n_kv_heads), kv = int(w % a.n_kv_heads);
      const int pos0 = c * a.qpage, pos1 = min(n, pos0 + a.qpage);
      const int page = a.block_table[size_t(s) * a.max_pages + pos0 / a.page_size];
      const int64_t rows = (int64_t(page) * a.n_kv_heads + kv) * a.page_size;  // the head's row 0 in the page
      const size_t meta = ((size_t(page) * a.n_kv_heads + kv) * chunks_per_page + (pos0 % a.page_size) / a.qpage) * a.head_dim;
      for (int i = lane; i < a.head_dim; i += 32) {
        float lo = INFINITY, hi = -INFINITY;
        for (int p = pos0; p < pos1; ++p) {
          const int64_t row = rows + p % a.page_size;
          const float x = a.k8_pool != nullptr ? a.k_scale[row] * kv_fp8_value(a.k8_pool[row * a.head_dim + i])
                                               : __bfloat162float(a.k_pool[row * a.head_dim + i]);
          lo = fminf(lo, x);
          hi = fmaxf(hi, x);
        }
        // bf16 keys: exact either way. FP8 keys (f32 products): outward, so the bound holds.
        a.kmin[meta + i] = __float2bfloat16_rd(lo);
        a.kmax[meta + i] = __float2bfloat16_ru(hi);
      }
    }
  }
}

// One warp per (seq, query head, chunk).
__global__ void __launch_bounds__(256) quest_scores_kernel(const QuestArgs a, int batch) {
  const int warps = gridDim.x * (blockDim.x / 32);
  const int lane = threadIdx.x & 31, group = a.n_heads / a.n_kv_heads;
  const int chunks_per_page = a.page_size / a.qpage;
  const int64_t first = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  for (int s = 0; s < batch; ++s) {
    const int n_chunks = (a.seq_lens[s] + a.qpage - 1) / a.qpage;
    const int64_t work = int64_t(n_chunks) * a.n_heads;
    for (int64_t w = first; w < work; w += warps) {
      const int h = int(w / n_chunks), c = int(w % n_chunks), kv = h / group;
      const int pos0 = c * a.qpage;
      const int page = a.block_table[size_t(s) * a.max_pages + pos0 / a.page_size];
      const size_t meta = ((size_t(page) * a.n_kv_heads + kv) * chunks_per_page + (pos0 % a.page_size) / a.qpage) * a.head_dim;
      const bf16* q = a.q + (size_t(s) * a.n_heads + h) * a.head_dim;
      float acc = 0.0f;
      for (int i = lane; i < a.head_dim; i += 32) {
        const float qi = __bfloat162float(q[i]);
        acc += fmaxf(qi * __bfloat162float(a.kmax[meta + i]), qi * __bfloat162float(a.kmin[meta + i]));
      }
      acc = warp_sum(acc);
      if (lane == 0) a.scores[(size_t(s) * a.n_heads + h) * a.score_stride + c] = acc;
    }
  }
}

}  // namespace

void select_units(const SelectArgs& a, int batch, cudaStream_t stream) {
  check_select_args(a);
  if (a.n_select == 0 || batch == 0) return;
  const dim3 grid(unsigned(a.n_select), unsigned(batch));
  if (a.list_stride <= kMaxSharedUnits) {
    const size_t smem = size_t(a.list_stride) * sizeof(float);
    static uint64_t configured = 0;  // the shared-memory limit raised once per device
    if (first_on_device(configured))
      LY_CUDA_CHECK(cudaFuncSetAttribute(select_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(kMaxSharedUnits * sizeof(float))));
    select_kernel<true><<<grid, kSelThreads, smem, stream>>>(a);
  } else {
    select_kernel<false><<<grid, kSelThreads, 0, stream>>>(a);
  }
  LY_CUDA_CHECK_LAUNCH();
}

void count_union_reads(const UnionReadsArgs& a, int batch, cudaStream_t stream) {
  if (batch == 0) return;
  check_union_args(a);
  const size_t smem = size_t((a.max_units + 31) / 32) * 4;
  union_reads_kernel<<<dim3(unsigned(a.n_kv_heads), unsigned(batch)), 256, smem, stream>>>(a);
  LY_CUDA_CHECK_LAUNCH();
}

void quest_update(const QuestArgs& a, int batch, cudaStream_t stream) {
  check_quest_args(a);
  if (batch == 0) return;
  quest_update_kernel<<<264, 256, 0, stream>>>(a, batch);
  LY_CUDA_CHECK_LAUNCH();
}

void quest_scores(const QuestArgs& a, int batch, cudaStream_t stream) {
  if (batch == 0) return;
  quest_scores_kernel<<<528, 256, 0, stream>>>(a, batch);
  LY_CUDA_CHECK_LAUNCH();
}

}  // namespace lychee::cuda
