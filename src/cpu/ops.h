// CPU reference operations, fp32. These are the oracle every other backend is checked against:
// plain loops (BLAS for matrix products), no cleverness. Shapes are row-major, outermost first.
#pragma once

#include <cstdint>

namespace lychee::cpu {

// y[n, m] = x[n, k] · w[m, k]ᵀ + b[m] (b may be nullptr).
void linear(const float* x, const float* w, const float* b, float* y, int n, int k, int m);

// y[n, d] = x / sqrt(mean(x²) + eps) * w[d]. y may alias x.
void rmsnorm(const float* x, const float* w, float* y, int n, int d, float eps);

// Rotate-half RoPE in place on x[n_tok, n_heads, hd]: pairs (i, i + hd/2) rotated by
// angle pos[t] * inv_freq[i]. inv_freq: [hd/2].
void rope(float* x, const int32_t* pos, int n_tok, int n_heads, int hd, const float* inv_freq);

// g[n] = silu(g) * u.
void silu_mul(float* g, const float* u, int64_t n);

// y[n] += x[n].
void add_inplace(float* y, const float* x, int64_t n);

// In-place softmax of x[n]; returns log-sum-exp (natural log) of the input.
float softmax(float* x, int n);

// Attention of one query against selected cached tokens of one KV head.
// q: [hd]; k, v: [*, hd] rows of the cache; tokens: ascending row ids (nullptr = rows 0..n-1).
// out: [hd]. Returns the log-sum-exp of the scaled logits (natural log).
float attend(const float* q, const float* k, const float* v, int hd, const int32_t* tokens, int n,
             float scale, float* out);

// Causal attention of a chunk of queries against the cache of one KV head group.
// q: [n_q, group, hd] for the group's query heads at positions pos0 .. pos0 + n_q - 1;
// k, v: [pos0 + n_q, hd]; out: [n_q, group, hd] with the given row stride in floats.
void attend_causal(const float* q, int n_q, int group, int hd, int q_stride, const float* k,
                   const float* v, int pos0, float scale, float* out, int out_stride);

}  // namespace lychee::cpu
