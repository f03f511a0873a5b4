// FP8 (e4m3) weight matrix-vector products for decode steps:
//   y[i][j] = w_scale[j] · Σ_t e4m3(w[j][t]) · x[i][t]    (i < n, j < m, t < k)
// for n = 1..8 rows of x (the decode batch). The weights are core/fp8.h's codes and scales,
// uploaded as they are (CUDA's __nv_fp8_e4m3 bit layout): w [m][k] uint8 row-major, one f32
// scale per row (output channel). Products are exact, accumulation f32, and y is rounded once
// (to bf16, or not at all for fp8_gemv_f32_out). NaN codes (0x7F, 0xFF; never produced from
// finite weights) read as ±480. Each row's result depends only on its own weights, x and k: the
// sums run in the same order whatever m is, and two calls give the same bits.
//
// The weights are read once per call at close to copy bandwidth (design and byte count in
// fp8_gemv.cu). Capturable in CUDA graphs: no host synchronisation, no allocation.
//
// Preconditions beyond the checked ones: the kernel is written for programmatic dependent launch
// (measured slower, so used only with LYCHEE_FP8_GEMV_PDL=1) and then starts reading w before the
// previous kernel in the stream has finished (it waits before reading x), so w and w_scale must
// not be written by a kernel that may still be running
// (weights are written once at load time, then synchronised); y must not overlap x.
#pragma once

#include <cstdint>

#include "cuda/common/common.h"

namespace lychee::cuda {

// The largest n (rows of x) the kernel takes: the 8 columns of one mma.sync tile.
constexpr int kFp8GemvMaxRows = 8;

// The checks the entry points run before launching (no GPU needed, so tests can call them):
// kInvalidArgument for n < 1, k < 1, m < 1, a null pointer, or x / w not 16-byte aligned
// (the kernel reads 16-byte vectors of both); kUnsupported for n > 8 (split the batch, or use
// the bf16 GEMM) and k not a multiple of 16 (w's rows must stay 16-byte aligned).
void check_fp8_gemv_args(const void* x, const uint8_t* w, const float* w_scale, const void* y, int n, int k, int m);

// How the kernel runs (fp8_gemv.cu): m16 tiles per block (1, 2 or 4; 0: the automatic choice) and
// weight staging (0: one step ahead in registers; 2, 3, 4: a shared-memory ring of that many steps
// filled by cp.async; -1: the automatic choice). LYCHEE_FP8_GEMV_TILES / LYCHEE_FP8_GEMV_STAGES in
// the environment replace the automatic choices (lab A/B). Every variant gives the same bits.
struct Fp8GemvVariant {
  int tiles = 0;
  int stages = -1;
};

// x: [n][k] bf16; w: [m][k] e4m3 codes; w_scale: [m] f32; y: [n][m] bf16. Asynchronous on stream.
void fp8_gemv(const bf16* x, const uint8_t* w, const float* w_scale, bf16* y, int n, int k, int m,
              cudaStream_t stream, Fp8GemvVariant variant = {});

// The same product with y: [n][m] f32, not rounded (the LM head's logits).
void fp8_gemv_f32_out(const bf16* x, const uint8_t* w, const float* w_scale, float* y, int n, int k, int m,
                      cudaStream_t stream, Fp8GemvVariant variant = {});

namespace detail {
// The launchers (fp8_gemv.cu), without argument checks: call fp8_gemv / fp8_gemv_f32_out.
void launch_fp8_gemv(const bf16* x, const uint8_t* w, const float* w_scale, bf16* y, int n, int k, int m,
                     cudaStream_t stream, Fp8GemvVariant variant);
void launch_fp8_gemv_f32_out(const bf16* x, const uint8_t* w, const float* w_scale, float* y, int n, int k,
                             int m, cudaStream_t stream, Fp8GemvVariant variant);
}  // namespace detail

}  // namespace lychee::cuda

