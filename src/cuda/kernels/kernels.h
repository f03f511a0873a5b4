// The GPU model's small fused kernels (everything but the matrix products and attention).
// bf16 activations into the matrix products, fp32 residual stream and accumulation.
#pragma once

#include <cstdint>

#include "cuda/common/common.h"

namespace lychee::cuda {

// x[n][d] f32 = rows of table[vocab][d] bf16 picked by tokens[n].
void embed(const int32_t* tokens, const bf16* table, float* x, int n, int d, cudaStream_t s);

// x[n][d] += delta[n][d] (bf16, may be null) + bias[d] (f32, may be null); then
// out[n][d] = x / sqrt(mean(x²) + eps) * w[d] in bf16.
void add_rmsnorm(float* x, const bf16* delta, const float* bias, const float* w, bf16* out, int n,
                 int d, float eps, cudaStream_t s);

// Per token: adds the q/k/v biases (f32, may be null), applies per-head RMSNorm to q and k
// (q_norm/k_norm f32 [head_dim], may be null), rotates q and k (rotate-half RoPE, angle =
// pos * inv_freq[i] in f32), writes q to q_out and k, v into the paged cache.
struct QkvArgs {
  const bf16* qkv;          // [n][q_dim + 2 * kv_dim], the fused projection's output
  const float* bias;        // [q_dim + 2 * kv_dim] or null
  const float* q_norm;      // [head_dim] or null
  const float* k_norm;      // [head_dim] or null
  float eps;
  const int32_t* positions; // [n]
  const int32_t* kv_page;   // [n] page id that receives the token's K/V
  const int32_t* kv_row;    // [n] row in that page
  const float* inv_freq;    // [head_dim / 2]
  bf16* q_out;              // [n][n_heads][head_dim]
  bf16* k_pool;             // [n_pages][n_kv_heads][page_size][head_dim] (bf16 KV; null with FP8)
  bf16* v_pool;
  int n, n_heads, n_kv_heads, head_dim, page_size;
  // FP8 KV (core/kv_dtype.h), in place of k_pool / v_pool: codes [n_pages][n_kv_heads][page_size]
  // [head_dim] e4m3 and scales [n_pages][n_kv_heads][page_size] f32, computed from the f32 values
  // after the norm and RoPE (kv_fp8.cuh: the host quantiser's codes on those values).
  uint8_t* k8_pool = nullptr;
  uint8_t* v8_pool = nullptr;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
};
void qkv_rope_append(const QkvArgs& a, cudaStream_t s);

// out[n][ff] = silu(gu[n][j] + b[j]) * (gu[n][ff + j] + b[ff + j]); gu is [n][2 * ff] (gate rows,
// then up rows); bias f32 [2 * ff] or null. Eight elements a thread where ff % 8 == 0 and gu and
// out are 16-byte aligned, else one (detail::silu_mul_elementwise): the same bits either way.
void silu_mul(const bf16* gu, const float* bias, bf16* out, int n, int ff, cudaStream_t s);

// out[b] = argmax of logits[b][vocab] (lowest index among equal maxima).
void argmax(const float* logits, int32_t* out, int batch, int vocab, cudaStream_t s);

// Samples out[b] from softmax(logits[b] / temperature) restricted to the top_k largest (0 = all)
// and to the smallest set of probability >= top_p. Random numbers: Philox(seed, subsequence b,
// offset 4 * counter): the caller's counter (a sequence's length) makes a seeded draw depend on
// the request alone, not on what else the device sampled before.
void sample(const float* logits, int32_t* out, int batch, int vocab, float temperature, int top_k,
            float top_p, uint64_t seed, uint64_t counter, cudaStream_t s);

// Fills p[n] with N(0, std²) values (a counter-based hash, deterministic in seed).
void fill_normal_bf16(bf16* p, size_t n, uint64_t seed, float std, cudaStream_t s);
void fill_const_f32(float* p, size_t n, float value, cudaStream_t s);
// dst[i] = bf16(float(dst[i]) + float(src[i])): one rounding of the f32 sum, what an NCCL bf16
// all-reduce over two ranks gives (the runner's one-device stand-in for it, tests only).
void add_bf16(bf16* dst, const bf16* src, size_t n, cudaStream_t s);
// Random FP8 weight codes for speed benchmarks: codes[n] = e4m3(code_std · z), z ~ N(0, 1) from the
// same hash as fill_normal_bf16, rounded to nearest and saturating at ±448 (never a NaN code).
void fill_normal_e4m3(uint8_t* codes, size_t n, uint64_t seed, float code_std, cudaStream_t s);

// An FP8 weight matrix widened to bf16: out[r][c] = bf16(e4m3(codes[r][c]) · scales[r]) (the
// product in f32, exact; one rounding to bf16). codes [rows][cols] e4m3 (core/fp8.h, CUDA's
// __nv_fp8_e4m3 bits), scales [rows] f32, out [rows][cols] bf16. For the GPU runner's products of
// more rows than the FP8 GEMV takes (prefill chunks, large batches), which then go through
// cuBLASLt in bf16. Reads 1 and writes 2 bytes per value; asynchronous, capturable in CUDA graphs.
// Checked on the host (kernels_host.cpp): kInvalidArgument for rows or cols < 1, a null pointer,
// or codes / out not 16-byte aligned; kUnsupported for cols not a multiple of 16 (16 codes per load).
void dequantize_e4m3(const uint8_t* codes, const float* scales, bf16* out, int rows, int cols, cudaStream_t s);

// Activation rows quantised to FP8 for cuBLASLt's FP8 GEMM (RunnerOptions::fp8_prefill_gemm):
// per row r, scales[r] = max|x[r]| / 448 (1 for an all-zero row) and codes[r][c] = e4m3(x[r][c] /
// scales[r]), rounded to nearest even, saturating: core/fp8.h's rule, so the codes equal
// quantize_rows_e4m3's on the same values bit for bit. x [rows][cols] bf16, codes [rows][cols],
// scales [rows] f32. Asynchronous, capturable. Checked on the host: kInvalidArgument for rows or
// cols < 1, a null pointer, or x / codes not 16-byte aligned; kUnsupported for cols not a multiple
// of 16.
void quantize_activations_e4m3(const bf16* x, uint8_t* codes, float* scales, int rows, int cols, cudaStream_t s);

namespace detail {
// silu_mul one element a thread (any ff, any alignment): what silu_mul falls back to, and its
// tests' reference for the eight-element kernel's bits.
void silu_mul_elementwise(const bf16* gu, const float* bias, bf16* out, int n, int ff, cudaStream_t s);
// dequantize_e4m3's launcher (kernels.cu), without the argument checks.
void launch_dequantize_e4m3(const uint8_t* codes, const float* scales, bf16* out, int rows, int cols,
                            cudaStream_t s);
// quantize_activations_e4m3's launcher (kernels.cu), without the argument checks.
void launch_quantize_activations_e4m3(const bf16* x, uint8_t* codes, float* scales, int rows, int cols, cudaStream_t s);
}  // namespace detail

// dst[pairs[2 i]] = pairs[2 i + 1] for i < *n (a device count, at most max_n; fixed grid, so a
// CUDA graph can replay it with any count). The decode step's block-table update.
void scatter_pairs(int32_t* dst, const int32_t* pairs, const int32_t* n, int max_n, cudaStream_t s);


}  // namespace lychee::cuda
