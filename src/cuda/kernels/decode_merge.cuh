// The log-sum-exp merge of one query head's split-KV partial results, as a device function of a
// 128-thread CTA: used by the merge kernel (decode_merge.cu) and, when the attention kernel merges
// in its last-arriving item (DecodeAttentionArgs::merge_arrivals), by the attention kernel itself.
// Both run the same arithmetic in the same order, so the two paths give the same bits.
#pragma once

#include <cstdint>

#include "cuda/common/ptx.cuh"
#include "cuda/kernels/decode_attention.h"

namespace lychee::cuda {

constexpr int kMergeThreads = 128;

// Shared memory the merge of one head needs (floats), for a caller that lends its own.
template <int HeadDim>
constexpr int merge_scratch_floats() {
  return kMergeThreads / 32 + (kMergeThreads / (HeadDim / 4)) * (HeadDim / 4) * 4 + kMergeThreads / (HeadDim / 4);
}

// out[seq][h] = sum_i exp(lse_i - M) o_i / sum_i exp(lse_i - M) over the head's merge_count slots
// from merge_begin (an empty split has lse = -inf and weight 0; all empty gives 0, never NaN).
// kSlotLanes slots are combined in parallel, each by HeadDim / 4 threads. kFromL2: read the
// partials past L1 (ld.global.cg), for a caller in the grid that wrote them, whose SM's L1 may hold
// lines of an earlier launch. Every thread of the CTA calls it; it ends with a barrier.
template <int HeadDim, bool kFromL2>
__device__ __forceinline__ void merge_head(const DecodeAttentionArgs& a, int seq, int h, float* scratch) {
  constexpr int kWarps = kMergeThreads / 32;
  constexpr int kVec = HeadDim / 4;
  constexpr int kSlotLanes = kMergeThreads / kVec;
  float* s_max = scratch;                                                // [kWarps]
  float4* s_acc = reinterpret_cast<float4*>(scratch + 4 * ((kWarps + 3) / 4));  // [kSlotLanes][kVec]
  float* s_w = reinterpret_cast<float*>(s_acc + kSlotLanes * kVec);      // [kSlotLanes]
  auto load_f = [](const float* p) { return kFromL2 ? __ldcg(p) : *p; };
  auto load_f4 = [](const float4* p) { return kFromL2 ? __ldcg(p) : *p; };

  const int group = a.n_heads / a.n_kv_heads;
  const int mi = seq * a.n_heads + h, r = h % group;
  const int count = a.merge_count[mi];
  const int begin = a.merge_begin[mi];

  float m = -INFINITY;
  for (int i = threadIdx.x; i < count; i += kMergeThreads) m = fmaxf(m, load_f(a.partial_lse + size_t(begin + i) * group + r));
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
  if ((threadIdx.x & 31) == 0) s_max[threadIdx.x >> 5] = m;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, s_max[w]);

  const int vec = threadIdx.x % kVec, lanes = threadIdx.x / kVec;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float w_sum = 0.0f;
#pragma unroll 4
  for (int i = lanes; i < count; i += kSlotLanes) {
    const size_t row = size_t(begin + i) * group + r;
    const float lse = load_f(a.partial_lse + row);
    if (lse == -INFINITY) continue;  // an empty split: weight 0, and its o is never read
    const float w = __expf(lse - m);
    const float4 x = load_f4(reinterpret_cast<const float4*>(a.partial_o + row * HeadDim) + vec);
    acc.x += w * x.x, acc.y += w * x.y, acc.z += w * x.z, acc.w += w * x.w;
    w_sum += w;
  }
  s_acc[lanes * kVec + vec] = acc;
  if (vec == 0) s_w[lanes] = w_sum;
  __syncthreads();
  if (lanes == 0) {
    float total = 0.0f;
#pragma unroll
    for (int j = 1; j < kSlotLanes; ++j) {
      const float4 x = s_acc[j * kVec + vec];
      acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
    }
#pragma unroll
    for (int j = 0; j < kSlotLanes; ++j) total += s_w[j];
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    acc.x *= inv, acc.y *= inv, acc.z *= inv, acc.w *= inv;
    *reinterpret_cast<uint2*>(a.out + (size_t(seq) * a.n_heads + h) * HeadDim + 4 * vec) = ptx::pack_bf16x4(acc);
  }
  __syncthreads();  // the scratch is free again
}

}  // namespace lychee::cuda
