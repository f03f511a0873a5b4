// bf16 weight matrix-vector products for decode steps, with the neighbouring per-token work folded
// in so that a batch-1 layer is a few kernels instead of a dozen:
//   s[i][j] = f_i · Σ_t w[j][t] · x[i][t]                  (i < n <= 8, j < m, t < k)
// with f_i = 1, or, when x is the bf16 norm-weighted residual bf16(norm · v) that a kAddF32 product
// wrote with next_norm (below), the RMSNorm factor f_i = rsqrt(Σ_t v[i][t]² / k + eps) from the
// partial sums of squares it wrote beside it (ss): then s is the product of RMSNorm(v) · norm —
// add_rmsnorm (kernels.h) without a kernel of its own (one rounding per input, bf16(norm · v), where
// add_rmsnorm rounds bf16(norm · (v · r))). And s goes out as:
//   kBf16    y[i][j] = bf16(s)                                     (y bf16 [n][m])
//   kF32     y[i][j] = s                                           (y f32 [n][m]: logits)
//   kAddF32  y[i][j] = (y[i][j] + s) + bias[j]                     (y f32 [n][m]: the residual add)
//            and with next_norm: xn[i][j] = bf16(next_norm[j] · y[i][j]) (xn_lo: what that rounded
//            off, in bf16), and ss_out[i][b] = Σ y[i][j]²
//            over the 16 rows j of block b (bf16_gemv_ss_count(m) slots per row): the next product's x
//            and ss
//   kSwiGlu  y[i][j] = bf16(silu(s_j + bias[j]) · (s_{f+j} + bias[f + j])), j < f = m / 2
//            (w's rows: f gate rows, then f up rows, as the runner's fused gate/up matrix; y bf16 [n][f]);
//            16 or 8 outputs per block (swiglu_outputs below): the same bits
//   kQkvRope the fused QKV projection with qkv_rope_append (kernels.h) as its epilogue: w's m rows
//            are the Q, K and V heads of head_dim d each (rope.n_heads + 2 rope.n_kv_heads of them);
//            u_j = s_j + bias[j], then for Q and K heads RoPE on the pairs (p, p + d/2) of each head
//            at the row's position (x0 c - x1 s, x1 c + x0 s; angle positions[i] · inv_freq[p]),
//            rounded to bf16 once: Q into y (bf16 [n][n_heads][d]), K and V into the pools at the
//            token's page slot (kv_page[i], kv_row[i]). No q/k norm (its sums span the whole head:
//            such models keep the separate kernel). d a multiple of 16. Against the separate kernel
//            (bf16, H100, alternated): 8B b1 128K LycheeDecode 6.93 -> 6.86 ms, Full 11.48 ->
//            11.42; default model 1507 -> 1561 tok/s.
// bias f32, may be null. FP8 weights (w8 and w_scale instead of w: e4m3 codes [m][k] and a scale
// per row, core/fp8.h's layout as GpuMatrix holds it) make every s_j of the above
// w_scale[j] · Σ_t e4m3(w8[j][t]) · x[i][t] (the codes widened to bf16 exactly, as fp8_gemv.h does):
// the same epilogues over half the weight bytes; without the norm, kBf16 and kF32 outputs are
// fp8_gemv's and fp8_gemv_f32_out's bit for bit (the same lanes, chunks and order). With FP8
// weights the norm's input is x alone (no x_lo: bf16_gemv.cu says why).
// The sums are f32 (bf16 products are exact in f32) in an order that depends
// only on k: each output's bits are the same whatever m, n or the other rows are, and two calls
// give the same bits. What changes against the unfused kernels (cuBLASLt + add_rmsnorm + silu_mul):
// the summation order, where the norm's rounding falls, and the product's result reaches the
// residual add and SwiGLU unrounded (they rounded it to bf16 first) — closer to the f32
// reference, not bit-equal to the old path.
//
// The weights are read once per call at close to copy bandwidth (design and byte count in
// bf16_gemv.cu). Capturable in CUDA graphs: no host synchronisation, no allocation. Written for
// programmatic dependent launch (measured slower, so off unless LYCHEE_BF16_GEMV_PDL=1): the first
// weights are then read before the previous kernel in the stream has finished (everything else
// after it), so w, the norm weights and bias must not be written by a kernel that may still run
// (they are weights: written at load time). y, xn and ss_out must not overlap x or ss.
#pragma once

#include <cstdint>

#include "cuda/common/common.h"

namespace lychee::cuda {

// The largest n (rows of x) the kernel takes: the 8 columns of one mma.sync tile.
constexpr int kBf16GemvMaxRows = 8;

enum class GemvOut { kBf16, kF32, kAddF32, kSwiGlu, kQkvRope };

// kQkvRope's epilogue (see the top; as QkvArgs in kernels.h).
struct Bf16GemvRope {
  const int32_t* positions = nullptr;  // [n]
  const int32_t* kv_page = nullptr;    // [n] the page receiving row i's K/V
  const int32_t* kv_row = nullptr;     // [n] its slot in that page
  const float* inv_freq = nullptr;     // [head_dim / 2]
  bf16* k_pool = nullptr;              // [n_pages][n_kv_heads][page_size][head_dim]
  bf16* v_pool = nullptr;
  int n_heads = 0, n_kv_heads = 0, head_dim = 0, page_size = 0;
};

struct Bf16GemvArgs {
  const bf16* x = nullptr;      // [n][k] row-major, 16-byte aligned
  // With ss: x's rounding residues [n][k] (what a kAddF32 product with xn_lo wrote), or null. The
  // product is then w · (x + x_lo): the norm's output to ~16 significant bits, not bf16's 8.
  const bf16* x_lo = nullptr;
  const float* ss = nullptr;    // [n][ss_count] partial sums of squares (see the top), or null
  int ss_count = 0;
  float eps = 0.0f;             // RMSNorm epsilon (with ss)
  const bf16* w = nullptr;      // [m][k] row-major (bf16 weights; null with w8)
  const uint8_t* w8 = nullptr;  // [m][k] e4m3 codes (FP8 weights; null with w), k a multiple of 16
  const float* w_scale = nullptr;  // [m] f32, with w8
  GemvOut out = GemvOut::kBf16;
  void* y = nullptr;            // see the top: bf16 [n][m], f32 [n][m], or bf16 [n][m / 2]
  const float* bias = nullptr;  // kAddF32, kQkvRope: [m]; kSwiGlu: [m] (gate, then up); else ignored
  // kAddF32 only: the next RMSNorm's weights [m] and where its inputs go (see the top), or null.
  const float* next_norm = nullptr;
  bf16* xn = nullptr;           // [n][m]
  bf16* xn_lo = nullptr;        // [n][m] bf16(next_norm · y - xn), or null
  float* ss_out = nullptr;      // [n][bf16_gemv_ss_count(m)]
  Bf16GemvRope rope;            // kQkvRope only
  int n = 0, k = 0, m = 0;
  // Weight staging (bf16_gemv.cu): -1 the automatic choice (the ring; LYCHEE_BF16_GEMV_STAGES), 0 one step
  // ahead in registers, 2 a shared-memory ring of two steps. Every setting gives the same bits.
  int stages = -1;
  // Programmatic dependent launch: -1 by size and grid (products of at most 16 MB of weights, and
  // grids of at most two blocks per SM, launched two per SM; bf16_gemv.cu says why), 0 plain, 1 PDL (the caller knows the previous kernel is small, e.g. the decode
  // merge). LYCHEE_BF16_GEMV_PDL=0|1 in the environment overrides every product (lab A/B).
  int pdl = -1;
  // kSwiGlu's outputs per block: 16 (two m16 tiles: 16 gate rows, their 16 up rows) or 8 (one tile:
  // 8 gate rows with their up rows as the mma's rows g + 8; twice the blocks), the same bits either
  // way; -1 picks 8 where its grid fills the last wave of the GPU better and n <= 2 or 16's grid is
  // under 1.5 waves (bf16_gemv.cu has the measurements; LYCHEE_BF16_GEMV_SWIGLU=8|16 overrides it:
  // lab A/B). E.g. Llama-3-8B's gate/up: 896 blocks of 16 = 2.26 waves of 3 blocks per SM on an
  // H100/H200, 1792 of 8 = 4.5 waves; halved by tensor parallelism over 2 GPUs, 1.13 against 2.26.
  int swiglu_outputs = -1;
};

// The partial sums of squares a kAddF32 product of m rows writes per x row (its blocks).
constexpr int bf16_gemv_ss_count(int m) { return (m + 15) / 16; }

// The checks bf16_gemv runs before launching (no GPU needed, so tests can call them):
// kInvalidArgument for n < 1, k < 1, m < 1, a null x or y, not exactly one of w and w8 (w8
// without w_scale), x, w or w8 not 16-byte aligned, ss
// without ss_count >= 1 (or eps without ss), x_lo with w8, next_norm on another output than kAddF32 or without
// xn and ss_out, an odd m for kSwiGlu, for kQkvRope a head_dim not a positive multiple of 16, m not
// (n_heads + 2 n_kv_heads) head_dim, a null rope pointer or page_size < 1, stages not -1, 0 or 2; kUnsupported for n > 8 (split the batch, or use the
// GEMM) and k not a multiple of 8 (16 for w8: the weight rows must stay 16-byte aligned).
void check_bf16_gemv_args(const Bf16GemvArgs& a);

// Whether a product of this shape and these pointers passes the checks (the runner's fallback to
// cuBLASLt or the FP8 GEMV where it does not): w bf16 weights, or with fp8 e4m3 codes. Pure.
bool bf16_gemv_fits(const void* x, const void* w, int n, int k, bool fp8 = false);
// The weights' part of it: w non-null and 16-byte aligned, k a positive multiple of 8 (16 with
// fp8). The runner asks it of every matrix before it fuses a model's layers. Pure.
bool bf16_gemv_weights_fit(const void* w, int k, bool fp8);

// Asynchronous on stream.
void bf16_gemv(const Bf16GemvArgs& a, cudaStream_t stream);

namespace detail {
void launch_bf16_gemv(const Bf16GemvArgs& a, cudaStream_t stream);  // bf16_gemv.cu, unchecked
}  // namespace detail

}  // namespace lychee::cuda
