// Dense attention of one decode step for every query head at once, f32, for the native-weight
// CPU path (the f32 reference keeps ops.h's attend_causal, which goes through BLAS). With one
// query row, sgemm packs each head's K and V before multiplying (measured ~6 ms of a 13.5 ms
// decode step at 512 tokens on one core); here each query head reads its KV head's rows once:
// scores, softmax, weighted sum of V. Parallel over query heads.
#pragma once

#include <cstdint>

namespace lychee::cpu {

// q: [n_heads, hd]; k, v: KV head g's rows at k + g * head_stride, [n_ctx, hd];
// query head h reads KV head h / group. out: [n_heads, hd].
void attend_decode(const float* q, int n_heads, int group, int hd, const float* k, const float* v,
                   int64_t head_stride, int n_ctx, float scale, float* out);

}  // namespace lychee::cpu
