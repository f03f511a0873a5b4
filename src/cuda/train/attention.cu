// The trainer's attention rows (declared in cuda/train_kernels.h): materialised rows of one layer
// (dense softmax, the student's top-k selection and dense/sparse mix, and their backward). The
// TF32 flash forward for the dense prefill and the teacher is in train_flash.cu.
//
// Rows kernels: one block per (target row t, KV head h) handles the group's query rows. The
// logits rows are read twice (statistics, then output), the second read mostly from L2; the
// selection works on the group-summed logits staged in shared memory (4 bytes per key).
#include <algorithm>
#include <cfloat>

#include "cuda/common/ptx.cuh"
#include "cuda/common/radix_select.cuh"
#include "cuda/common/reduce.cuh"
#include "cuda/train/kernels.h"

namespace lychee::cuda::train_ops {

namespace {

constexpr int kWarp = 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kFwdThreads = 512;
constexpr int kBwdThreads = 512;  // fewer rows in flight: the second read of a row hits L2

// Online softmax state (max, sum of exp(x − max)) of a set of values.
__device__ __forceinline__ void softmax_push(float& m, float& l, float x) {
  if (x > m) {
    l = l * expf(m - x) + 1.0f;
    m = x;
  } else {
    l += expf(x - m);
  }
}

__device__ __forceinline__ float2 softmax_merge(float m1, float l1, float m2, float l2) {
  const float m = fmaxf(m1, m2);
  if (m == -INFINITY) return make_float2(m, 0.0f);
  return make_float2(m, l1 * expf(m1 - m) + l2 * expf(m2 - m));
}

// (dense max, dense sum, sparse max, sparse sum): the two online-softmax states merged pairwise.
struct MergeStatsOp {
  __device__ __forceinline__ float4 operator()(float4 v, float4 w) const {
    const float2 d = softmax_merge(v.x, v.y, w.x, w.y), s = softmax_merge(v.z, v.w, w.z, w.w);
    return make_float4(d.x, d.y, s.x, s.y);
  }
};

// Both softmax states merged over the block; every thread gets them.
__device__ __forceinline__ float4 block_merge_stats(float4 v) {
  return block_reduce(v, MergeStatsOp{}, make_float4(-INFINITY, 0.0f, -INFINITY, 0.0f));
}

__device__ __forceinline__ bool bit_set(const uint32_t* mask, int j) { return (mask[j >> 5] >> (j & 31)) & 1u; }

// Rows are read as float4 (rows start 16-byte aligned: ld is a multiple of 4) with kUnroll loads
// in flight per thread before any is used: one 4-byte load at a time per thread left the rows
// kernels at a third of the memory bandwidth (latency-bound).
constexpr int kUnroll = 4;
__device__ __forceinline__ void unpack(const float4 v, float (&e)[4]) {
  e[0] = v.x;
  e[1] = v.y;
  e[2] = v.z;
  e[3] = v.w;
}
__device__ __forceinline__ float4 add4(const float4 a, const float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// The rows' bits when the set is trivial: want == 0 (only p) or want >= p (every j <= p). Returns
// whether it wrote them.
__device__ bool select_trivial(int p, int want, uint32_t* out) {
  if (want > 0 && want < p) return false;
  const int n_words = p / 32 + 1;
  const uint32_t own_bit = 1u << (p & 31);
  for (int w = threadIdx.x; w < n_words; w += blockDim.x) {
    uint32_t bits = 0;
    if (want > 0) bits = w < p / 32 ? kFull : own_bit - 1u;
    out[w] = bits | (w == p / 32 ? own_bit : 0u);
  }
  return true;
}

// Writes {p} ∪ {j < p: key(j) > τ} ∪ the first `take` positions with key(j) == τ (of `ties` such)
// as bits into out[0 .. p / 32], by a block-wide pass over the mask words; key_of(j) gives the
// order-preserving key of position j.
template <typename KeyOf>
__device__ void write_top_mask(int p, uint32_t tau, uint32_t take, uint32_t ties, uint32_t* out, KeyOf key_of) {
  __shared__ uint32_t warp_count[kFwdThreads / kWarp];
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp, n_warps = blockDim.x / kWarp;
  const int n_words = p / 32 + 1;
  const uint32_t own_bit = 1u << (p & 31);
  if (take == ties) {
    for (int w = warp; w < n_words; w += n_warps) {
      const int j = 32 * w + lane;
      const uint32_t bits = __ballot_sync(kFull, j < p && key_of(j) >= tau);
      if (lane == 0) out[w] = bits | (w == p / 32 ? own_bit : 0u);
    }
    return;
  }
  uint32_t carry = 0;  // keys == τ in the words of earlier rounds
  for (int w0 = 0; w0 < n_words; w0 += n_warps) {
    const int w = w0 + warp;
    uint32_t gt = 0, eq = 0;
    if (w < n_words) {
      const int j = 32 * w + lane;
      const uint32_t key = j < p ? key_of(j) : 0u;
      gt = __ballot_sync(kFull, j < p && key > tau);
      eq = __ballot_sync(kFull, j < p && key == tau);
    }
    if (lane == 0) warp_count[warp] = uint32_t(__popc(eq));
    __syncthreads();
    uint32_t before = carry, round = 0;
    for (int i = 0; i < n_warps; ++i) {
      if (i < warp) before += warp_count[i];
      round += warp_count[i];
    }
    if (w < n_words && lane == 0) {
      int allow = int(take) - int(before);
      uint32_t bits = 0, m = eq;
      for (; allow > 0 && m != 0u; --allow) {
        bits |= m & (~m + 1u);  // lowest remaining position
        m &= m - 1u;
      }
      out[w] = gt | bits | (w == p / 32 ? own_bit : 0u);
    }
    carry += round;
    __syncthreads();
  }
}

// Writes the new set of one (h, t) row: {p} ∪ the `want` positions j < p with the largest
// group-summed logit acc[j] (ties: lower position first), as bits into out[0 .. p / 32].
// A radix select on order-preserving 32-bit keys (4 passes of 8 bits, warp-aggregated
// shared-memory histograms) finds the threshold key τ and how many keys equal to τ to take;
// those are taken in position order by a block-wide pass over the mask words.
__device__ void select_top(float* acc, int p, int want, uint32_t* out) {
  __shared__ uint32_t hist[256];
  if (select_trivial(p, want, out)) return;
  uint32_t* keys = reinterpret_cast<uint32_t*>(acc);  // [p] in place of acc
  for (int j = threadIdx.x; j < p; j += blockDim.x) keys[j] = radix_key(acc[j] + 0.0f);  // + 0 turns −0 into +0: they tie
  const auto key_at = [keys](int j, uint32_t& key) {
    key = keys[j];
    return true;
  };
  const RadixKth kth = radix_kth_largest<RadixCount::kWarpAggregated>(hist, p, uint32_t(want), key_at);
  write_top_mask(p, kth.key, kth.take, kth.ties, out, [keys](int j) { return keys[j]; });
}

// The same set from the row's values where they lie (global memory, read-only here), with the
// radix select after its first pass over the candidates alone: the first pass (the keys' top 8
// bits) leaves those of one bin, which, up to `cap` (<= kCompactCap) of them, are gathered into
// shared memory, and radix_kth_largest finds the rank still wanted among them there instead of
// visiting the row again (past `cap` it runs over the row). The k-th largest key does not depend
// on the candidates' order, so τ, take and ties (and the set) are select_top's. Keys are formed
// on the fly: the row is read three times (first pass, gathering, mask), against select_top's six
// in place (keys written, four passes, mask).
constexpr int kCompactCap = 8192;
__device__ void select_top_compact(const float* row, int p, int want, int cap, uint32_t* out) {
  __shared__ uint32_t hist[256];
  __shared__ uint32_t cand[kCompactCap];
  __shared__ uint32_t n_cand;
  if (select_trivial(p, want, out)) return;
  const auto key_of = [row](int j) { return radix_key(row[j] + 0.0f); };  // −0 and +0 tie
  RadixPrefix px;
  for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0u;
  if (threadIdx.x == 0) n_cand = 0u;
  __syncthreads();
  for (int i0 = 0; i0 < p; i0 += kUnroll * blockDim.x) {  // block-uniform: each warp stays whole
    uint32_t key[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int i = i0 + k * int(blockDim.x) + int(threadIdx.x);
      key[k] = i < p ? key_of(i) : 0u;
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int i = i0 + k * int(blockDim.x) + int(threadIdx.x);
      radix_hist_add_warp(hist, i < p, px.digit(key[k]));
    }
  }
  __syncthreads();
  const RadixBin<uint32_t> first = radix_find_bin(hist, uint32_t(want));
  px.descend(first.bin);
  const bool compact = first.count <= uint32_t(cap);
  if (compact) {
    for (int i = threadIdx.x; i < p; i += blockDim.x) {
      const uint32_t key = key_of(i);
      if (px.matches(key)) cand[atomicAdd(&n_cand, 1u)] = key;
    }
  }
  __syncthreads();  // the candidates, and radix_find_bin's broadcast slot free for the next call
  const RadixKth kth =
      compact ? radix_kth_largest<RadixCount::kWarpAggregated>(hist, int(n_cand), first.rank,
                                                                [](int i, uint32_t& key) {
                                                                  key = cand[i];
                                                                  return true;
                                                                })
              : radix_kth_largest<RadixCount::kWarpAggregated>(hist, p, uint32_t(want), [&](int i, uint32_t& key) {
                  key = key_of(i);
                  return true;
                });
  write_top_mask(p, kth.key, kth.take, kth.ties, out, key_of);
}

// Per query row g of the group: statistics of both softmaxes (and the group sum of the logits
// for the selection), then at once the mixed weights, re-reading the row while it is in L1/L2.
// The selection comes last: it needs only the group sum in shared memory, not the logits.
// kGlobalKeys: the selection's group sums in a.select_keys (contexts past shared memory); a
// template parameter so that the shared-memory instance keeps its registers (no spills).
template <bool kGlobalKeys>
__global__ void __launch_bounds__(kFwdThreads) attention_forward_kernel(AttnForwardArgs a) {
  extern __shared__ uint32_t smem[];  // [mask_words] the input set, then [n_cols] selection keys
  const int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const int group = a.n_heads / a.n_kv_heads;
  const int p = a.pos0 + t;
  const int n_words = p / 32 + 1;
  const bool sparse = a.mask_in != nullptr;
  const bool select = a.mask_out != nullptr && (a.select_z == nullptr || a.select_z[h] > 0.5f);
  const size_t mask_row = (size_t(h) * a.n + t) * a.mask_words;
  uint32_t* mask = smem;
  float4* acc4 = kGlobalKeys  // ld is a multiple of 4: rows stay 16-byte aligned
                     ? reinterpret_cast<float4*>(a.select_keys + (size_t(h) * a.n + t) * a.ld)
                     : reinterpret_cast<float4*>(smem + (a.mask_words + 3) / 4 * 4);
  if (sparse)
    for (int w = tid; w < n_words; w += blockDim.x) mask[w] = a.mask_in[mask_row + w];
  __syncthreads();

  const float z = sparse ? a.z[h] : 1.0f;
  const int n4_vis = (p + 4) / 4, n4_all = (a.n_cols + 3) / 4;  // float4s covering 0 .. p, all columns
  const int step = kUnroll * blockDim.x;
  for (int g = 0; g < group; ++g) {
    const size_t off = (size_t(h * group + g) * a.n + t) * a.ld;
    const float4* s4 = reinterpret_cast<const float4*>(a.s + off);
    float4* w4 = reinterpret_cast<float4*>(a.w + off);
    float md = -INFINITY, ld = 0.0f, ms = -INFINITY, ls = 0.0f;
    for (int i0 = tid; i0 < n4_vis; i0 += step) {
      float4 v[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int i = i0 + k * blockDim.x;
        v[k] = i < n4_vis ? s4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int i = i0 + k * blockDim.x;
        if (i >= n4_vis) break;
        if (select) acc4[i] = g == 0 ? v[k] : add4(acc4[i], v[k]);  // entries >= p are never read
        float e[4];
        unpack(v[k], e);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int j = 4 * i + c;
          if (j > p) break;
          const float x = e[c] * a.scale;
          softmax_push(md, ld, x);
          if (sparse && bit_set(mask, j)) softmax_push(ms, ls, x);
        }
      }
    }
    const float4 st = block_merge_stats(make_float4(md, ld, ms, ls));
    if (tid == 0 && a.stats != nullptr) a.stats[size_t(h * group + g) * a.n + t] = st;
    const float inv_d = 1.0f / st.y, inv_s = sparse ? 1.0f / st.w : 0.0f;
    for (int i0 = tid; i0 < n4_all; i0 += step) {  // w may be s: each float4 read, then written
      float4 v[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int i = i0 + k * blockDim.x;
        v[k] = i < n4_vis ? s4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int i = i0 + k * blockDim.x;
        if (i >= n4_all) break;
        float e[4];
        unpack(v[k], e);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int j = 4 * i + c;
          float w = 0.0f;
          if (j <= p) {
            const float x = e[c] * a.scale;
            w = expf(x - st.x) * inv_d;
            if (sparse) {
              const float ps = bit_set(mask, j) ? expf(x - st.z) * inv_s : 0.0f;
              w = z * w + (1.0f - z) * ps;
            }
          }
          e[c] = w;
        }
        w4[i] = make_float4(e[0], e[1], e[2], e[3]);
      }
    }
  }
  __syncthreads();
  float* acc = reinterpret_cast<float*>(acc4);

  if (a.mask_out != nullptr) {
    uint32_t* out = a.mask_out + mask_row;
    if (select) {
      const int k = max(1, int(ceil(a.keep_ratio * double(p + 1))));
      select_top(acc, p, k - 1, out);
    } else if (sparse) {  // this head keeps the set it was given
      for (int w = tid; w < n_words; w += blockDim.x) out[w] = mask[w];
    }
  }
}

// The selection apart from the rows (select_rows): one block per (target row t, KV head h), the
// row's group sums read from keys (global scratch): kMode 1 stages them in shared memory (dynamic)
// and selects there, 0 selects where they lie (converting them in place), 2 where they lie,
// read-only, with the later radix passes over the gathered candidates (select_top_compact).
template <int kMode>
__global__ void __launch_bounds__(kFwdThreads) select_rows_kernel(SelectRowsArgs a) {
  extern __shared__ float4 smem_keys[];
  const int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const int p = a.pos0 + t, n_words = p / 32 + 1;
  const size_t mask_row = (size_t(h) * a.n + t) * a.mask_words;
  uint32_t* out = a.mask_out + mask_row;
  if (a.select_z != nullptr && a.select_z[h] <= 0.5f) {  // this head keeps the set it was given
    for (int w = tid; w < n_words; w += blockDim.x) out[w] = a.mask_in[mask_row + w];
    return;
  }
  float* row = a.keys + (size_t(h) * a.n + t) * a.ld;
  const int k = max(1, int(ceil(a.keep_ratio * double(p + 1))));
  if constexpr (kMode == 2) {
    select_top_compact(row, p, k - 1, a.compact_cap > 0 ? min(a.compact_cap, kCompactCap) : kCompactCap, out);
  } else {
    if constexpr (kMode == 1) {
      const float4* src = reinterpret_cast<const float4*>(row);  // ld is a multiple of 4
      const int n4 = (p + 3) / 4, step = kUnroll * blockDim.x;
      for (int i0 = tid; i0 < n4; i0 += step) {
        float4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int i = i0 + u * blockDim.x;
          if (i < n4) v[u] = src[i];
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int i = i0 + u * blockDim.x;
          if (i < n4) smem_keys[i] = v[u];
        }
      }
      __syncthreads();
      row = reinterpret_cast<float*>(smem_keys);
    }
    select_top(row, p, k - 1, out);
  }
}

// qbar[t][h][:] = Σ_g q[t][(h·group + g)][:] (the group's query rows summed in g order).
__global__ void group_sum_queries_kernel(const float* __restrict__ q, int ld_q, float* __restrict__ qbar, int n,
                                         int n_kv_heads, int group, int head_dim) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t per_row = size_t(n_kv_heads) * head_dim;
  if (i >= size_t(n) * per_row) return;
  const size_t t = i / per_row, c = i % per_row, h = c / size_t(head_dim), d = c % size_t(head_dim);
  const float* src = q + t * size_t(ld_q) + h * size_t(group) * head_dim + d;
  float acc = src[0];
  for (int g = 1; g < group; ++g) acc += src[size_t(g) * head_dim];
  qbar[i] = acc;
}

// d out / d(scaled logit j) of the mix: z·p_j·(g_j − δ) + (1 − z)·p̃_j·(g_j − δ̃) with
// g_j = dout·v_j, δ = Σ p g (dense), δ̃ = Σ p̃ g (sparse); dz gets Σ_group (δ − δ̃).
__global__ void __launch_bounds__(kBwdThreads) attention_backward_kernel(AttnBackwardArgs a) {
  extern __shared__ uint32_t mask[];  // [mask_words]
  const int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const int group = a.n_heads / a.n_kv_heads;
  const int p = a.pos0 + t;
  const bool sparse = a.mask_in != nullptr;
  if (sparse) {
    const size_t mask_row = (size_t(h) * a.n + t) * a.mask_words;
    for (int w = tid; w <= p / 32; w += blockDim.x) mask[w] = a.mask_in[mask_row + w];
  }
  __syncthreads();
  const float z = sparse ? a.z[h] : 1.0f;
  const int n4_vis = (p + 4) / 4, n4_all = (a.n_cols + 3) / 4;
  const int step = kUnroll * blockDim.x;
  float dz = 0.0f;
  for (int g = 0; g < group; ++g) {
    const int b = h * group + g;
    const size_t off = (size_t(b) * a.n + t) * a.ld;
    const float4* s4 = reinterpret_cast<const float4*>(a.s + off);
    float4* g4 = reinterpret_cast<float4*>(a.g + off);
    const float4 st = a.stats[size_t(b) * a.n + t];
    const float inv_d = 1.0f / st.y, inv_s = sparse ? 1.0f / st.w : 0.0f;
    float dd = 0.0f, ds = 0.0f;
    for (int i0 = tid; i0 < n4_vis; i0 += step) {
      float4 sv[kUnroll], gv[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int i = i0 + k * blockDim.x;
        sv[k] = i < n4_vis ? s4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        gv[k] = i < n4_vis ? g4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int i = i0 + k * blockDim.x;
        if (i >= n4_vis) break;
        float se[4], ge[4];
        unpack(sv[k], se);
        unpack(gv[k], ge);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int j = 4 * i + c;
          if (j > p) break;
          const float x = se[c] * a.scale;
          dd += expf(x - st.x) * inv_d * ge[c];
          if (sparse && bit_set(mask, j)) ds += expf(x - st.z) * inv_s * ge[c];
        }
      }
    }
    const float2 delta = block_sum(make_float2(dd, ds));
    dz += delta.x - delta.y;
    float* tail = a.w_tail + (size_t(b) * a.n + t) * a.n;
    for (int i0 = tid; i0 < n4_all; i0 += step) {  // g is overwritten: each float4 read, then written
      float4 sv[kUnroll], gv[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int i = i0 + k * blockDim.x;
        sv[k] = i < n4_vis ? s4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        gv[k] = i < n4_vis ? g4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int i = i0 + k * blockDim.x;
        if (i >= n4_all) break;
        float se[4], ge[4];
        unpack(sv[k], se);
        unpack(gv[k], ge);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int j = 4 * i + c;
          float du = 0.0f, w = 0.0f;
          if (j <= p) {
            const float x = se[c] * a.scale;
            const float pd = expf(x - st.x) * inv_d;
            if (sparse) {
              const float ps = bit_set(mask, j) ? expf(x - st.z) * inv_s : 0.0f;
              w = z * pd + (1.0f - z) * ps;
              du = z * pd * (ge[c] - delta.x) + (1.0f - z) * ps * (ge[c] - delta.y);
            } else {
              w = pd;
              du = pd * (ge[c] - delta.x);
            }
          }
          ge[c] = a.scale * du;
          if (j >= a.pos0 && j < a.n_cols) tail[j - a.pos0] = w;
        }
        g4[i] = make_float4(ge[0], ge[1], ge[2], ge[3]);
      }
    }
  }
  if (sparse && tid == 0) a.dz_part[size_t(h) * a.n + t] = dz;
}

}  // namespace

size_t attention_forward_smem_bytes(int n_cols, int mask_words, bool select, bool keys_in_smem) {
  const size_t mask = (size_t(mask_words) + 3) / 4 * 4;
  const size_t keys = select && keys_in_smem ? (size_t(n_cols) + 3) / 4 * 4 : 0;
  return sizeof(uint32_t) * (mask + keys);  // each part padded to 16 bytes (float4 accesses)
}

// The most dynamic shared memory a launch of `kernel` may ask for: a block's opt-in limit less
// the kernel's static shared memory (select_top's histogram).
template <class Kernel>
size_t max_dynamic_smem(Kernel kernel) {
  cudaFuncAttributes attr{};
  LY_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  return device_info().smem_per_block_optin - attr.sharedSizeBytes;
}

// Function attributes live in each device's context (data-parallel ranks launch on several):
// once per device, the kernel may take all the dynamic shared memory a block can have.
template <class Kernel>
void allow_full_smem(Kernel kernel, uint64_t& devices_done) {
  if (first_on_device(devices_done))
    LY_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(max_dynamic_smem(kernel))));
}

size_t attention_forward_smem_limit() { return max_dynamic_smem(attention_forward_kernel<false>); }

void attention_forward_rows(const AttnForwardArgs& a, cudaStream_t s) {
  static uint64_t configured = 0;
  const size_t smem =
      attention_forward_smem_bytes(a.n_cols, a.mask_words, a.mask_out != nullptr, a.select_keys == nullptr);
  if (a.select_keys != nullptr) {  // shared memory holds the sets only
    static uint64_t configured_global = 0;
    if (smem > 48 * 1024) allow_full_smem(attention_forward_kernel<true>, configured_global);
    attention_forward_kernel<true><<<dim3(a.n, a.n_kv_heads), kFwdThreads, smem, s>>>(a);
  } else {
    if (smem > 48 * 1024) allow_full_smem(attention_forward_kernel<false>, configured);
    attention_forward_kernel<false><<<dim3(a.n, a.n_kv_heads), kFwdThreads, smem, s>>>(a);
  }
  LY_CUDA_CHECK_LAUNCH();
}

void select_rows(const SelectRowsArgs& a, cudaStream_t s) {
  // Chosen (keys_mode -1): shared memory for the keys where two blocks of them fit an SM (the row is
  // then read from memory once and the radix passes stay on chip); past that in place, with more
  // blocks resident to overlap them.
  const size_t smem = attention_forward_smem_bytes(a.n_cols, 0, true);  // a row of keys, 16-byte padded
  const size_t limit = max_dynamic_smem(select_rows_kernel<1>);
  int mode = a.keys_mode;
  if (mode < 0) mode = 2 * smem <= device_info().smem_per_sm ? 1 : 0;
  if (mode == 1 && smem > limit) mode = 0;
  const dim3 grid(unsigned(a.n), unsigned(a.n_kv_heads));
  if (mode == 1) {
    static uint64_t configured = 0;
    if (smem > 48 * 1024) allow_full_smem(select_rows_kernel<1>, configured);
    select_rows_kernel<1><<<grid, kFwdThreads, smem, s>>>(a);
  } else if (mode == 2) {
    select_rows_kernel<2><<<grid, kFwdThreads, 0, s>>>(a);
  } else {
    select_rows_kernel<0><<<grid, kFwdThreads, 0, s>>>(a);
  }
  LY_CUDA_CHECK_LAUNCH();
}

void group_sum_queries(const float* q, int ld_q, float* qbar, int n, int n_kv_heads, int group, int head_dim,
                       cudaStream_t s) {
  const size_t total = size_t(n) * n_kv_heads * head_dim;
  if (total == 0) return;
  group_sum_queries_kernel<<<unsigned((total + 255) / 256), 256, 0, s>>>(q, ld_q, qbar, n, n_kv_heads, group,
                                                                       head_dim);
  LY_CUDA_CHECK_LAUNCH();
}

void attention_backward_rows(const AttnBackwardArgs& a, cudaStream_t s) {
  static uint64_t configured = 0;
  const size_t smem = sizeof(uint32_t) * size_t(a.mask_words);
  if (smem > 48 * 1024) allow_full_smem(attention_backward_kernel, configured);
  attention_backward_kernel<<<dim3(a.n, a.n_kv_heads), kBwdThreads, smem, s>>>(a);
  LY_CUDA_CHECK_LAUNCH();
}

}  // namespace lychee::cuda::train_ops
