// The trainer pass's row-wise fp32 kernels and their backward (declared in cuda/train_kernels.h);
// the attention rows and the flash kernel live in train_attention.cu. All of these are
// memory-bound: each reads its inputs once (twice where a row statistic comes first, the second
// read hitting L1/L2) and writes its output once.
#include "cuda/train/kernels.h"

#include <cuda_bf16.h>

#include <algorithm>

#include "cuda/common/reduce.cuh"

namespace lychee::cuda::train_ops {

namespace {

constexpr int kWarp = 32;
constexpr int kRowThreads = 256;

unsigned grid_for(size_t n, int threads) {
  const size_t b = (n + size_t(threads) - 1) / size_t(threads);
  return unsigned(b < 65535u * 16u ? b : 65535u * 16u);
}

__global__ void embed_kernel(const int32_t* __restrict__ tokens, const float* __restrict__ table,
                             float* __restrict__ x, int d) {
  const float* row = table + size_t(tokens[blockIdx.x]) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) x[size_t(blockIdx.x) * d + i] = row[i];
}

// y = x rounded to bf16 (nearest even), a grid-stride loop.
__global__ void round_to_bf16_kernel(const float* __restrict__ x, __nv_bfloat16* __restrict__ y, size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = __float2bfloat16_rn(x[i]);
}

// Block blockIdx.y: its first n elements rounded, a grid-stride loop over x.
__global__ void round_blocks_to_bf16_kernel(const float* __restrict__ x, size_t x_stride, __nv_bfloat16* __restrict__ y,
                                            size_t y_stride, size_t n) {
  const float* xb = x + size_t(blockIdx.y) * x_stride;
  __nv_bfloat16* yb = y + size_t(blockIdx.y) * y_stride;
  const size_t step = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) yb[i] = __float2bfloat16_rn(xb[i]);
}

__global__ void widen_bf16_kernel(const __nv_bfloat16* __restrict__ x, float* __restrict__ y, size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = __bfloat162float(x[i]);
}

__global__ void set_sdpa_lengths_kernel(int32_t* meta, int q_len, int kv_len) {
  meta[0] = 0;
  meta[1] = q_len;
  meta[2] = kv_len;
}

__global__ void bias_rmsnorm_kernel(float* __restrict__ x, const float* __restrict__ bias,
                                    const float* __restrict__ w, float* __restrict__ y, int d,
                                    float eps) {
  float* xr = x + size_t(blockIdx.x) * d;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float v = xr[i];
    if (bias != nullptr) {
      v += bias[i];
      xr[i] = v;
    }
    ss += v * v;
  }
  const float r = rsqrtf(block_sum(ss) / float(d) + eps);
  float* yr = y + size_t(blockIdx.x) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = w[i] * (xr[i] * r);
}

// y = w·x·r with r = (mean(x²) + eps)^(-1/2): dx = r·w·dy − x·r³·(Σ w·dy·x) / d.
__global__ void rmsnorm_backward_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                        const float* __restrict__ dy, float* __restrict__ dx,
                                        int d, float eps) {
  const size_t row = size_t(blockIdx.x) * d;
  float ss = 0.0f, dot = 0.0f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = x[row + i];
    ss += v * v;
    dot += w[i] * dy[row + i] * v;
  }
  const float2 t = block_sum(make_float2(ss, dot));  // one set of barriers for both sums
  const float r = rsqrtf(t.x / float(d) + eps);
  const float c = r * r * r * t.y / float(d);
  for (int i = threadIdx.x; i < d; i += blockDim.x) dx[row + i] += r * w[i] * dy[row + i] - x[row + i] * c;
}

// One warp per head of one row; heads in qkv order (q heads, k heads, v heads).
__global__ void qkv_post_kernel(QkvPostArgs a) {
  const int t = blockIdx.x, lane = threadIdx.x % kWarp;
  const int hd = a.head_dim, half = hd / 2;
  const int q_dim = a.n_heads * hd, qkv_dim = (a.n_heads + 2 * a.n_kv_heads) * hd;
  float* row = a.qkv + size_t(t) * qkv_dim;
  const int pos = a.pos0 + t;
  const float* cs = a.rope_cos + size_t(pos) * half;
  const float* sn = a.rope_sin + size_t(pos) * half;
  for (int head = threadIdx.x / kWarp; head < a.n_heads + 2 * a.n_kv_heads; head += blockDim.x / kWarp) {
    const bool is_q = head < a.n_heads, is_v = head >= a.n_heads + a.n_kv_heads;
    const int base = head * hd;
    float ss = 0.0f;
    for (int i = lane; i < hd; i += kWarp) {
      float v = row[base + i];
      if (a.bias != nullptr) {
        v += a.bias[base + i];
        row[base + i] = v;
      }
      ss += v * v;
    }
    __syncwarp();  // the biased values are re-read by other lanes below
    const float* nw = is_v ? nullptr : (is_q ? a.q_norm : a.k_norm);
    const float r = nw != nullptr ? rsqrtf(warp_sum(ss) / float(hd) + a.eps) : 1.0f;
    float* dst;
    if (is_q) {
      dst = a.q_out + size_t(t) * q_dim + base;
    } else {
      const int kvh = is_v ? head - a.n_heads - a.n_kv_heads : head - a.n_heads;
      dst = (is_v ? a.v_cache : a.k_cache) + (size_t(kvh) * a.ld_kv + pos) * hd;
    }
    for (int i = lane; i < half; i += kWarp) {
      float x0 = row[base + i], x1 = row[base + i + half];
      if (nw != nullptr) {
        x0 = nw[i] * (x0 * r);
        x1 = nw[i + half] * (x1 * r);
      }
      if (!is_v) {
        const float c = cs[i], s = sn[i];
        const float y0 = x0 * c - x1 * s, y1 = x1 * c + x0 * s;
        x0 = y0;
        x1 = y1;
      }
      dst[i] = x0;
      dst[i + half] = x1;
    }
  }
}

// RoPE is a rotation: its backward rotates by the negative angle. The norm's backward is the
// RMSNorm one over head_dim.
__global__ void qkv_post_backward_kernel(QkvPostBackwardArgs a) {
  const int t = blockIdx.x, lane = threadIdx.x % kWarp;
  const int hd = a.head_dim, half = hd / 2;
  const int q_dim = a.n_heads * hd, qkv_dim = (a.n_heads + 2 * a.n_kv_heads) * hd;
  const float* row = a.qkv + size_t(t) * qkv_dim;
  float* drow = a.dqkv + size_t(t) * qkv_dim;
  const int pos = a.pos0 + t;
  const float* cs = a.rope_cos + size_t(pos) * half;
  const float* sn = a.rope_sin + size_t(pos) * half;
  for (int head = threadIdx.x / kWarp; head < a.n_heads + 2 * a.n_kv_heads; head += blockDim.x / kWarp) {
    const bool is_q = head < a.n_heads, is_v = head >= a.n_heads + a.n_kv_heads;
    const int base = head * hd;
    const float* dy;
    if (is_q) {
      dy = a.dq + size_t(t) * q_dim + base;
    } else {
      const int kvh = is_v ? head - a.n_heads - a.n_kv_heads : head - a.n_heads;
      dy = (is_v ? a.dv : a.dk) + (size_t(kvh) * a.n + t) * hd;
    }
    if (is_v) {
      for (int i = lane; i < hd; i += kWarp) drow[base + i] = dy[i];
      continue;
    }
    const float* nw = is_q ? a.q_norm : a.k_norm;
    float ss = 0.0f, dot = 0.0f;
    for (int i = lane; i < half; i += kWarp) {
      const float c = cs[i], s = sn[i];
      const float d0 = dy[i] * c + dy[i + half] * s;
      const float d1 = dy[i + half] * c - dy[i] * s;
      drow[base + i] = d0;
      drow[base + i + half] = d1;
      if (nw != nullptr) {
        const float x0 = row[base + i], x1 = row[base + i + half];
        ss += x0 * x0 + x1 * x1;
        dot += nw[i] * d0 * x0 + nw[i + half] * d1 * x1;
      }
    }
    if (nw == nullptr) continue;
    __syncwarp();  // drow is re-read by other lanes below when half is not a multiple of 32
    ss = warp_sum(ss);
    dot = warp_sum(dot);
    const float r = rsqrtf(ss / float(hd) + a.eps);
    const float c = r * r * r * dot / float(hd);
    for (int i = lane; i < hd; i += kWarp) drow[base + i] = r * nw[i] * drow[base + i] - row[base + i] * c;
  }
}

__global__ void silu_mul_kernel(float* __restrict__ gu, const float* __restrict__ bias,
                                float* __restrict__ m, int n, int ff) {
  const size_t total = size_t(n) * ff;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    const size_t t = i / ff;
    const int j = int(i - t * ff);
    float* row = gu + t * 2 * ff;
    float g = row[j], u = row[ff + j];
    if (bias != nullptr) {
      g += bias[j];
      u += bias[ff + j];
      row[j] = g;
      row[ff + j] = u;
    }
    m[i] = g / (1.0f + expf(-g)) * u;
  }
}

// Four elements a thread (ff % 4 == 0, 16-byte aligned rows), rows over blockIdx.y: no 64-bit
// division per element (the element kernel above ran the inference twin at ~27% of copy bandwidth;
// here the context prefill's f32 rows are 12 bytes an element). The same arithmetic: the same bits.
__global__ void silu_mul_vec4_kernel(float* __restrict__ gu, const float* __restrict__ bias,
                                     float* __restrict__ m, int n, int ff) {
  const int vecs = ff / 4;
  for (int t = blockIdx.y; t < n; t += gridDim.y) {
    float4* g_row = reinterpret_cast<float4*>(gu + size_t(t) * 2 * ff);
    float4* u_row = reinterpret_cast<float4*>(gu + size_t(t) * 2 * ff + ff);
    float4* m_row = reinterpret_cast<float4*>(m + size_t(t) * ff);
    for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < vecs; v += gridDim.x * blockDim.x) {
      float4 g = g_row[v], u = u_row[v];
      if (bias != nullptr) {
        const float4 bg = reinterpret_cast<const float4*>(bias)[v];
        const float4 bu = *reinterpret_cast<const float4*>(bias + ff + 4 * v);
        g.x += bg.x, g.y += bg.y, g.z += bg.z, g.w += bg.w;
        u.x += bu.x, u.y += bu.y, u.z += bu.z, u.w += bu.w;
        g_row[v] = g;
        u_row[v] = u;
      }
      m_row[v] = make_float4(g.x / (1.0f + expf(-g.x)) * u.x, g.y / (1.0f + expf(-g.y)) * u.y,
                             g.z / (1.0f + expf(-g.z)) * u.z, g.w / (1.0f + expf(-g.w)) * u.w);
    }
  }
}

// silu(g) = g·σ(g); d silu / dg = σ(g)·(1 + g·(1 − σ(g))).
__global__ void silu_mul_backward_kernel(const float* __restrict__ gu, const float* __restrict__ dm,
                                         float* __restrict__ dgu, int n, int ff) {
  const size_t total = size_t(n) * ff;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    const size_t t = i / ff;
    const int j = int(i - t * ff);
    const float g = gu[t * 2 * ff + j], u = gu[t * 2 * ff + ff + j];
    const float sg = 1.0f / (1.0f + expf(-g));
    dgu[t * 2 * ff + j] = dm[i] * u * sg * (1.0f + g * (1.0f - sg));
    dgu[t * 2 * ff + ff + j] = dm[i] * g * sg;
  }
}

__global__ void reduce_rows_kernel(const float* __restrict__ part, float* __restrict__ out, int n) {
  __shared__ double buf[kRowThreads];
  double s = 0.0;
  for (int t = threadIdx.x; t < n; t += blockDim.x) s += double(part[size_t(blockIdx.x) * n + t]);
  buf[threadIdx.x] = s;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (int(threadIdx.x) < o) buf[threadIdx.x] += buf[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = float(buf[0]);
}

__global__ void squared_difference_kernel(float* __restrict__ a, const float* __restrict__ b, size_t n,
                                          float grad_scale, double* __restrict__ partials) {
  __shared__ double buf[kRowThreads];
  double s = 0.0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float e = a[i] - b[i];
    s += double(e) * double(e);
    a[i] = grad_scale * e;
  }
  buf[threadIdx.x] = s;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (int(threadIdx.x) < o) buf[threadIdx.x] += buf[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = buf[0];
}

// A fixed summation order, so the loss is the same on every run.
__global__ void sum_partials_kernel(const double* __restrict__ partials, int n, double scale,
                                    double* __restrict__ out) {
  __shared__ double buf[kRowThreads];
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += partials[i];
  buf[threadIdx.x] = s;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (int(threadIdx.x) < o) buf[threadIdx.x] += buf[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = buf[0] * scale;
}

}  // namespace

void round_to_bf16(const float* x, uint16_t* y, size_t n, cudaStream_t s) {
  if (n == 0) return;
  const int blocks = int(std::min<size_t>((n + 255) / 256, size_t(device_info().sm_count) * 32));
  round_to_bf16_kernel<<<blocks, 256, 0, s>>>(x, reinterpret_cast<__nv_bfloat16*>(y), n);
  LY_CUDA_CHECK_LAUNCH();
}

void round_blocks_to_bf16(const float* x, size_t x_stride, uint16_t* y, size_t y_stride, int n_blocks, size_t n,
                          cudaStream_t s) {
  if (n == 0 || n_blocks <= 0) return;
  const int per_block = std::max(1, int(size_t(device_info().sm_count) * 8 / size_t(n_blocks)));
  const unsigned blocks = unsigned(std::min<size_t>((n + 255) / 256, size_t(per_block)));
  round_blocks_to_bf16_kernel<<<dim3(blocks, unsigned(n_blocks)), 256, 0, s>>>(
      x, x_stride, reinterpret_cast<__nv_bfloat16*>(y), y_stride, n);
  LY_CUDA_CHECK_LAUNCH();
}

void widen_bf16(const uint16_t* x, float* y, size_t n, cudaStream_t s) {
  if (n == 0) return;
  const int blocks = int(std::min<size_t>((n + 255) / 256, size_t(device_info().sm_count) * 32));
  widen_bf16_kernel<<<blocks, 256, 0, s>>>(reinterpret_cast<const __nv_bfloat16*>(x), y, n);
  LY_CUDA_CHECK_LAUNCH();
}

void set_sdpa_lengths(int32_t* meta, int q_len, int kv_len, cudaStream_t s) {
  set_sdpa_lengths_kernel<<<1, 1, 0, s>>>(meta, q_len, kv_len);
  LY_CUDA_CHECK_LAUNCH();
}

void embed(const int32_t* tokens, const float* table, float* x, int n, int d, cudaStream_t s) {
  embed_kernel<<<n, kRowThreads, 0, s>>>(tokens, table, x, d);
  LY_CUDA_CHECK_LAUNCH();
}

void bias_rmsnorm(float* x, const float* bias, const float* w, float* y, int n, int d, float eps,
                  cudaStream_t s) {
  bias_rmsnorm_kernel<<<n, kRowThreads, 0, s>>>(x, bias, w, y, d, eps);
  LY_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(const float* x, const float* w, const float* dy, float* dx, int n, int d,
                      float eps, cudaStream_t s) {
  rmsnorm_backward_kernel<<<n, kRowThreads, 0, s>>>(x, w, dy, dx, d, eps);
  LY_CUDA_CHECK_LAUNCH();
}

void qkv_post(const QkvPostArgs& a, cudaStream_t s) {
  qkv_post_kernel<<<a.n, kRowThreads, 0, s>>>(a);
  LY_CUDA_CHECK_LAUNCH();
}

void qkv_post_backward(const QkvPostBackwardArgs& a, cudaStream_t s) {
  qkv_post_backward_kernel<<<a.n, kRowThreads, 0, s>>>(a);
  LY_CUDA_CHECK_LAUNCH();
}

void silu_mul(float* gu, const float* bias, float* m, int n, int ff, cudaStream_t s) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (ff % 4 != 0 || !aligned(gu) || !aligned(m) || (bias != nullptr && !aligned(bias)))
    return silu_mul_elementwise(gu, bias, m, n, ff, s);
  if (n <= 0) return;
  constexpr int kThreads = 128;
  const unsigned gx = unsigned(std::min((ff / 4 + kThreads - 1) / kThreads, 64));
  silu_mul_vec4_kernel<<<dim3(gx, unsigned(std::min(n, 65535))), kThreads, 0, s>>>(gu, bias, m, n, ff);
  LY_CUDA_CHECK_LAUNCH();
}

void silu_mul_elementwise(float* gu, const float* bias, float* m, int n, int ff, cudaStream_t s) {
  silu_mul_kernel<<<grid_for(size_t(n) * ff, kRowThreads), kRowThreads, 0, s>>>(gu, bias, m, n, ff);
  LY_CUDA_CHECK_LAUNCH();
}

void silu_mul_backward(const float* gu, const float* dm, float* dgu, int n, int ff, cudaStream_t s) {
  silu_mul_backward_kernel<<<grid_for(size_t(n) * ff, kRowThreads), kRowThreads, 0, s>>>(gu, dm, dgu, n, ff);
  LY_CUDA_CHECK_LAUNCH();
}

void reduce_rows(const float* part, float* out, int n_kv_heads, int n, cudaStream_t s) {
  reduce_rows_kernel<<<n_kv_heads, kRowThreads, 0, s>>>(part, out, n);
  LY_CUDA_CHECK_LAUNCH();
}

void squared_difference(float* a, const float* b, size_t n, float grad_scale, double loss_scale,
                        double* partials, double* loss, cudaStream_t s) {
  squared_difference_kernel<<<kLossBlocks, kRowThreads, 0, s>>>(a, b, n, grad_scale, partials);
  LY_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kRowThreads, 0, s>>>(partials, kLossBlocks, loss_scale, loss);
  LY_CUDA_CHECK_LAUNCH();
}

}  // namespace lychee::cuda::train_ops
