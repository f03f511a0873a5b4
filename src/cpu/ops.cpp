#include "cpu/ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace lychee::cpu {

void linear(const float* x, const float* w, const float* b, float* y, int n, int k, int m) {
  if (n == 1) {
    // A decode step: one matrix-vector product, memory-bound. An OpenMP loop rather than BLAS
    // gemv: OpenBLAS's own thread pool and our OpenMP threads contend for the cores (measured
    // 3x slower decode on 2 cores). Guided chunks: a thread preempted by another process does
    // not hold the others at the barrier, and each thread reads long runs of contiguous rows
    // (docs/results/cpu_quantized.md: rows dealt 32 at a time in turn read memory ~1.5x slower).
#pragma omp parallel for schedule(guided, 32)
    for (int j = 0; j < m; ++j) {
      const float* wj = w + int64_t(j) * k;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int i = 0; i < k; ++i) acc += wj[i] * x[i];
      y[j] = acc;
    }
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, k, 1.0f, x, k, w, k, 0.0f, y, m);
  }
  if (b != nullptr)
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < m; ++j) y[int64_t(i) * m + j] += b[j];
}

void rmsnorm(const float* x, const float* w, float* y, int n, int d, float eps) {
  for (int i = 0; i < n; ++i) {
    const float* xi = x + int64_t(i) * d;
    float* yi = y + int64_t(i) * d;
    double ss = 0.0;
    for (int j = 0; j < d; ++j) ss += double(xi[j]) * double(xi[j]);
    const float r = 1.0f / std::sqrt(float(ss / d) + eps);
    for (int j = 0; j < d; ++j) yi[j] = w[j] * (xi[j] * r);
  }
}

void rope(float* x, const int32_t* pos, int n_tok, int n_heads, int hd, const float* inv_freq) {
  const int half = hd / 2;
  std::vector<float> cos_t(half), sin_t(half);
  for (int t = 0; t < n_tok; ++t) {
    for (int i = 0; i < half; ++i) {
      const float angle = float(pos[t]) * inv_freq[i];  // f32 product, as transformers does
      cos_t[i] = float(std::cos(double(angle)));
      sin_t[i] = float(std::sin(double(angle)));
    }
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (int64_t(t) * n_heads + h) * hd;
      for (int i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cos_t[i] - b * sin_t[i];
        v[i + half] = b * cos_t[i] + a * sin_t[i];
      }
    }
  }
}

void silu_mul(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

float softmax(float* x, int n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = float(1.0 / sum);
  for (int i = 0; i < n; ++i) x[i] *= inv;
  return mx + float(std::log(sum));
}

float attend(const float* q, const float* k, const float* v, int hd, const int32_t* tokens, int n,
             float scale, float* out) {
  std::vector<float> p(size_t(std::max(n, 1)));
  for (int j = 0; j < n; ++j) {
    const float* kj = k + int64_t(tokens ? tokens[j] : j) * hd;
    double dot = 0.0;
    for (int d = 0; d < hd; ++d) dot += double(q[d]) * double(kj[d]);
    p[j] = float(dot) * scale;
  }
  const float lse = softmax(p.data(), n);
  std::vector<double> acc(size_t(hd), 0.0);
  for (int j = 0; j < n; ++j) {
    const float* vj = v + int64_t(tokens ? tokens[j] : j) * hd;
    for (int d = 0; d < hd; ++d) acc[d] += double(p[j]) * double(vj[d]);
  }
  for (int d = 0; d < hd; ++d) out[d] = float(acc[d]);
  return lse;
}

void attend_causal(const float* q, int n_q, int group, int hd, int q_stride, const float* k,
                   const float* v, int pos0, float scale, float* out, int out_stride) {
  // Rows of the chunk are (query position, head in group); S = Q Kᵀ over all keys, then a
  // causal mask, softmax and P V. Chunk the rows so S stays small.
  const int n_keys = pos0 + n_q;
  const int max_rows = std::max(1, (1 << 22) / std::max(n_keys, 1));  // ~16 MiB of scores
  std::vector<float> qbuf, s;
  for (int t0 = 0; t0 < n_q; t0 += std::max(1, max_rows / group)) {
    const int nt = std::min(n_q - t0, std::max(1, max_rows / group));
    const int rows = nt * group;
    const int keys = pos0 + t0 + nt;  // keys visible to the last query of the chunk
    qbuf.resize(size_t(rows) * hd);
    for (int t = 0; t < nt; ++t)
      for (int g = 0; g < group; ++g)
        std::copy_n(q + int64_t(t0 + t) * q_stride + int64_t(g) * hd, hd,
                    qbuf.data() + (int64_t(t) * group + g) * hd);
    s.resize(size_t(rows) * keys);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, hd, scale, qbuf.data(), hd, k,
                hd, 0.0f, s.data(), keys);
    for (int t = 0; t < nt; ++t) {
      const int visible = pos0 + t0 + t + 1;
      for (int g = 0; g < group; ++g) {
        float* row = s.data() + (int64_t(t) * group + g) * keys;
        softmax(row, visible);
        std::fill(row + visible, row + keys, 0.0f);
      }
    }
    std::vector<float> o(size_t(rows) * hd);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, keys, 1.0f, s.data(), keys, v,
                hd, 0.0f, o.data(), hd);
    for (int t = 0; t < nt; ++t)
      for (int g = 0; g < group; ++g)
        std::copy_n(o.data() + (int64_t(t) * group + g) * hd, hd,
                    out + int64_t(t0 + t) * out_stride + int64_t(g) * hd);
  }
}

}  // namespace lychee::cpu
