// The trainer's flash-attention forward (declared in cuda/train/kernels.h): dense causal
// attention for the teacher and the TF32 context prefill on TF32 tensor cores (fp32 in and out),
// with the keys split over blocks and merged when there are few query rows. (A bf16 twin of this
// kernel, measured slower than TF32 on an H200, was removed when the bf16 prefill moved to cuDNN's
// SDPA: git log -S flash_bf16_kernel.)
#include <algorithm>
#include <cfloat>

#include "cuda/common/ptx.cuh"
#include "cuda/train/kernels.h"

namespace lychee::cuda::train_ops {

namespace {

constexpr int kWarp = 32;
constexpr unsigned kFull = 0xffffffffu;

// ---- TF32 flash attention (forward, dense causal) ----
// m16n8k8 TF32 fragments (g = lane / 4, q = lane % 4): A a0 (g, q), a1 (g + 8, q), a2 (g, q + 4),
// a3 (g + 8, q + 4); B b0 (k = q, n = g), b1 (k = q + 4, n = g); C c0 (g, 2q), c1 (g, 2q + 1),
// c2 (g + 8, 2q), c3 (g + 8, 2q + 1). P goes from the C layout of S = QKᵀ straight into the A
// layout of P·V by reading the keys of each k-step in the order 0, 2, 4, 6, 1, 3, 5, 7: logical
// k = q is key 2q and k = q + 4 is key 2q + 1, and V's rows are read in the same order.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

struct FlashArgs {
  const float* q;
  const float* k;
  const float* v;
  float* out;
  float* part_o;    // [n_splits][n][ld_out] unnormalised outputs (n_splits > 1)
  float2* part_ml;  // [n_splits][n][n_heads] (max, sum) in log2 units (n_splits > 1)
  int ld_q, ld_kv, ld_out, n, pos0, n_heads, n_kv_heads, n_splits;
  float scale;
};

constexpr int kFlashRows = 64;    // query rows per block: 4 warps of 16
constexpr int kFlashKeys = 64;    // keys per shared-memory tile
constexpr int kFlashThreads = 128;

template <int D>
constexpr size_t flash_smem_bytes() {
  return size_t(2) * 2 * kFlashKeys * (D + 4) * sizeof(float);  // K and V, two stages
}

// The end of a flash block: each row's sum over its quad, then the normalised output (one split)
// or the unnormalised partial with its (max, sum) for flash_combine_kernel. o: the C fragments of
// the row pair (r0, r1) of head b, [D / 8 dim tiles][4].
template <int D>
__device__ __forceinline__ void write_flash_output(const FlashArgs& a, const float (&o)[D / 8][4], float m0,
                                                   float m1, float l0, float l1, int split, int b, int r0, int r1,
                                                   int qd) {
  l0 += __shfl_xor_sync(kFull, l0, 1);
  l0 += __shfl_xor_sync(kFull, l0, 2);
  l1 += __shfl_xor_sync(kFull, l1, 1);
  l1 += __shfl_xor_sync(kFull, l1, 2);
  float* out = a.out;
  float inv0 = 1.0f / l0, inv1 = 1.0f / l1;  // one split: key 0 makes l >= 1
  if (a.n_splits > 1) {  // unnormalised partials, merged by flash_combine_kernel
    out = a.part_o + size_t(split) * a.n * a.ld_out;
    inv0 = inv1 = 1.0f;
    if (qd == 0 && r0 < a.n) a.part_ml[(size_t(split) * a.n + r0) * a.n_heads + b] = make_float2(m0, l0);
    if (qd == 0 && r1 < a.n) a.part_ml[(size_t(split) * a.n + r1) * a.n_heads + b] = make_float2(m1, l1);
  }
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    const int col = b * D + dt * 8 + 2 * qd;
    if (r0 < a.n) *reinterpret_cast<float2*>(out + size_t(r0) * a.ld_out + col) = make_float2(o[dt][0] * inv0, o[dt][1] * inv0);
    if (r1 < a.n) *reinterpret_cast<float2*>(out + size_t(r1) * a.ld_out + col) = make_float2(o[dt][2] * inv1, o[dt][3] * inv1);
  }
}

template <int D>
__global__ void __launch_bounds__(kFlashThreads) flash_tf32_kernel(FlashArgs a) {
  constexpr int kStride = D + 4;  // padding makes the fragment loads conflict-free
  constexpr int kSteps = D / 8, kKeyTiles = kFlashKeys / 8;
  extern __shared__ float sm[];
  float* ks = sm;                               // [2][kFlashKeys][kStride]
  float* vs = sm + 2 * kFlashKeys * kStride;    // [2][kFlashKeys][kStride]
  const int tid = threadIdx.x, warp = tid / kWarp, lane = tid % kWarp, gr = lane / 4, qd = lane % 4;
  const int tile = gridDim.y - 1 - blockIdx.y;  // blocks start in x order: longest rows first
  const int b = blockIdx.x, h = b / (a.n_heads / a.n_kv_heads), split = blockIdx.z;
  const int row0 = tile * kFlashRows + warp * 16;
  const int r0 = row0 + gr, r1 = r0 + 8;
  const int block_last = min(tile * kFlashRows + kFlashRows, a.n) - 1;
  const int n_keys = a.pos0 + block_last + 1;
  const int n_tiles = (n_keys + kFlashKeys - 1) / kFlashKeys;
  const int per_split = (n_tiles + a.n_splits - 1) / a.n_splits;
  const int kt0 = min(split * per_split, n_tiles), kt1 = min(kt0 + per_split, n_tiles);
  const float* kc = a.k + size_t(h) * a.ld_kv * D;
  const float* vc = a.v + size_t(h) * a.ld_kv * D;

  auto load_tile = [&](int kt, int stage) {
    for (int c = tid; c < kFlashKeys * D / 4; c += kFlashThreads) {
      const int r = c / (D / 4), col = (c % (D / 4)) * 4, key = kt * kFlashKeys + r;
      const bool ok = key < n_keys;
      const size_t src = size_t(ok ? key : 0) * D + col;
      const int dst = (stage * kFlashKeys + r) * kStride + col;
      ptx::cp_async_16(ptx::smem_u32(ks + dst), kc + src, ok ? 16 : 0);
      ptx::cp_async_16(ptx::smem_u32(vs + dst), vc + src, ok ? 16 : 0);
    }
    ptx::cp_async_commit();
  };
  if (kt0 < kt1) load_tile(kt0, 0);

  const float qscale = a.scale * 1.4426950408889634f;  // softmax in base 2
  uint32_t qf[kSteps][4];
  const float* q0 = a.q + size_t(r0) * a.ld_q + b * D;
  const float* q1 = a.q + size_t(r1) * a.ld_q + b * D;
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const int c0 = kk * 8 + qd, c1 = c0 + 4;
    qf[kk][0] = to_tf32(r0 < a.n ? q0[c0] * qscale : 0.0f);
    qf[kk][1] = to_tf32(r1 < a.n ? q1[c0] * qscale : 0.0f);
    qf[kk][2] = to_tf32(r0 < a.n ? q0[c1] * qscale : 0.0f);
    qf[kk][3] = to_tf32(r1 < a.n ? q1[c1] * qscale : 0.0f);
  }
  float o[kSteps][4];
#pragma unroll
  for (int i = 0; i < kSteps; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  const int p0 = a.pos0 + r0, p1 = a.pos0 + r1;

  for (int kt = kt0; kt < kt1; ++kt) {
    const int stage = (kt - kt0) & 1;
    if (kt + 1 < kt1) {
      load_tile(kt + 1, stage ^ 1);
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads();
    const float* K = ks + stage * kFlashKeys * kStride;
    const float* V = vs + stage * kFlashKeys * kStride;
    float s[kKeyTiles][4];
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
      for (int nt = 0; nt < kKeyTiles; ++nt) {
        const float* kr = K + (nt * 8 + gr) * kStride + kk * 8 + qd;
        mma_tf32(s[nt], qf[kk], to_tf32(kr[0]), to_tf32(kr[4]));
      }
    }
    if (kt * kFlashKeys + kFlashKeys - 1 > a.pos0 + row0) {  // causal mask on this tile
#pragma unroll
      for (int nt = 0; nt < kKeyTiles; ++nt) {
        const int key = kt * kFlashKeys + nt * 8 + 2 * qd;
        if (key > p0) s[nt][0] = -INFINITY;
        if (key + 1 > p0) s[nt][1] = -INFINITY;
        if (key > p1) s[nt][2] = -INFINITY;
        if (key + 1 > p1) s[nt][3] = -INFINITY;
      }
    }
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt) {
      mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(kFull, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(kFull, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(kFull, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(kFull, mx1, 2));
    // A row may have seen no visible key yet (a later split, rows above the keys): base 0 then
    // keeps exp2 of −inf at 0 instead of NaN.
    const float b0 = mx0 == -INFINITY ? 0.0f : mx0, b1 = mx1 == -INFINITY ? 0.0f : mx1;
    const float c0 = exp2f(m0 - b0), c1 = exp2f(m1 - b1);
    m0 = mx0;
    m1 = mx1;
    l0 *= c0;
    l1 *= c1;
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      o[i][0] *= c0;
      o[i][1] *= c0;
      o[i][2] *= c1;
      o[i][3] *= c1;
    }
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt) {
      s[nt][0] = exp2f(s[nt][0] - b0);
      s[nt][1] = exp2f(s[nt][1] - b0);
      s[nt][2] = exp2f(s[nt][2] - b1);
      s[nt][3] = exp2f(s[nt][3] - b1);
      l0 += s[nt][0] + s[nt][1];
      l1 += s[nt][2] + s[nt][3];
      const uint32_t pa[4] = {to_tf32(s[nt][0]), to_tf32(s[nt][2]), to_tf32(s[nt][1]), to_tf32(s[nt][3])};
      const float* vr = V + (nt * 8 + 2 * qd) * kStride + gr;
#pragma unroll
      for (int dt = 0; dt < kSteps; ++dt) mma_tf32(o[dt], pa, to_tf32(vr[dt * 8]), to_tf32(vr[kStride + dt * 8]));
    }
    __syncthreads();  // this stage is refilled next iteration
  }
  write_flash_output<D>(a, o, m0, m1, l0, l1, split, b, r0, r1, qd);
}

// out[row][b] = Σ_s 2^(m_s − M)·o_s / Σ_s 2^(m_s − M)·l_s; split 0 holds key 0, so M is finite.
__global__ void flash_combine_kernel(FlashArgs a, int head_dim) {
  const int row = blockIdx.x, b = blockIdx.y;
  float m = -INFINITY;
  for (int sp = 0; sp < a.n_splits; ++sp) m = fmaxf(m, a.part_ml[(size_t(sp) * a.n + row) * a.n_heads + b].x);
  float l = 0.0f;
  for (int sp = 0; sp < a.n_splits; ++sp) {
    const float2 ml = a.part_ml[(size_t(sp) * a.n + row) * a.n_heads + b];
    l += ml.y * exp2f(ml.x - m);
  }
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    float acc = 0.0f;
    for (int sp = 0; sp < a.n_splits; ++sp) {
      const float w = exp2f(a.part_ml[(size_t(sp) * a.n + row) * a.n_heads + b].x - m);
      acc += w * a.part_o[(size_t(sp) * a.n + row) * a.ld_out + size_t(b) * head_dim + i];
    }
    a.out[size_t(row) * a.ld_out + size_t(b) * head_dim + i] = acc / l;
  }
}

template <int D>
void launch_flash(const FlashArgs& fa, cudaStream_t s) {
  static uint64_t configured = 0;  // function attributes live in each device's context
  if (first_on_device(configured))
    LY_CUDA_CHECK(cudaFuncSetAttribute(flash_tf32_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(flash_smem_bytes<D>())));
  const dim3 grid(fa.n_heads, (fa.n + kFlashRows - 1) / kFlashRows, fa.n_splits);
  flash_tf32_kernel<D><<<grid, kFlashThreads, flash_smem_bytes<D>(), s>>>(fa);
  LY_CUDA_CHECK_LAUNCH();
  if (fa.n_splits > 1) {
    flash_combine_kernel<<<dim3(fa.n, fa.n_heads), D, 0, s>>>(fa, D);
    LY_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

bool flash_supported(int head_dim) { return head_dim == 64 || head_dim == 128; }

int flash_splits(int n, int pos0, int n_heads, size_t scratch_floats, int ld_out) {
  const int blocks = n_heads * ((n + kFlashRows - 1) / kFlashRows);
  const int longest = (pos0 + n + kFlashKeys - 1) / kFlashKeys;  // key tiles of the last rows
  const int wave = 3 * device_info().sm_count;                   // resident blocks
  int splits = std::min({(2 * wave + blocks - 1) / blocks, longest / 2, kMaxFlashSplits});
  splits = std::max(splits, 1);
  while (splits > 1 && size_t(splits) * n * (size_t(ld_out) + 2 * size_t(n_heads)) > scratch_floats) --splits;
  return splits;
}

void flash_attention_tf32(const float* q, int ld_q, const float* k_cache, const float* v_cache,
                          int ld_kv, float* out, int ld_out, int n, int pos0, int n_heads,
                          int n_kv_heads, int head_dim, float scale, float* scratch,
                          size_t scratch_floats, cudaStream_t s) {
  const int splits = scratch != nullptr ? flash_splits(n, pos0, n_heads, scratch_floats, ld_out) : 1;
  float* part_o = scratch;
  float2* part_ml = splits > 1 ? reinterpret_cast<float2*>(scratch + size_t(splits) * n * ld_out) : nullptr;
  const FlashArgs fa{q, k_cache, v_cache, out, part_o, part_ml, ld_q, ld_kv, ld_out, n, pos0, n_heads,
                     n_kv_heads, splits, scale};
  if (head_dim == 64) {
    launch_flash<64>(fa, s);
  } else if (head_dim == 128) {
    launch_flash<128>(fa, s);
  } else {
    fail_cuda_msg("flash_attention_tf32: unsupported head_dim (64 and 128 only)", head_dim, __FILE__, __LINE__);
  }
}

}  // namespace lychee::cuda::train_ops
