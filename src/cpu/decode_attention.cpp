#include "cpu/decode_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/quant_dot.h"

namespace lychee::cpu {

#if defined(__x86_64__)
namespace avx2 {  // decode_attention_avx2.cpp; p: [n] scratch
void attend_head(const float* qh, const float* kh, const float* vh, int hd, const int32_t* tokens, int n,
                 float scale, float* out, float* p);
}
#endif

// Not inlined, so that a decode step and a prompt row run the very same instructions (the
// native path's results must not depend on how a prompt was chunked, nor on whether a decode
// step's dense head came through attend_rows or a policy's read list).
[[gnu::noinline]] void attend_head(const float* qh, const float* kh, const float* vh, int hd, const int32_t* tokens,
                                   int n_ctx, float scale, float* o) {
  thread_local std::vector<float> p;  // [n_ctx] scores, then probabilities
  p.resize(size_t(n_ctx));
#if defined(__x86_64__)
  // The same steps with AVX2 + FMA where the CPU has them (every call takes the same branch)
  if (hd % 8 == 0 && detected_quant_isa() == QuantIsa::kAvx2) {
    avx2::attend_head(qh, kh, vh, hd, tokens, n_ctx, scale, o, p.data());
    return;
  }
#endif
  float mx = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < n_ctx; ++j) {
    const float* kj = kh + int64_t(tokens != nullptr ? tokens[j] : j) * hd;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int d = 0; d < hd; ++d) s += qh[d] * kj[d];
    p[size_t(j)] = s * scale;
    mx = std::max(mx, p[size_t(j)]);
  }
  float sum = 0.0f;
  for (int j = 0; j < n_ctx; ++j) {
    p[size_t(j)] = std::exp(p[size_t(j)] - mx);
    sum += p[size_t(j)];
  }
  std::fill(o, o + hd, 0.0f);
  const float inv = 1.0f / sum;
  for (int j = 0; j < n_ctx; ++j) {
    const float pj = p[size_t(j)] * inv;
    const float* vj = vh + int64_t(tokens != nullptr ? tokens[j] : j) * hd;
#pragma omp simd
    for (int d = 0; d < hd; ++d) o[d] += pj * vj[d];
  }
}

void attend_rows(const float* q, int n, int n_heads, int group, int hd, const float* k, const float* v,
                 int64_t head_stride, int pos0, float scale, float* out) {
  const int64_t row = int64_t(n_heads) * hd;
  const int64_t work = int64_t(n) * n_heads;
  // Dynamic, one (row, head) at a time: a decode step has only n_heads items (9 on the default
  // model) and a thread preempted by another process should not hold a static share.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t w = 0; w < work; ++w) {
    const int64_t t = w / n_heads;
    const int h = int(w % n_heads);
    attend_head(q + t * row + int64_t(h) * hd, k + int64_t(h / group) * head_stride,
                v + int64_t(h / group) * head_stride, hd, nullptr, pos0 + int(t) + 1, scale, out + t * row + int64_t(h) * hd);
  }
}

}  // namespace lychee::cpu
