// The merge of split-KV decode attention's partial results: one CTA per (sequence, query head)
// combines the head's slots (o_i, lse_i) by log-sum-exp weights. Launched by decode_attention
// right after the attention kernel (PDL: it waits for the partials on the device).
//
// Latency, not bandwidth, sets its time (a head's slots are a few KB, just written, in L2), so it
// is built to need two dependent round trips to memory for up to 2 x HeadDim slots: every thread
// loads one LSE (the block's max), the weights go to shared memory, then every thread loads all
// of its slots' o vectors at once (the loads depend on shared memory only, so they are issued
// together), and the slot lanes are summed in shared memory. The o vectors of the first pass are
// prefetched into L1 beside the LSE loads, so the second trip goes no further than L1, and the
// merge arrays (the plan) are read before the PDL wait.
#include "cuda/common/common.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/kernels/decode_attention.h"

namespace lychee::cuda {
namespace {

// Lanes slot lanes of HeadDim / 4 threads. 8 (128 threads at d = 64, 256 at d = 128) but for a
// d = 128 grid of at most a quarter of the SMs (the 8B shape at batch 1), which takes 32 (1024
// threads): there a dense 128K retrieval head is cut into ~200 slots, which with 8 lanes each
// thread loaded in four dependent batches (H100, 8B b1 128K: LycheeDecode 6.571 -> 6.532 ms per
// step, its merges' exposed time 218 -> 182 µs, alternated twice; docs/results/gpu/decode_step/
// merge_lanes/). At batch 8 the 1024-thread CTAs (one per SM) ran in two waves (8/8 kernel 48.8 ->
// 51.2 µs at 32K); batches 2-4 were not measured and keep 8 lanes; at d = 64 16 lanes made the
// default model's step 0.8% slower. Batch-invariant steps (invariant_merge) keep 8 lanes at every
// grid: the lanes set the order in which a head's slots are summed.
template <int HeadDim, int Lanes>
constexpr int merge_threads() { return Lanes * HeadDim / 4; }

using namespace ptx;

// One CTA per (sequence, new position, query head): out = sum_i exp(lse_i - M) o_i / sum_i exp(lse_i
// - M) over the head's slots (a slot holds every position's rows: rows_per_seq x group).
// kSlotLanes slots are combined in parallel, each by HeadDim / 4 threads.
template <int HeadDim, int Lanes>
__global__ void __launch_bounds__(merge_threads<HeadDim, Lanes>()) decode_merge_kernel(const DecodeAttentionArgs a) {
  constexpr int kThreads = merge_threads<HeadDim, Lanes>();
  constexpr int kWarps = kThreads / 32;
  constexpr int kVec = HeadDim / 4;
  constexpr int kSlotLanes = kThreads / kVec;
  __shared__ float s_max[kWarps];
  __shared__ float s_w[kThreads];           // the weights of the slots of one pass
  __shared__ float4 s_acc[kSlotLanes][kVec];
  __shared__ float s_wsum[kSlotLanes];

  // The merge arrays are the step's plan, written before the attention kernel started
  // (ptx::wait_previous_kernel): read them before the wait.
  const int group = a.n_heads / a.n_kv_heads, R = a.rows_per_seq, slot_rows = group * R;
  const int seq = blockIdx.x / (R * a.n_heads), pos = blockIdx.x / a.n_heads % R, h = blockIdx.x % a.n_heads;
  const int mi = seq * a.n_heads + h, r = pos * group + h % group;
  const int count = a.merge_count[mi];
  // Past one tile the head's slots are one run of `count` per group of positions (plan_decode):
  // decode_positions_per_item's number, computed here the same way.
  const int per_item = min(R, max(1, kDecodeMaxTileRows / group));
  const int begin = a.merge_begin[mi] + (pos / per_item) * count;
  wait_previous_kernel();  // the attention's partials (a PDL product after it may load its weights meanwhile)
  // A head written directly by its only item returns only now: a CTA that ended before its wait
  // would let the next kernel start before the attention kernel ends.
  if (count <= 0) return;
  const float* lse = a.partial_lse + size_t(begin) * slot_rows + r;  // slot i at lse[i * slot_rows]

  // The max LSE; this thread's first slot's LSE stays in a register for the first pass.
  const int tid = threadIdx.x;
  const float lse0 = tid < count ? lse[size_t(tid) * slot_rows] : -INFINITY;
  // This thread's o vectors of the first pass into L1 while the LSEs come back: the second round
  // trip is then an L1 hit.
  for (int i = tid / kVec; i < count && i < kThreads; i += kSlotLanes)
    prefetch_l1(a.partial_o + (size_t(begin + i) * slot_rows + r) * HeadDim + 4 * (tid % kVec));
  float m = lse0;
  for (int i = tid + kThreads; i < count; i += kThreads) m = fmaxf(m, lse[size_t(i) * slot_rows]);
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
  if ((tid & 31) == 0) s_max[tid >> 5] = m;
  __syncthreads();
  m = s_max[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, s_max[w]);

  // An empty split has lse = -inf and weight 0 (its o is never read); when all are empty the
  // output is 0, never NaN.
  const int vec = tid % kVec, lane = tid / kVec;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float w_sum = 0.0f;
  for (int c0 = 0; c0 < count; c0 += kThreads) {
    if (c0 + tid < count) {
      const float l = c0 == 0 ? lse0 : lse[size_t(c0 + tid) * slot_rows];
      s_w[tid] = l == -INFINITY ? 0.0f : __expf(l - m);
    }
    __syncthreads();
    const int n = min(kThreads, count - c0);
#pragma unroll 8
    for (int i = lane; i < n; i += kSlotLanes) {
      const float w = s_w[i];
      if (w > 0.0f) {
        const float4 x = reinterpret_cast<const float4*>(a.partial_o + (size_t(begin + c0 + i) * slot_rows + r) * HeadDim)[vec];
        acc.x += w * x.x, acc.y += w * x.y, acc.z += w * x.z, acc.w += w * x.w;
        w_sum += w;
      }
    }
    __syncthreads();  // s_w is rewritten by the next pass
  }
  s_acc[lane][vec] = acc;
  if (vec == 0) s_wsum[lane] = w_sum;
  __syncthreads();
  if (lane != 0) return;
  float total = w_sum;
#pragma unroll
  for (int j = 1; j < kSlotLanes; ++j) {
    const float4 x = s_acc[j][vec];
    acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
    total += s_wsum[j];
  }
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  acc.x *= inv, acc.y *= inv, acc.z *= inv, acc.w *= inv;
  *reinterpret_cast<uint2*>(a.out + ((size_t(seq) * R + pos) * a.n_heads + h) * HeadDim + 4 * vec) = pack_bf16x4(acc);
}

}  // namespace

void decode_merge(const DecodeAttentionArgs& a, cudaStream_t stream) {
  if (a.batch <= 0) return;
  const int grid = a.batch * a.rows_per_seq * a.n_heads;  // one CTA per (sequence, position, query head)
  if (a.head_dim == 64)
    launch_pdl(decode_merge_kernel<64, 8>, grid, merge_threads<64, 8>(), 0, stream, a);
  else if (!a.invariant_merge && 4 * grid <= device_info().sm_count)
    launch_pdl(decode_merge_kernel<128, 32>, grid, merge_threads<128, 32>(), 0, stream, a);
  else
    launch_pdl(decode_merge_kernel<128, 8>, grid, merge_threads<128, 8>(), 0, stream, a);
  LY_CUDA_CHECK_LAUNCH();
}

}  // namespace lychee::cuda
