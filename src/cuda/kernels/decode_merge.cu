// The merge of split-KV decode attention's partial results: one CTA per (sequence, query head)
// combines the head's slots (o_i, lse_i) by log-sum-exp weights (merge_head, decode_merge.cuh).
// Launched by decode_attention right after the attention kernel (PDL: it waits for the partials on
// the device) unless the attention kernel merges in its last items (merge_arrivals).
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/kernels/decode_attention.h"
#include "cuda/kernels/decode_merge.cuh"

namespace lychee::cuda {
namespace {

using namespace ptx;

// One CTA per (sequence, query head); a head written directly by its only item has no slots.
template <int HeadDim>
__global__ void __launch_bounds__(kMergeThreads) decode_merge_kernel(const DecodeAttentionArgs a) {
  __shared__ float4 scratch[(merge_scratch_floats<HeadDim>() + 3) / 4];
  grid_dependency_wait();  // the partials of the attention kernel
  const int seq = blockIdx.x / a.n_heads, h = blockIdx.x % a.n_heads;
  if (a.merge_count[seq * a.n_heads + h] <= 0) return;
  merge_head<HeadDim, false>(a, seq, h, reinterpret_cast<float*>(scratch));
}

}  // namespace

void decode_merge(const DecodeAttentionArgs& a, cudaStream_t stream) {
  if (a.batch <= 0) return;
  if (a.head_dim == 64)
    launch_pdl(decode_merge_kernel<64>, a.batch * a.n_heads, kMergeThreads, 0, stream, a);
  else
    launch_pdl(decode_merge_kernel<128>, a.batch * a.n_heads, kMergeThreads, 0, stream, a);
  LY_CUDA_CHECK_LAUNCH();
}

}  // namespace lychee::cuda
