// Dense causal attention for the native-weight CPU path, f32, one query row at a time (the f32
// reference keeps ops.h's attend_causal, which goes through BLAS). With one query row, sgemm packs
// each head's K and V before multiplying (measured ~6 ms of a 13.5 ms decode step at 512 tokens on
// one core); here each query head reads its KV head's rows once: scores, softmax, weighted sum of
// V. A prompt row and a decode step at the same position run the same per-head routine on the
// same inputs, so the native path does not depend on how a prompt was chunked.
#pragma once

#include <cstdint>

namespace lychee::cpu {

// n query rows at positions pos0 .. pos0 + n - 1 (row t attends to the first pos0 + t + 1 keys;
// a decode step is n = 1): q, out: [n, n_heads, hd]; k, v: KV head g's rows at
// k + g * head_stride; query head h reads KV head h / group. Row t is bit for bit what that row
// gives alone (n = 1, pos0 + t). Parallel over (row, head).
// One query head q: [hd] over rows of its KV head k, v: [*, hd]: the rows tokens[0 .. n) (ascending,
// as a policy's read list), or rows 0 .. n - 1 when tokens is nullptr: scores, softmax, weighted
// sum of V into out: [hd]. The routine attend_rows runs for each (row, head), so a dense head of a
// decode step gives the same bits whether it comes from attend_rows or a policy's read list.
void attend_head(const float* q, const float* k, const float* v, int hd, const int32_t* tokens, int n, float scale,
                 float* out);

void attend_rows(const float* q, int n, int n_heads, int group, int hd, const float* k, const float* v,
                 int64_t head_stride, int pos0, float scale, float* out);

}  // namespace lychee::cpu
