#include "cpu/decode_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace lychee::cpu {

void attend_decode(const float* q, int n_heads, int group, int hd, const float* k, const float* v,
                   int64_t head_stride, int n_ctx, float scale, float* out) {
  // Dynamic, one head at a time: n_heads is small (9 on the default model) and a thread
  // preempted by another process should not hold a static share.
#pragma omp parallel for schedule(dynamic, 1)
  for (int h = 0; h < n_heads; ++h) {
    thread_local std::vector<float> p;  // [n_ctx] scores, then probabilities
    p.resize(size_t(n_ctx));
    const float* qh = q + int64_t(h) * hd;
    const float* kh = k + int64_t(h / group) * head_stride;
    const float* vh = v + int64_t(h / group) * head_stride;
    float mx = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < n_ctx; ++j) {
      const float* kj = kh + int64_t(j) * hd;
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
    float* o = out + int64_t(h) * hd;
    std::fill(o, o + hd, 0.0f);
    const float inv = 1.0f / sum;
    for (int j = 0; j < n_ctx; ++j) {
      const float pj = p[size_t(j)] * inv;
      const float* vj = vh + int64_t(j) * hd;
#pragma omp simd
      for (int d = 0; d < hd; ++d) o[d] += pj * vj[d];
    }
  }
}

}  // namespace lychee::cpu
