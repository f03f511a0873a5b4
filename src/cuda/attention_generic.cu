#include "cuda/attention_generic.h"

namespace lychee::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kMaxDim = 256;

__global__ void __launch_bounds__(kThreads) attention_generic_kernel(GenericAttentionArgs a) {
  const int b = blockIdx.z, i = blockIdx.y, h = blockIdx.x;
  const int q_len = a.q_lens != nullptr ? a.q_lens[b] : 1;
  if (i >= q_len) return;
  const int kv_len = a.kv_lens[b];
  const int last = kv_len - q_len + i;  // the newest position this query sees
  const int d = a.head_dim, kvh = h / (a.n_heads / a.n_kv_heads);
  __shared__ float q[kMaxDim];
  __shared__ float p[kThreads];
  __shared__ float acc[kMaxDim];
  __shared__ float m_run, l_run, scale_old;
  const size_t q_off = ((size_t(b) * a.q_len_max + i) * a.n_heads + h) * d;
  for (int j = threadIdx.x; j < d; j += kThreads) {
    q[j] = __bfloat162float(a.q[q_off + j]);
    acc[j] = 0.0f;
  }
  if (threadIdx.x == 0) {
    m_run = -INFINITY;
    l_run = 0.0f;
  }
  __syncthreads();
  const int32_t* table = a.page_table + size_t(b) * a.max_pages;
  auto row = [&](const bf16* pool, int t) {
    return pool + ((size_t(table[t / a.page_size]) * a.n_kv_heads + kvh) * a.page_size + t % a.page_size) * d;
  };
  for (int base = 0; base <= last; base += kThreads) {
    const int t = base + threadIdx.x;
    float s = -INFINITY;
    if (t <= last) {
      const bf16* k = row(a.k_pool, t);
      float dot = 0.0f;
      for (int j = 0; j < d; ++j) dot += q[j] * __bfloat162float(k[j]);
      s = dot * a.scale;
    }
    p[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {  // online softmax over the chunk
      float m = m_run;
      for (int c = 0; c < kThreads; ++c) m = fmaxf(m, p[c]);
      float l = l_run * __expf(m_run - m);
      for (int c = 0; c < kThreads; ++c) {
        p[c] = p[c] == -INFINITY ? 0.0f : __expf(p[c] - m);
        l += p[c];
      }
      scale_old = __expf(m_run - m);
      m_run = m;
      l_run = l;
    }
    __syncthreads();
    const int n = min(kThreads, last + 1 - base);
    for (int j = threadIdx.x; j < d; j += kThreads) {
      float v = acc[j] * scale_old;
      for (int c = 0; c < n; ++c) v += p[c] * __bfloat162float(row(a.v_pool, base + c)[j]);
      acc[j] = v;
    }
    __syncthreads();
  }
  for (int j = threadIdx.x; j < d; j += kThreads) a.out[q_off + j] = __float2bfloat16(acc[j] / l_run);
}

}  // namespace

void attention_generic(const GenericAttentionArgs& a, cudaStream_t stream) {
  if (a.head_dim > kMaxDim || a.head_dim < 1)
    fail_cuda_msg("attention_generic: head_dim must be in 1..256", a.head_dim, __FILE__, __LINE__);
  const dim3 grid(unsigned(a.n_heads), unsigned(a.q_len_max), unsigned(a.batch));
  attention_generic_kernel<<<grid, kThreads, 0, stream>>>(a);
  LY_CUDA_CHECK_LAUNCH();
}

}  // namespace lychee::cuda
