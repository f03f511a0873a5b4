// The fallback prefill attention: FA2-style causal attention over the paged KV cache.
//
// One block = 64 queries of one (sequence, query head); 4 warps, 16 query rows each. K/V tiles of
// 64 keys are gathered page by page with cp.async into a double buffer (the next tile loads while
// this one is used); S = Q K^T and O += P V run on mma.sync m16n8k16 bf16 with f32 accumulators;
// softmax is online (running max and sum per row, in base 2). GQA: query head h reads KV head
// h / (n_heads / n_kv_heads); neighbouring heads of a group run as neighbouring blocks and share
// the KV tiles through L2.
//
// Napkin math (one sequence, L = q_len = kv_len, H query heads, d = head_dim): 4·L²·d·H/2 causal
// FLOPs; K/V are re-read once per 64-query tile, L/64 · L·d·2·2 B per head (≈ L²·d/16 B), which
// L2 absorbs for GQA neighbours. It is compute bound; the ceiling is the mma.sync rate, well under
// Hopper's wgmma rate, which is why cuDNN is the default (bench/bench_prefill_attention.cu).
//
// Split-KV: a short chunk over a long cache (a prompt's later chunks, a chat's next turn) has few
// (query tile, head) blocks — 32 for 64 queries of a 32-head model — each reading the whole cache,
// so a grid of them leaves most SMs idle (cuDNN's kernel likewise). The split variant gives each
// block one slice of the KV tiles and merges the slices' results by their log-sum-exp, as decode
// attention does (prefill_kv_splits picks the count; PrefillAttention::run uses it).
#include <cstdint>

#include "cuda/kernels/prefill_attention.h"
#include "cuda/common/ptx.cuh"
#include "cuda/kernels/kv_fp8.cuh"

namespace lychee::cuda {
namespace {

constexpr int kTileQ = 64;      // queries per block
constexpr int kTileK = 64;      // keys per K/V tile
constexpr int kThreads = 128;   // 4 warps x 16 query rows

template <int D>
struct Tile {
  static constexpr int kChunks = D / 8;             // 16-byte chunks per row
  static constexpr int kBytes = kTileQ * D * 2;     // one [64][D] bf16 tile
  static constexpr int kSmemBytes = 5 * kBytes;     // Q, K[2], V[2]
};

using namespace ptx;

// Byte offset of 16-byte chunk c of row r in a [64][D] tile. The chunk index is XORed with r % 8 so
// that the 8 rows one ldmatrix phase reads (same logical chunk) land in 8 different bank groups.
template <int D>
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return uint32_t((r * Tile<D>::kChunks + (c ^ (r & 7))) * 16);
}

// Epilogue of one warp: divides its 16 rows by their softmax sums (l: per-thread partial sums),
// stages them in its own 16 rows of the Q tile (only this warp read those), then writes whole
// 16-byte chunks of the rows below n_rows. out points at the tile's first row.
template <int D>
__device__ __forceinline__ void store_rows(const float (&o)[D / 8][4], float (&l)[2], uint32_t sq, int warp,
                                           int lane, bf16* out, size_t row_stride, int n_rows) {
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    inv[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
  }
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) {
    const uint32_t lo = pack_bf16x2(o[nd][0] * inv[0], o[nd][1] * inv[0]);
    const uint32_t hi = pack_bf16x2(o[nd][2] * inv[1], o[nd][3] * inv[1]);
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(sq + swz<D>(warp * 16 + g, nd) + t4 * 4), "r"(lo) : "memory");
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(sq + swz<D>(warp * 16 + g + 8, nd) + t4 * 4), "r"(hi)
                 : "memory");
  }
  __syncwarp();
  for (int c = lane; c < 16 * Tile<D>::kChunks; c += 32) {
    const int r = warp * 16 + c / Tile<D>::kChunks, ch = c % Tile<D>::kChunks;
    if (r >= n_rows) continue;
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(sq + swz<D>(r, ch))
                 : "memory");
    *reinterpret_cast<uint4*>(out + size_t(r) * row_stride + ch * 8) = v;
  }
}

// Split-KV (kSplit): block z = b * n_splits + split reads only KV tiles [split * tiles_per_split,
// (split + 1) * tiles_per_split) of what its rows see, and writes its rows' partial result in f32,
// normalised by its own softmax sum, with that sum's log2-sum-exp (-inf: no key of the split is
// visible to the row) for prefill_merge_kernel.
struct SplitArgs {
  int n_splits = 1, tiles_per_split = 0;
  float* part_o = nullptr;    // [n_splits][batch][q_len_max][n_heads][D]
  float* part_lse = nullptr;  // [n_splits][batch][q_len_max][n_heads], base 2, scaled scores
};

template <int D, bool kSplit>
__global__ void __launch_bounds__(kThreads)
    prefill_fallback_kernel(const PrefillAttentionArgs a, const float scale_log2, const SplitArgs sp) {
  using T = Tile<D>;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sq = smem_u32(smem);             // [64][D] Q, later the output staging
  const uint32_t sk = sq + T::kBytes;             // [2][64][D]
  const uint32_t sv = sk + 2 * T::kBytes;         // [2][64][D]

  const int b = kSplit ? int(blockIdx.z) / sp.n_splits : int(blockIdx.z), h = blockIdx.y;
  const int split = kSplit ? int(blockIdx.z) % sp.n_splits : 0;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kTileQ;  // longest rows (most keys) first
  const int q_len = a.q_lens[b], kv_len = a.kv_lens[b];
  if (q0 >= q_len) return;
  const int offset = kv_len - q_len;                  // query i sees keys t <= offset + i
  const int kv_end = offset + min(q0 + kTileQ, q_len);  // keys any valid row of the tile sees
  const int n_tiles_seen = (kv_end + kTileK - 1) / kTileK;
  const int t_begin = kSplit ? split * sp.tiles_per_split : 0;
  const int t_end = kSplit ? min(n_tiles_seen, t_begin + sp.tiles_per_split) : n_tiles_seen;
  const int kvh = h / (a.n_heads / a.n_kv_heads);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const size_t part_row0 = kSplit ? ((size_t(split) * a.batch + b) * a.q_len_max + q0) * a.n_heads + h : 0;
  if (kSplit && t_begin >= t_end) {  // no key of this split is visible: an empty partial result
    for (int r = tid; r < min(kTileQ, q_len - q0); r += kThreads)
      sp.part_lse[part_row0 + size_t(r) * a.n_heads] = -INFINITY;
    return;
  }

  // Q tile, rows past q_len zero-filled.
  const size_t q_row = size_t(a.n_heads) * D;
  const bf16* qb = a.q + (size_t(b) * a.q_len_max * a.n_heads + h) * D;
  for (int c = tid; c < kTileQ * T::kChunks; c += kThreads) {
    const int r = c / T::kChunks, ch = c % T::kChunks;
    const bool valid = q0 + r < q_len;
    cp_async_16(sq + swz<D>(r, ch), valid ? qb + size_t(q0 + r) * q_row + ch * 8 : a.q, valid ? 16 : 0);
  }
  cp_async_commit();

  const int32_t* table = a.page_table + size_t(b) * a.max_pages;
  auto load_kv = [&](int tile, int buf) {
    const int k0 = tile * kTileK;
    for (int c = tid; c < kTileK * T::kChunks; c += kThreads) {
      const int r = c / T::kChunks, ch = c % T::kChunks;
      const int t = k0 + r;
      // Keys past kv_end are zero-filled (finite scores, masked below) and their table entries
      // never read: a zero V row keeps stale shared memory (possibly NaN) out of P V.
      const bool valid = t < kv_end;
      size_t off = 0;
      if (valid) {
        const int page = table[t / a.page_size];
        off = ((size_t(page) * a.n_kv_heads + kvh) * a.page_size + t % a.page_size) * D + ch * 8;
      }
      cp_async_16(sk + buf * T::kBytes + swz<D>(r, ch), a.k_pool + off, valid ? 16 : 0);
      cp_async_16(sv + buf * T::kBytes + swz<D>(r, ch), a.v_pool + off, valid ? 16 : 0);
    }
    cp_async_commit();
  };
  load_kv(t_begin, 0);

  cp_async_wait<1>();  // Q landed (tile 0 may still be in flight)
  __syncthreads();
  uint32_t qf[D / 16][4];  // this warp's 16 rows as A fragments, one per 16 columns of d
#pragma unroll
  for (int kb = 0; kb < D / 16; ++kb)
    ldmatrix_x4(qf[kb], sq + swz<D>(warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, kb * 2 + (lane >> 4)));

  float o[D / 8][4] = {};  // rows g = lane / 4 and g + 8; columns 8 nd + 2 (lane % 4) + {0, 1}
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int row0 = q0 + warp * 16 + (lane >> 2);  // query index of o[.][0..1]; row0 + 8 for [2..3]

  for (int j = t_begin; j < t_end; ++j) {
    const int buf = (j - t_begin) & 1;
    cp_async_wait<0>();
    __syncthreads();  // tile j visible to all; everyone is done with tile j - 1's buffer
    if (j + 1 < t_end) load_kv(j + 1, buf ^ 1);

    float s[kTileK / 8][4] = {};
#pragma unroll
    for (int kb = 0; kb < D / 16; ++kb) {
#pragma unroll
      for (int np = 0; np < kTileK / 16; ++np) {
        uint32_t kf[4];
        ldmatrix_x4(kf, sk + buf * T::kBytes +
                            swz<D>(np * 16 + (lane & 7) + (lane >> 4) * 8, kb * 2 + ((lane >> 3) & 1)));
        mma_bf16(s[2 * np], qf[kb], kf[0], kf[1]);
        mma_bf16(s[2 * np + 1], qf[kb], kf[2], kf[3]);
      }
    }

    const int k0 = j * kTileK;
    if (k0 + kTileK - 1 > offset + q0 + warp * 16) {  // the diagonal crosses this warp's rows
#pragma unroll
      for (int nb = 0; nb < kTileK / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + nb * 8 + (lane & 3) * 2 + (e & 1);
          if (key > offset + row0 + (e >> 1) * 8) s[nb][e] = -INFINITY;
        }
    }

    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < kTileK / 8; ++nb) {
      mx[0] = fmaxf(mx[0], fmaxf(s[nb][0], s[nb][1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[nb][2], s[nb][3]));
    }
    float ref[2], corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r] * scale_log2);
      ref[r] = m_new == -INFINITY ? 0.0f : m_new;  // a fully masked row so far: avoid -inf - -inf
      corr[r] = exp2f(m[r] - ref[r]);
      m[r] = m_new;
    }

    uint32_t pf[kTileK / 16][4];  // P as A fragments, one per 16 keys
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nb = 0; nb < kTileK / 8; ++nb) {
      const float p0 = exp2f(fmaf(s[nb][0], scale_log2, -ref[0]));
      const float p1 = exp2f(fmaf(s[nb][1], scale_log2, -ref[0]));
      const float p2 = exp2f(fmaf(s[nb][2], scale_log2, -ref[1]));
      const float p3 = exp2f(fmaf(s[nb][3], scale_log2, -ref[1]));
      rs[0] += p0 + p1;
      rs[1] += p2 + p3;
      pf[nb >> 1][(nb & 1) * 2 + 0] = pack_bf16x2(p0, p1);
      pf[nb >> 1][(nb & 1) * 2 + 1] = pack_bf16x2(p2, p3);
    }
    // Per-thread partial sums: the correction is uniform along a row, so the four threads of a
    // row reduce their sums once, after the last tile.
    l[0] = l[0] * corr[0] + rs[0];
    l[1] = l[1] * corr[1] + rs[1];
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      o[nd][0] *= corr[0];
      o[nd][1] *= corr[0];
      o[nd][2] *= corr[1];
      o[nd][3] *= corr[1];
    }

#pragma unroll
    for (int kk = 0; kk < kTileK / 16; ++kk) {
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vf[4];
        ldmatrix_x4_trans(vf, sv + buf * T::kBytes +
                                  swz<D>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, dp * 2 + (lane >> 4)));
        mma_bf16(o[2 * dp], pf[kk], vf[0], vf[1]);
        mma_bf16(o[2 * dp + 1], pf[kk], vf[2], vf[3]);
      }
    }
  }

  if constexpr (kSplit) {
    // This split's rows: o / l in f32 and log2(sum) + max, straight from the fragments.
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
      const int row = warp * 16 + g + r * 8;  // within the tile
      if (q0 + row >= q_len) continue;
      const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
      const size_t at = part_row0 + size_t(row) * a.n_heads;
      float* po = sp.part_o + at * D;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd)
        *reinterpret_cast<float2*>(po + nd * 8 + t4 * 2) = make_float2(o[nd][2 * r] * inv, o[nd][2 * r + 1] * inv);
      if (t4 == 0) sp.part_lse[at] = l[r] > 0.0f ? m[r] + log2f(l[r]) : -INFINITY;
    }
  } else {
    bf16* ob = a.out + (size_t(b) * a.q_len_max * a.n_heads + h) * D;
    store_rows<D>(o, l, sq, warp, lane, ob + size_t(q0) * q_row, q_row, q_len - q0);
  }
}

// Combines the splits of one (sequence, query, head): weights 2^(lse_s - max lse), one thread per
// element of d. Rows past q_len are left untouched.
template <int D>
__global__ void __launch_bounds__(D) prefill_merge_kernel(const PrefillAttentionArgs a, const SplitArgs sp) {
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (i >= a.q_lens[b]) return;
  const size_t row = (size_t(b) * a.q_len_max + i) * a.n_heads + h;
  const size_t split_stride = size_t(a.batch) * a.q_len_max * a.n_heads;
  float mx = -INFINITY;
  for (int s = 0; s < sp.n_splits; ++s) mx = fmaxf(mx, sp.part_lse[row + s * split_stride]);
  float num = 0.0f, den = 0.0f;
  for (int s = 0; s < sp.n_splits; ++s) {
    const float lse = sp.part_lse[row + s * split_stride];
    if (lse == -INFINITY) continue;  // its o was not written
    const float w = exp2f(lse - mx);
    num += w * sp.part_o[(row + s * split_stride) * D + threadIdx.x];
    den += w;
  }
  a.out[row * D + threadIdx.x] = __float2bfloat16(den > 0.0f ? num / den : 0.0f);
}

template <int D>
void launch(const PrefillAttentionArgs& a, const SplitArgs& sp, cudaStream_t stream) {
  static uint64_t smem_set = 0;  // per device
  if (first_on_device(smem_set)) {
    LY_CUDA_CHECK(cudaFuncSetAttribute(prefill_fallback_kernel<D, false>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, Tile<D>::kSmemBytes));
    LY_CUDA_CHECK(cudaFuncSetAttribute(prefill_fallback_kernel<D, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       Tile<D>::kSmemBytes));
  }
  const float scale_log2 = a.scale * 1.4426950408889634f;
  const unsigned q_tiles = unsigned((a.q_len_max + kTileQ - 1) / kTileQ);
  if (sp.n_splits <= 1) {
    const dim3 grid(q_tiles, a.n_heads, a.batch);
    prefill_fallback_kernel<D, false><<<grid, kThreads, Tile<D>::kSmemBytes, stream>>>(a, scale_log2, sp);
    LY_CUDA_CHECK_LAUNCH();
    return;
  }
  const dim3 grid(q_tiles, a.n_heads, unsigned(a.batch * sp.n_splits));
  prefill_fallback_kernel<D, true><<<grid, kThreads, Tile<D>::kSmemBytes, stream>>>(a, scale_log2, sp);
  LY_CUDA_CHECK_LAUNCH();
  prefill_merge_kernel<D><<<dim3(a.q_len_max, a.n_heads, a.batch), D, 0, stream>>>(a, sp);
  LY_CUDA_CHECK_LAUNCH();
}

__global__ void fill_offsets_kernel(int32_t* out, int n, int32_t stride) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i * stride;
}

}  // namespace

namespace detail {
// (fmt does not compile under nvcc, so the error for other head dims is raised by the caller.)
bool launch_prefill_fallback(const PrefillAttentionArgs& a, cudaStream_t stream) {
  return launch_prefill_split(a, 1, nullptr, nullptr, stream);
}

bool launch_prefill_split(const PrefillAttentionArgs& a, int n_splits, float* part_o, float* part_lse,
                          cudaStream_t stream) {
  SplitArgs sp;
  sp.n_splits = n_splits;
  const int kv_tiles = (a.max_kv_len + kTileK - 1) / kTileK;
  sp.tiles_per_split = (kv_tiles + n_splits - 1) / n_splits;
  sp.part_o = part_o;
  sp.part_lse = part_lse;
  switch (a.head_dim) {
    case 64: launch<64>(a, sp, stream); return true;
    case 128: launch<128>(a, sp, stream); return true;
    default: return false;
  }
}

void fill_ragged_offsets(int32_t* out, int n, int32_t stride, cudaStream_t stream) {
  fill_offsets_kernel<<<(n + 255) / 256, 256, 0, stream>>>(out, n, stride);
  LY_CUDA_CHECK_LAUNCH();
}
}  // namespace detail

namespace {

// One block per (sequence, KV head, page): 16-byte copies of the page's rows.
__global__ void gather_pages_kernel(PrefillAttentionArgs a, int kv_bucket, bf16* k_out, bf16* v_out) {
  const int p = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int page = a.page_table[size_t(b) * a.max_pages + p];
  const size_t src = (size_t(page) * a.n_kv_heads + h) * a.page_size * a.head_dim;
  const size_t dst = ((size_t(b) * a.n_kv_heads + h) * kv_bucket + size_t(p) * a.page_size) * a.head_dim;
  const int n = a.page_size * a.head_dim / 8;  // uint4 = 8 bf16
  const uint4* ks = reinterpret_cast<const uint4*>(a.k_pool + src);
  const uint4* vs = reinterpret_cast<const uint4*>(a.v_pool + src);
  uint4* kd = reinterpret_cast<uint4*>(k_out + dst);
  uint4* vd = reinterpret_cast<uint4*>(v_out + dst);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    kd[i] = ks[i];
    vd[i] = vs[i];
  }
}

// The same for FP8 pages, widened: 16 codes a thread and step, bf16(scale · code).
__global__ void widen_fp8_pages_kernel(PrefillAttentionArgs a, int kv_bucket, bf16* k_out, bf16* v_out,
                                       int32_t* table_out) {
  const int p = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (p == 0 && h == 0 && threadIdx.x == 0) table_out[b] = b;
  const int page = a.page_table[size_t(b) * a.max_pages + p];
  const size_t row0 = (size_t(page) * a.n_kv_heads + h) * a.page_size;  // the page's first row of head h
  const size_t dst = ((size_t(b) * a.n_kv_heads + h) * kv_bucket + size_t(p) * a.page_size) * a.head_dim;
  const int chunks = a.head_dim / 16, n = a.page_size * chunks;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int r = i / chunks, c = i % chunks;
    const size_t src = (row0 + r) * a.head_dim + size_t(c) * 16;
#pragma unroll
    for (int kv = 0; kv < 2; ++kv) {
      const uint4 w = *reinterpret_cast<const uint4*>((kv == 0 ? a.k8_pool : a.v8_pool) + src);
      const float sc = (kv == 0 ? a.k_scale : a.v_scale)[row0 + r];
      const uint8_t* codes = reinterpret_cast<const uint8_t*>(&w);
      uint4 out[2];
      bf16* o = reinterpret_cast<bf16*>(out);
#pragma unroll
      for (int j = 0; j < 16; ++j) o[j] = __float2bfloat16_rn(sc * kv_fp8_value(codes[j]));
      uint4* d = reinterpret_cast<uint4*>((kv == 0 ? k_out : v_out) + dst + size_t(r) * a.head_dim + size_t(c) * 16);
      d[0] = out[0];
      d[1] = out[1];
    }
  }
}

}  // namespace

namespace detail {
void widen_fp8_pages(const PrefillAttentionArgs& a, int kv_bucket, bf16* k_out, bf16* v_out, int32_t* table_out,
                     cudaStream_t stream) {
  const dim3 grid(unsigned(kv_bucket / a.page_size), unsigned(a.n_kv_heads), unsigned(a.batch));
  widen_fp8_pages_kernel<<<grid, 256, 0, stream>>>(a, kv_bucket, k_out, v_out, table_out);
  LY_CUDA_CHECK_LAUNCH();
}

void gather_pages(const PrefillAttentionArgs& a, int kv_bucket, bf16* k_out, bf16* v_out, cudaStream_t stream) {
  const dim3 grid(unsigned(kv_bucket / a.page_size), unsigned(a.n_kv_heads), unsigned(a.batch));
  gather_pages_kernel<<<grid, 256, 0, stream>>>(a, kv_bucket, k_out, v_out);
  LY_CUDA_CHECK_LAUNCH();
}
}  // namespace detail

}  // namespace lychee::cuda
