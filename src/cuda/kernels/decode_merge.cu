// The merge of split-KV decode attention's partial results: one CTA per (sequence, query head)
// combines the head's slots (o_i, lse_i) by log-sum-exp weights. Launched by decode_attention
// right after the attention kernel (PDL: it waits for the partials on the device).
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/kernels/decode_attention.h"

namespace lychee::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;

using namespace ptx;

// One CTA per (sequence, query head): out = sum_i exp(lse_i - M) o_i / sum_i exp(lse_i - M) over
// the head's slots. kSlotLanes slots are combined in parallel, each by HeadDim / 4 threads.
template <int HeadDim>
__global__ void __launch_bounds__(kThreads) decode_merge_kernel(const DecodeAttentionArgs a) {
  constexpr int kVec = HeadDim / 4;
  constexpr int kSlotLanes = kThreads / kVec;
  __shared__ float s_max[kWarps];
  __shared__ float4 s_acc[kSlotLanes][kVec];
  __shared__ float s_w[kSlotLanes];

  grid_dependency_wait();  // the partials of the attention kernel
  const int group = a.n_heads / a.n_kv_heads;
  const int seq = blockIdx.x / a.n_heads, h = blockIdx.x % a.n_heads;
  const int mi = seq * a.n_heads + h, r = h % group;
  const int count = a.merge_count[mi];
  if (count <= 0) return;  // written directly by its only item
  const int begin = a.merge_begin[mi];

  float m = -INFINITY;
  for (int i = threadIdx.x; i < count; i += kThreads) m = fmaxf(m, a.partial_lse[size_t(begin + i) * group + r]);
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
  if ((threadIdx.x & 31) == 0) s_max[threadIdx.x >> 5] = m;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, s_max[w]);

  // An empty split has lse = -inf and weight 0; when all are empty the output is 0, never NaN.
  const int vec = threadIdx.x % kVec, lanes = threadIdx.x / kVec;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float w_sum = 0.0f;
#pragma unroll 4
  for (int i = lanes; i < count; i += kSlotLanes) {
    const size_t row = size_t(begin + i) * group + r;
    const float lse = a.partial_lse[row];
    if (lse == -INFINITY) continue;  // an empty split: weight 0, and its o is never read
    const float w = __expf(lse - m);
    const float4 x = reinterpret_cast<const float4*>(a.partial_o + row * HeadDim)[vec];
    acc.x += w * x.x, acc.y += w * x.y, acc.z += w * x.z, acc.w += w * x.w;
    w_sum += w;
  }
  s_acc[lanes][vec] = acc;
  if (vec == 0) s_w[lanes] = w_sum;
  __syncthreads();
  if (lanes != 0) return;
  float total = 0.0f;
#pragma unroll
  for (int j = 1; j < kSlotLanes; ++j) {
    const float4 x = s_acc[j][vec];
    acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
  }
#pragma unroll
  for (int j = 0; j < kSlotLanes; ++j) total += s_w[j];
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  acc.x *= inv, acc.y *= inv, acc.z *= inv, acc.w *= inv;
  *reinterpret_cast<uint2*>(a.out + (size_t(seq) * a.n_heads + h) * HeadDim + 4 * vec) = pack_bf16x4(acc);
}

}  // namespace

void decode_merge(const DecodeAttentionArgs& a, cudaStream_t stream) {
  if (a.batch <= 0) return;
  if (a.head_dim == 64)
    launch_pdl(decode_merge_kernel<64>, a.batch * a.n_heads, kThreads, 0, stream, a);
  else
    launch_pdl(decode_merge_kernel<128>, a.batch * a.n_heads, kThreads, 0, stream, a);
  LY_CUDA_CHECK_LAUNCH();
}

}  // namespace lychee::cuda
