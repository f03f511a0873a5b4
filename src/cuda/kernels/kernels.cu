#include "cuda/kernels/kernels.h"

#include <cuda_fp8.h>
#include <curand_kernel.h>

#include <algorithm>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "core/fp8.h"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/radix_select.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/kernels/kv_fp8.cuh"

namespace lychee::cuda {

namespace {

constexpr int kWarp = 32;

// The per-token kernels of a decode step (embedding, residual + norm, Q/K/V RoPE and append,
// SwiGLU, argmax) are launched with programmatic dependent launch (launch_pdl): each may be
// scheduled while the product before it drains and waits here, before touching memory, for it to
// finish (ptx::wait_previous_kernel); it then lets the kernel after it be scheduled in turn.
// Between ~460 kernels a step (8B shape) the device idled ~0.85 µs at each boundary (CUPTI,
// docs/scaling.md).

__global__ void embed_kernel(const int32_t* __restrict__ tokens, const bf16* __restrict__ table,
                             float* __restrict__ x, int d) {
  ptx::wait_previous_kernel();
  const int t = blockIdx.x;
  const bf16* row = table + size_t(tokens[t]) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) x[size_t(t) * d + i] = __bfloat162float(row[i]);
}

// d % 4 == 0: four elements per thread and load (16-byte x, bias and w; 8-byte delta). The norm
// weights and the bias are model weights, which no kernel writes: they are loaded before the
// PDL wait, so only x and delta (the previous kernel's output) are on the critical path.
template <int kMaxVecs>
__global__ void add_rmsnorm_vec_kernel(float* __restrict__ x, const bf16* __restrict__ delta,
                                       const float* __restrict__ bias, const float* __restrict__ w,
                                       bf16* __restrict__ out, int d, float eps) {
  float4 g[kMaxVecs], b[kMaxVecs];
#pragma unroll
  for (int j = 0; j < kMaxVecs; ++j) {
    const int i = threadIdx.x + j * blockDim.x;  // float4 index
    if (i * 4 >= d) break;
    g[j] = reinterpret_cast<const float4*>(w)[i];
    if (bias != nullptr) b[j] = reinterpret_cast<const float4*>(bias)[i];
  }
  ptx::wait_previous_kernel();
  const size_t row = size_t(blockIdx.x) * d;
  float4* xr = reinterpret_cast<float4*>(x + row);
  float4 v[kMaxVecs];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxVecs; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i * 4 >= d) break;
    float4 a = xr[i];
    if (delta != nullptr) {
      const __nv_bfloat162* dp = reinterpret_cast<const __nv_bfloat162*>(delta + row) + 2 * i;
      const float2 d0 = __bfloat1622float2(dp[0]), d1 = __bfloat1622float2(dp[1]);
      a.x += d0.x, a.y += d0.y, a.z += d1.x, a.w += d1.y;
    }
    if (bias != nullptr) a.x += b[j].x, a.y += b[j].y, a.z += b[j].z, a.w += b[j].w;
    xr[i] = a;
    v[j] = a;
    ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
  }
  const float r = rsqrtf(block_sum(ss) / float(d) + eps);
#pragma unroll
  for (int j = 0; j < kMaxVecs; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i * 4 >= d) break;
    __nv_bfloat162* op = reinterpret_cast<__nv_bfloat162*>(out + row) + 2 * i;
    op[0] = __floats2bfloat162_rn(g[j].x * (v[j].x * r), g[j].y * (v[j].y * r));
    op[1] = __floats2bfloat162_rn(g[j].z * (v[j].z * r), g[j].w * (v[j].w * r));
  }
}

__global__ void add_rmsnorm_kernel(float* __restrict__ x, const bf16* __restrict__ delta,
                                   const float* __restrict__ bias, const float* __restrict__ w,
                                   bf16* __restrict__ out, int d, float eps) {
  ptx::wait_previous_kernel();
  const size_t row = size_t(blockIdx.x) * d;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float v = x[row + i];
    if (delta != nullptr) v += __bfloat162float(delta[row + i]);
    if (bias != nullptr) v += bias[i];
    x[row + i] = v;
    ss += v * v;
  }
  const float r = rsqrtf(block_sum(ss) / float(d) + eps);
  for (int i = threadIdx.x; i < d; i += blockDim.x) out[row + i] = __float2bfloat16(w[i] * (x[row + i] * r));
}

// One warp per head of one token (blockIdx.x: token, blockIdx.y: a group of heads, so a decode
// step's few tokens still spread over many SMs); each lane holds the pairs (i, i + hd/2),
// i = lane + 32 k.
template <int kPairsPerLane>
__global__ void qkv_rope_append_kernel(QkvArgs a) {
  ptx::wait_previous_kernel();
  const int t = blockIdx.x;
  const int lane = threadIdx.x % kWarp;
  const int n_warps = blockDim.x / kWarp;
  const int hd = a.head_dim, half = hd / 2;
  const int qkv_dim = (a.n_heads + 2 * a.n_kv_heads) * hd;
  const bf16* row = a.qkv + size_t(t) * qkv_dim;
  const float pos = float(a.positions[t]);
  for (int head = blockIdx.y * n_warps + threadIdx.x / kWarp; head < a.n_heads + 2 * a.n_kv_heads;
       head += n_warps * gridDim.y) {
    const bool is_q = head < a.n_heads;
    const bool is_v = head >= a.n_heads + a.n_kv_heads;
    float lo[kPairsPerLane], hi[kPairsPerLane];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < kPairsPerLane; ++k) {
      const int i = lane + k * kWarp;
      lo[k] = hi[k] = 0.0f;
      if (i < half) {
        const int c0 = head * hd + i, c1 = c0 + half;
        lo[k] = __bfloat162float(row[c0]);
        hi[k] = __bfloat162float(row[c1]);
        if (a.bias != nullptr) {
          lo[k] += a.bias[c0];
          hi[k] += a.bias[c1];
        }
        ss += lo[k] * lo[k] + hi[k] * hi[k];
      }
    }
    const float* norm_w = is_v ? nullptr : (is_q ? a.q_norm : a.k_norm);
    float r = 1.0f;
    if (norm_w != nullptr) r = rsqrtf(warp_sum(ss) / float(hd) + a.eps);
    float amax = 0.0f;  // FP8 KV: max |x| over the head, after the norm and RoPE
#pragma unroll
    for (int k = 0; k < kPairsPerLane; ++k) {
      const int i = lane + k * kWarp;
      if (i >= half) continue;
      float x0 = lo[k], x1 = hi[k];
      if (norm_w != nullptr) {
        x0 = norm_w[i] * (x0 * r);
        x1 = norm_w[i + half] * (x1 * r);
      }
      if (!is_v) {
        float s, c;
        sincosf(pos * a.inv_freq[i], &s, &c);
        const float y0 = x0 * c - x1 * s;
        const float y1 = x1 * c + x0 * s;
        x0 = y0;
        x1 = y1;
      }
      lo[k] = x0;
      hi[k] = x1;
      amax = fmaxf(amax, fmaxf(fabsf(x0), fabsf(x1)));
    }
    const int kvh = is_v ? head - a.n_heads - a.n_kv_heads : head - a.n_heads;
    const size_t kv_row = is_q ? 0 : (size_t(a.kv_page[t]) * a.n_kv_heads + kvh) * a.page_size + a.kv_row[t];
    if (!is_q && a.k8_pool != nullptr) {  // FP8 pages: codes and the token's scale (kv_fp8.cuh)
      amax = warp_reduce(amax, [](float x, float y) { return fmaxf(x, y); });
      const float sc = kv_fp8_scale(amax);
      uint8_t* dst = (is_v ? a.v8_pool : a.k8_pool) + kv_row * hd;
#pragma unroll
      for (int k = 0; k < kPairsPerLane; ++k) {
        const int i = lane + k * kWarp;
        if (i >= half) continue;
        dst[i] = kv_fp8_code(lo[k], sc);
        dst[i + half] = kv_fp8_code(hi[k], sc);
      }
      if (lane == 0) (is_v ? a.v_scale : a.k_scale)[kv_row] = sc;
      continue;
    }
    bf16* dst = is_q ? a.q_out + (size_t(t) * a.n_heads + head) * hd : (is_v ? a.v_pool : a.k_pool) + kv_row * hd;
#pragma unroll
    for (int k = 0; k < kPairsPerLane; ++k) {
      const int i = lane + k * kWarp;
      if (i >= half) continue;
      dst[i] = __float2bfloat16(lo[k]);
      dst[i + half] = __float2bfloat16(hi[k]);
    }
  }
}

// One element a thread, any ff: the fallback where rows are not 16-byte aligned.
__device__ __forceinline__ float silu_mul_one(float g, float u) { return g / (1.0f + __expf(-g)) * u; }

__global__ void silu_mul_kernel(const bf16* __restrict__ gu, const float* __restrict__ bias,
                                bf16* __restrict__ out, int n, int ff) {
  ptx::wait_previous_kernel();
  const size_t total = size_t(n) * ff;
  for (size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    const size_t t = idx / ff, j = idx % ff;
    float g = __bfloat162float(gu[t * 2 * ff + j]);
    float u = __bfloat162float(gu[t * 2 * ff + ff + j]);
    if (bias != nullptr) {
      g += bias[j];
      u += bias[ff + j];
    }
    out[idx] = __float2bfloat16(silu_mul_one(g, u));
  }
}

// Eight elements a thread (ff % 8 == 0, 16-byte aligned rows): 16-byte loads of the gate and up
// halves and a 16-byte store, rows over blockIdx.y (no 64-bit division per element: the element
// kernel above ran at ~27% of copy bandwidth on the 8B's 8192-token prefill passes, 0.63 ms a
// call, 80 ms of a 32K prompt's 1.33 s; H200, bench_e2e --prefill --trace). The same arithmetic
// per element as the element kernel: the same bits.
__global__ void silu_mul_vec8_kernel(const bf16* __restrict__ gu, const float* __restrict__ bias,
                                     bf16* __restrict__ out, int n, int ff) {
  ptx::wait_previous_kernel();
  const int vecs = ff / 8;
  for (int t = blockIdx.y; t < n; t += gridDim.y) {
    const uint4* g_row = reinterpret_cast<const uint4*>(gu + size_t(t) * 2 * ff);
    const uint4* u_row = reinterpret_cast<const uint4*>(gu + size_t(t) * 2 * ff + ff);
    uint4* o_row = reinterpret_cast<uint4*>(out + size_t(t) * ff);
    for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < vecs; v += gridDim.x * blockDim.x) {
      const uint4 gv = __ldcs(g_row + v), uv = __ldcs(u_row + v);  // read once: stream past the caches
      const bf16* g8 = reinterpret_cast<const bf16*>(&gv);
      const bf16* u8 = reinterpret_cast<const bf16*>(&uv);
      uint4 ov;
      bf16* o8 = reinterpret_cast<bf16*>(&ov);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float g = __bfloat162float(g8[i]), u = __bfloat162float(u8[i]);
        if (bias != nullptr) {
          g += bias[8 * v + i];
          u += bias[ff + 8 * v + i];
        }
        o8[i] = __float2bfloat16(silu_mul_one(g, u));
      }
      o_row[v] = ov;
    }
  }
}

struct ArgMax {
  float v;
  int32_t i;
};

__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) {
  if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
  return a;
}

constexpr int kReduceThreads = 1024;

// One block per row. With vocab % 4 == 0 (rows 16-byte aligned) each thread keeps four float4
// loads in flight per iteration: one scalar load at a time per thread left a 128K-entry row
// latency-bound at ~10 GB/s (49 µs a step on the 8B shape's vocabulary, CUPTI).
__global__ void __launch_bounds__(kReduceThreads) argmax_kernel(const float* __restrict__ logits,
                                                                int32_t* __restrict__ out, int vocab) {
  ptx::wait_previous_kernel();
  const float* row = logits + size_t(blockIdx.x) * vocab;
  ArgMax best{-INFINITY, vocab};
  if (vocab % 4 == 0) {
    constexpr int kUnroll = 4;
    const float4* row4 = reinterpret_cast<const float4*>(row);
    const int n4 = vocab / 4;
    for (int base = 0; base < n4; base += kUnroll * kReduceThreads) {
      float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = base + u * kReduceThreads + int(threadIdx.x);
        v[u] = j < n4 ? row4[j] : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = 4 * (base + u * kReduceThreads + int(threadIdx.x));
        best = better(best, ArgMax{v[u].x, i});
        best = better(best, ArgMax{v[u].y, i + 1});
        best = better(best, ArgMax{v[u].z, i + 2});
        best = better(best, ArgMax{v[u].w, i + 3});
      }
    }
  } else {
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) best = better(best, ArgMax{row[i], i});
  }
  using Reduce = cub::BlockReduce<ArgMax, kReduceThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const ArgMax r = Reduce(tmp).Reduce(best, [](ArgMax a, ArgMax b) { return better(a, b); });
  if (threadIdx.x == 0) out[blockIdx.x] = r.i < vocab ? r.i : 0;
}

// The key (radix_key) of the k-th largest value of row[vocab], 1 <= k <= vocab. Keys keep -0
// below +0 (no +0.0f here): the cut is `radix_key(v) >= key`, the same map on both sides.
__device__ uint32_t kth_largest_key(const float* row, int vocab, int k) {
  __shared__ uint32_t hist[256];
  const auto key_at = [row](int i, uint32_t& key) {
    key = radix_key(row[i]);
    return true;
  };
  return radix_kth_largest<RadixCount::kPerLane>(hist, vocab, uint32_t(k), key_at).key;
}

__global__ void __launch_bounds__(kReduceThreads)
    sample_kernel(const float* __restrict__ logits, int32_t* __restrict__ out, int vocab, float inv_temp,
                  int top_k, float top_p, uint64_t seed, uint64_t counter) {
  const float* row = logits + size_t(blockIdx.x) * vocab;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) mx = fmaxf(mx, row[i]);
  using Reduce = cub::BlockReduce<float, kReduceThreads>;
  __shared__ typename Reduce::TempStorage rtmp;
  __shared__ float s_mx;
  const float bmx = Reduce(rtmp).Reduce(mx, [](float a, float b) { return fmaxf(a, b); });
  if (threadIdx.x == 0) s_mx = bmx;
  __syncthreads();
  mx = s_mx;
  const uint32_t min_key = (top_k > 0 && top_k < vocab) ? kth_largest_key(row, vocab, top_k) : 0u;
  auto weight = [&](int i) {  // unnormalised probability of token i, 0 if cut by top-k
    const float v = row[i];
    return radix_key(v) >= min_key ? __expf((v - mx) * inv_temp) : 0.0f;
  };
  float total = 0.0f;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) total += weight(i);
  total = block_sum(total);
  // Top-p: the largest threshold tau whose set {w >= tau} keeps mass >= top_p (bisection).
  float tau = 0.0f;
  if (top_p < 1.0f) {
    float lo = 0.0f, hi = 1.0f + 1e-6f;
    for (int it = 0; it < 32; ++it) {
      const float mid = 0.5f * (lo + hi);
      float mass = 0.0f;
      for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float w = weight(i);
        mass += w >= mid ? w : 0.0f;
      }
      if (block_sum(mass) >= top_p * total) lo = mid; else hi = mid;
    }
    tau = lo;
  }
  float kept = 0.0f;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float w = weight(i);
    kept += w >= tau ? w : 0.0f;
  }
  kept = block_sum(kept);
  __shared__ float s_u;
  if (threadIdx.x == 0) {
    curandStatePhilox4_32_10_t st;
    curand_init(seed, blockIdx.x, counter * 4, &st);
    s_u = curand_uniform(&st) * kept;  // in (0, kept]
  }
  __syncthreads();
  const float u = s_u;
  // The first token (in index order) where the running sum of kept weights reaches u.
  using Scan = cub::BlockScan<float, kReduceThreads>;
  __shared__ typename Scan::TempStorage stmp;
  __shared__ float carry;
  __shared__ int chosen;
  if (threadIdx.x == 0) {
    carry = 0.0f;
    chosen = -1;
  }
  __syncthreads();
  int last_kept = 0;
  for (int base = 0; base < vocab; base += blockDim.x) {
    const int i = base + threadIdx.x;
    float w = i < vocab ? weight(i) : 0.0f;
    if (w < tau) w = 0.0f;
    if (w > 0.0f) last_kept = i;
    float incl;
    Scan(stmp).InclusiveSum(w, incl);
    incl += carry;
    if (w > 0.0f && incl >= u && incl - w < u) atomicCAS(&chosen, -1, i);
    __syncthreads();
    if (threadIdx.x == blockDim.x - 1) carry = incl;
    __syncthreads();
    if (chosen >= 0) break;
  }
  // Rounding can leave u just above the final sum: take the last kept token then.
  const int fallback = Reduce(rtmp).Reduce(float(last_kept), [](float a, float b) { return fmaxf(a, b); });
  if (threadIdx.x == 0) out[blockIdx.x] = chosen >= 0 ? chosen : int(fallback);
}

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Two uniform numbers of element i: u1 in (0, 1], u2 in [0, 1) (Box-Muller's inputs).
__device__ __forceinline__ void hashed_uniforms(uint64_t seed, size_t i, float& u1, float& u2) {
  const uint64_t h = splitmix64(seed ^ (i * 0xd1b54a32d192ed03ull));
  u1 = (float((h >> 40) & 0xffffffu) + 1.0f) * (1.0f / 16777217.0f);
  u2 = float(h & 0xffffffu) * (1.0f / 16777216.0f);
}

__global__ void fill_normal_kernel(bf16* p, size_t n, uint64_t seed, float std) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float u1, u2;
    hashed_uniforms(seed, i, u1, u2);
    p[i] = __float2bfloat16(std * sqrtf(-2.0f * __logf(u1)) * __cosf(6.2831853f * u2));
  }
}

__global__ void fill_normal_e4m3_kernel(uint8_t* p, size_t n, uint64_t seed, float code_std) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float u1, u2;
    hashed_uniforms(seed, i, u1, u2);
    p[i] = __nv_cvt_float_to_fp8(code_std * sqrtf(-2.0f * __logf(u1)) * __cosf(6.2831853f * u2), __NV_SATFINITE,
                                 __NV_E4M3);
  }
}

// One vector of 16 codes per iteration: a uint4 in, two uint4 of bf16 out (cols % 16 == 0, so a
// vector lies in one row). Byte j of the uint4 is the code at column 16 v + j (little endian).
__global__ void dequantize_e4m3_kernel(const uint8_t* __restrict__ codes, const float* __restrict__ scales,
                                       bf16* __restrict__ out, size_t n_vec, int vecs_per_row) {
  for (size_t v = size_t(blockIdx.x) * blockDim.x + threadIdx.x; v < n_vec; v += size_t(gridDim.x) * blockDim.x) {
    const float s = scales[v / size_t(vecs_per_row)];
    const uint4 q = __ldg(reinterpret_cast<const uint4*>(codes) + v);
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
    __align__(16) bf16 o[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      __nv_fp8_e4m3 c;
      c.__x = __nv_fp8_storage_t((words[j / 4] >> (8 * (j % 4))) & 0xffu);
      o[j] = __float2bfloat16_rn(float(c) * s);
    }
    uint4* dst = reinterpret_cast<uint4*>(out) + 2 * v;
    dst[0] = reinterpret_cast<const uint4*>(o)[0];
    dst[1] = reinterpret_cast<const uint4*>(o)[1];
  }
}

// One CTA per row: s = max|row| / 448 (1 for an all-zero row), then codes = e4m3(x / s) rounded to
// nearest even and saturating (the host quantiser's rule, core/fp8.h, so the codes equal
// quantize_rows_e4m3's on the same values bit for bit; the division is the IEEE one, __fdiv_rn).
// 8 values (one uint4 of bf16) per load; cols % 16 == 0.
__global__ void quantize_activations_e4m3_kernel(const bf16* __restrict__ x, uint8_t* __restrict__ codes,
                                          float* __restrict__ scales, int cols) {
  using Reduce = cub::BlockReduce<float, 256>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ float row_scale;
  const bf16* in = x + size_t(blockIdx.x) * size_t(cols);
  uint8_t* out = codes + size_t(blockIdx.x) * size_t(cols);
  const int n_vec = cols / 8;
  float m = 0.0f;
  for (int v = threadIdx.x; v < n_vec; v += blockDim.x) {
    const uint4 q = __ldg(reinterpret_cast<const uint4*>(in) + v);
    const bf16* e = reinterpret_cast<const bf16*>(&q);
#pragma unroll
    for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(__bfloat162float(e[j])));
  }
  const float row_max = Reduce(tmp).Reduce(m, [](float a, float b) { return fmaxf(a, b); });
  if (threadIdx.x == 0) {
    const float sc = row_max > 0.0f ? __fdiv_rn(row_max, kE4m3Max) : 1.0f;
    row_scale = sc;
    scales[blockIdx.x] = sc;
  }
  __syncthreads();
  const float sc = row_scale;
  for (int v = threadIdx.x; v < n_vec; v += blockDim.x) {
    const uint4 q = __ldg(reinterpret_cast<const uint4*>(in) + v);
    const bf16* e = reinterpret_cast<const bf16*>(&q);
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t c = __nv_cvt_float_to_fp8(__fdiv_rn(__bfloat162float(e[j]), sc), __NV_SATFINITE, __NV_E4M3);
      if (j < 4) lo |= c << (8 * j);
      else hi |= c << (8 * (j - 4));
    }
    reinterpret_cast<uint2*>(out)[v] = make_uint2(lo, hi);
  }
}

__global__ void fill_const_kernel(float* p, size_t n, float v) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) p[i] = v;
}

__global__ void add_bf16_kernel(bf16* dst, const bf16* src, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16(__bfloat162float(dst[i]) + __bfloat162float(src[i]));
}

int grid_for(size_t n, int threads) {
  const size_t blocks = (n + size_t(threads) - 1) / size_t(threads);
  return int(blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16);
}

}  // namespace

void embed(const int32_t* tokens, const bf16* table, float* x, int n, int d, cudaStream_t s) {
  launch_pdl(embed_kernel, n, 256, 0, s, tokens, table, x, d);
  LY_CUDA_CHECK_LAUNCH();
}

void add_rmsnorm(float* x, const bf16* delta, const float* bias, const float* w, bf16* out, int n,
                 int d, float eps, cudaStream_t s) {
  if (d % 4 == 0 && d <= 4 * 256 * 8) {  // up to 8192: 256 threads, <= 8 float4 each
    launch_pdl(add_rmsnorm_vec_kernel<8>, n, 256, 0, s, x, delta, bias, w, out, d, eps);
    LY_CUDA_CHECK_LAUNCH();
    return;
  }
  const int threads = d >= 2048 ? 1024 : (d >= 512 ? 512 : 256);
  launch_pdl(add_rmsnorm_kernel, n, threads, 0, s, x, delta, bias, w, out, d, eps);
  LY_CUDA_CHECK_LAUNCH();
}

void qkv_rope_append(const QkvArgs& a, cudaStream_t s) {
  const int half = a.head_dim / 2;
  constexpr int kWarpsPerBlock = 4;
  // Few tokens (decode): a warp per head over the SMs; many (prefill): a block per token.
  const int head_groups = a.n >= 64 ? 1 : (a.n_heads + 2 * a.n_kv_heads + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const dim3 grid(unsigned(a.n), unsigned(head_groups));
  const int threads = head_groups == 1 ? 256 : kWarpsPerBlock * kWarp;
  if (half <= 32) {
    launch_pdl(qkv_rope_append_kernel<1>, grid, dim3(unsigned(threads)), 0, s, a);
  } else if (half <= 64) {
    launch_pdl(qkv_rope_append_kernel<2>, grid, dim3(unsigned(threads)), 0, s, a);
  } else if (half <= 128) {
    launch_pdl(qkv_rope_append_kernel<4>, grid, dim3(unsigned(threads)), 0, s, a);
  } else {
    fail_cuda_msg("qkv_rope_append: head_dim above 256 is unsupported", a.head_dim, __FILE__, __LINE__);
  }
  LY_CUDA_CHECK_LAUNCH();
}

void silu_mul(const bf16* gu, const float* bias, bf16* out, int n, int ff, cudaStream_t s) {
  const bool vec8 = ff % 8 == 0 && reinterpret_cast<uintptr_t>(gu) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (!vec8) return detail::silu_mul_elementwise(gu, bias, out, n, ff, s);
  if (n <= 0) return;
  constexpr int kThreads = 128;
  const int vecs = ff / 8;
  const unsigned gx = unsigned(std::min((vecs + kThreads - 1) / kThreads, 64));
  const unsigned gy = unsigned(std::min(n, 65535));
  launch_pdl(silu_mul_vec8_kernel, dim3(gx, gy), dim3(kThreads), 0, s, gu, bias, out, n, ff);
  LY_CUDA_CHECK_LAUNCH();
}

void detail::silu_mul_elementwise(const bf16* gu, const float* bias, bf16* out, int n, int ff, cudaStream_t s) {
  launch_pdl(silu_mul_kernel, grid_for(size_t(n) * ff, 256), 256, 0, s, gu, bias, out, n, ff);
  LY_CUDA_CHECK_LAUNCH();
}

void argmax(const float* logits, int32_t* out, int batch, int vocab, cudaStream_t s) {
  launch_pdl(argmax_kernel, batch, kReduceThreads, 0, s, logits, out, vocab);
  LY_CUDA_CHECK_LAUNCH();
}

void sample(const float* logits, int32_t* out, int batch, int vocab, float temperature, int top_k,
            float top_p, uint64_t seed, uint64_t counter, cudaStream_t s) {
  sample_kernel<<<batch, kReduceThreads, 0, s>>>(logits, out, vocab, 1.0f / temperature, top_k, top_p, seed, counter);
  LY_CUDA_CHECK_LAUNCH();
}

void fill_normal_bf16(bf16* p, size_t n, uint64_t seed, float std, cudaStream_t s) {
  fill_normal_kernel<<<grid_for(n, 256), 256, 0, s>>>(p, n, seed, std);
  LY_CUDA_CHECK_LAUNCH();
}

__global__ void scatter_pairs_kernel(int32_t* dst, const int32_t* pairs, const int32_t* n, int max_n) {
  const int count = min(*n, max_n);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x)
    dst[pairs[2 * i]] = pairs[2 * i + 1];
}

void scatter_pairs(int32_t* dst, const int32_t* pairs, const int32_t* n, int max_n, cudaStream_t s) {
  scatter_pairs_kernel<<<std::max(1, std::min(32, (max_n + 255) / 256)), 256, 0, s>>>(dst, pairs, n, max_n);
  LY_CUDA_CHECK_LAUNCH();
}

void fill_const_f32(float* p, size_t n, float value, cudaStream_t s) {
  fill_const_kernel<<<grid_for(n, 256), 256, 0, s>>>(p, n, value);
  LY_CUDA_CHECK_LAUNCH();
}

void add_bf16(bf16* dst, const bf16* src, size_t n, cudaStream_t s) {
  add_bf16_kernel<<<grid_for(n, 256), 256, 0, s>>>(dst, src, n);
  LY_CUDA_CHECK_LAUNCH();
}

void fill_normal_e4m3(uint8_t* codes, size_t n, uint64_t seed, float code_std, cudaStream_t s) {
  fill_normal_e4m3_kernel<<<grid_for(n, 256), 256, 0, s>>>(codes, n, seed, code_std);
  LY_CUDA_CHECK_LAUNCH();
}

namespace detail {

void launch_dequantize_e4m3(const uint8_t* codes, const float* scales, bf16* out, int rows, int cols,
                            cudaStream_t s) {
  const size_t n_vec = size_t(rows) * size_t(cols / 16);
  dequantize_e4m3_kernel<<<grid_for(n_vec, 256), 256, 0, s>>>(codes, scales, out, n_vec, cols / 16);
  LY_CUDA_CHECK_LAUNCH();
}

void launch_quantize_activations_e4m3(const bf16* x, uint8_t* codes, float* scales, int rows, int cols, cudaStream_t s) {
  quantize_activations_e4m3_kernel<<<rows, 256, 0, s>>>(x, codes, scales, cols);
  LY_CUDA_CHECK_LAUNCH();
}

}  // namespace detail

}  // namespace lychee::cuda
