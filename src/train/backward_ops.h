// Ops of the student/teacher pass (docs/trainer.md, "The pass") and their backward with respect
// to activations, templated on Real (float, double): the CPU oracle of the head-role trainer.
// Weights are frozen, so no op computes a weight gradient. Plain loops, BLAS for the matrix
// products; every backward is checked against central finite differences in fp64
// (tests/test_train_backward.cpp). Shapes are row-major, outermost first.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace lychee::train {

// c[n, m] = alpha · a[n, k] · op(b) + beta · c, op(b) = bᵀ for b [m, k] (trans_b) or b [k, m].
template <typename Real>
void gemm(bool trans_b, int n, int m, int k, Real alpha, const Real* a, const Real* b, Real beta,
          Real* c) {
  static_assert(std::is_same_v<Real, float> || std::is_same_v<Real, double>);
  if (n == 0 || m == 0) return;
  if (k == 0) {  // BLAS rejects a leading dimension of 0
    for (int64_t i = 0; i < int64_t(n) * m; ++i) c[i] = beta == Real(0) ? Real(0) : beta * c[i];
    return;
  }
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  const int ldb = trans_b ? k : m;
  if constexpr (std::is_same_v<Real, float>)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, tb, n, m, k, alpha, a, k, b, ldb, beta, c, m);
  else
    cblas_dgemm(CblasRowMajor, CblasNoTrans, tb, n, m, k, alpha, a, k, b, ldb, beta, c, m);
}

// y[n, m] = x[n, k] · w[m, k]ᵀ + b[m] (b may be nullptr).
template <typename Real>
void linear(const Real* x, const Real* w, const Real* b, Real* y, int n, int k, int m) {
  gemm<Real>(true, n, m, k, Real(1), x, w, Real(0), y);
  if (b != nullptr)
    for (int64_t i = 0; i < n; ++i)
      for (int j = 0; j < m; ++j) y[i * m + j] += b[j];
}

// Input gradient of linear: dx[n, k] = dy[n, m] · w[m, k], added to dx when accumulate.
template <typename Real>
void linear_backward(const Real* dy, const Real* w, Real* dx, int n, int k, int m, bool accumulate) {
  gemm<Real>(false, n, k, m, Real(1), dy, w, accumulate ? Real(1) : Real(0), dx);
}

// y[n, d] = x / sqrt(mean(x²) + eps) * w[d]. y may alias x.
template <typename Real>
void rmsnorm(const Real* x, const Real* w, Real* y, int n, int d, Real eps) {
  for (int64_t i = 0; i < n; ++i) {
    const Real* xi = x + i * d;
    Real ss = 0;
    for (int j = 0; j < d; ++j) ss += xi[j] * xi[j];
    const Real r = Real(1) / std::sqrt(ss / Real(d) + eps);
    Real* yi = y + i * d;
    for (int j = 0; j < d; ++j) yi[j] = w[j] * (xi[j] * r);
  }
}

// Input gradient of rmsnorm at input x[n, d]: with r = (mean(x²) + eps)^(-1/2),
// dx_j = r·w_j·dy_j − r³·x_j·(1/d)·Σ_i dy_i·w_i·x_i. Written to dx, or added when accumulate;
// dx may alias dy.
template <typename Real>
void rmsnorm_backward(const Real* x, const Real* w, const Real* dy, Real* dx, int n, int d, Real eps,
                      bool accumulate) {
  for (int64_t i = 0; i < n; ++i) {
    const Real* xi = x + i * d;
    const Real* dyi = dy + i * d;
    Real ss = 0, dot = 0;
    for (int j = 0; j < d; ++j) {
      ss += xi[j] * xi[j];
      dot += dyi[j] * w[j] * xi[j];
    }
    const Real r = Real(1) / std::sqrt(ss / Real(d) + eps);
    const Real c = r * r * r * dot / Real(d);
    Real* dxi = dx + i * d;
    for (int j = 0; j < d; ++j) {
      const Real g = r * w[j] * dyi[j] - c * xi[j];
      dxi[j] = accumulate ? dxi[j] + g : g;
    }
  }
}

// Rotate-half RoPE in place on x[n_tok, n_heads, hd]: pairs (i, i + hd/2) rotated by the angle
// pos[t]·inv_freq[i] (inv_freq: [hd/2]). transpose rotates by the negated angle with the same
// rounded cos and sin: the exact adjoint, i.e. the backward.
template <typename Real>
void rope_rotate(Real* x, const int32_t* pos, int n_tok, int n_heads, int hd, const Real* inv_freq,
                 bool transpose) {
  const int half = hd / 2;
  std::vector<Real> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int i = 0; i < half; ++i) {
      const Real angle = Real(pos[t]) * inv_freq[i];  // in Real: f32 as transformers for float
      cs[size_t(i)] = Real(std::cos(double(angle)));
      sn[size_t(i)] = transpose ? -Real(std::sin(double(angle))) : Real(std::sin(double(angle)));
    }
    for (int h = 0; h < n_heads; ++h) {
      Real* v = x + (t * n_heads + h) * hd;
      for (int i = 0; i < half; ++i) {
        const Real a = v[i], b = v[i + half];
        v[i] = a * cs[size_t(i)] - b * sn[size_t(i)];
        v[i + half] = b * cs[size_t(i)] + a * sn[size_t(i)];
      }
    }
  }
}

template <typename Real>
void rope(Real* x, const int32_t* pos, int n_tok, int n_heads, int hd, const Real* inv_freq) {
  rope_rotate(x, pos, n_tok, n_heads, hd, inv_freq, false);
}

// Backward of rope in place on the gradient dx[n_tok, n_heads, hd].
template <typename Real>
void rope_backward(Real* dx, const int32_t* pos, int n_tok, int n_heads, int hd, const Real* inv_freq) {
  rope_rotate(dx, pos, n_tok, n_heads, hd, inv_freq, true);
}

// y[n] = silu(g) · u, silu(g) = g / (1 + exp(−g)).
template <typename Real>
void swiglu(const Real* g, const Real* u, Real* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = g[i] / (Real(1) + std::exp(-g[i])) * u[i];
}

// dg[n] = dy · u · silu'(g), silu'(g) = σ(g)·(1 + g·(1 − σ(g))); du[n] = dy · silu(g).
template <typename Real>
void swiglu_backward(const Real* g, const Real* u, const Real* dy, Real* dg, Real* du, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const Real sig = Real(1) / (Real(1) + std::exp(-g[i]));
    dg[i] = dy[i] * u[i] * sig * (Real(1) + g[i] * (Real(1) - sig));
    du[i] = dy[i] * g[i] * sig;
  }
}

// p[n] = softmax(x[n]) over the listed entries idx[0 .. n) of x (nullptr: entries 0 .. n−1).
template <typename Real>
void softmax_gather(const Real* x, const int32_t* idx, int n, Real* p) {
  Real mx = -std::numeric_limits<Real>::infinity();
  for (int i = 0; i < n; ++i) mx = std::max(mx, x[idx ? idx[i] : i]);
  Real sum = 0;
  for (int i = 0; i < n; ++i) {
    p[i] = std::exp(x[idx ? idx[i] : i] - mx);
    sum += p[i];
  }
  const Real inv = Real(1) / sum;
  for (int i = 0; i < n; ++i) p[i] *= inv;
}

// One query row of the mixed attention of docs/trainer.md. q: [hd]; k, v: [n_keys, hd], every
// key visible to the row. set: ascending key ids in [0, n_keys) (n_set >= 1), or nullptr for
// dense only (z is then taken as 1: layer 0 and the teacher).
//   dense  = softmax(scale · q·kᵀ) · v
//   sparse = softmax of the same logits over the set only (the others masked to −∞) · v
//   out[hd] = z · dense + (1 − z) · sparse   (z·d + (1−z)·s, so z = 1 gives dense bit-exactly)
// raw: [n_keys] receives the unscaled logits q·k_j (for the selection), or nullptr.
template <typename Real>
void attend_mix_row(const Real* q, const Real* k, const Real* v, int hd, int n_keys,
                    const int32_t* set, int n_set, Real scale, Real z, Real* out, Real* raw) {
  const size_t n = static_cast<size_t>(n_keys);
  std::vector<Real> logit(n), p(n), dense(static_cast<size_t>(hd), Real(0));
  for (int64_t j = 0; j < n_keys; ++j) {
    Real dot = 0;
    for (int i = 0; i < hd; ++i) dot += q[i] * k[j * hd + i];
    if (raw != nullptr) raw[j] = dot;
    logit[size_t(j)] = scale * dot;
  }
  softmax_gather<Real>(logit.data(), nullptr, n_keys, p.data());
  for (int64_t j = 0; j < n_keys; ++j)
    for (int i = 0; i < hd; ++i) dense[size_t(i)] += p[size_t(j)] * v[j * hd + i];
  if (set == nullptr) {
    std::copy(dense.begin(), dense.end(), out);
    return;
  }
  std::vector<Real> sparse(static_cast<size_t>(hd), Real(0));
  softmax_gather<Real>(logit.data(), set, n_set, p.data());
  for (int j = 0; j < n_set; ++j)
    for (int i = 0; i < hd; ++i) sparse[size_t(i)] += p[size_t(j)] * v[int64_t(set[j]) * hd + i];
  for (int i = 0; i < hd; ++i) out[i] = z * dense[size_t(i)] + (Real(1) - z) * sparse[size_t(i)];
}

// Backward of attend_mix_row for the output gradient dout[hd] (recomputes the probabilities):
//   dq[hd] += ∂/∂q; dk, dv: the row j − grad_from of each key j >= grad_from gets += its
//   gradient (keys below grad_from, the fixed context, get none).
// Returns dloss/dz = dout · (dense − sparse); 0 for dense only. With P = z·pd + (1−z)·ps and
// dP_j = dout·v_j: dlogit_j = z·pd_j·(dP_j − Σ pd·dP) + (1−z)·ps_j·(dP_j − Σ ps·dP).
template <typename Real>
Real attend_mix_row_backward(const Real* q, const Real* k, const Real* v, int hd, int n_keys,
                             const int32_t* set, int n_set, Real scale, Real z, const Real* dout,
                             Real* dq, Real* dk, Real* dv, int grad_from) {
  const size_t n = static_cast<size_t>(n_keys);
  std::vector<Real> logit(n), pd(n), ps(n, Real(0)), dp(n);
  for (int64_t j = 0; j < n_keys; ++j) {
    Real dot = 0, dpj = 0;
    for (int i = 0; i < hd; ++i) {
      dot += q[i] * k[j * hd + i];
      dpj += dout[i] * v[j * hd + i];
    }
    logit[size_t(j)] = scale * dot;
    dp[size_t(j)] = dpj;
  }
  softmax_gather<Real>(logit.data(), nullptr, n_keys, pd.data());
  const Real zd = set != nullptr ? z : Real(1), zs = Real(1) - zd;
  Real sum_d = 0, sum_s = 0;
  for (int j = 0; j < n_keys; ++j) sum_d += pd[size_t(j)] * dp[size_t(j)];
  if (set != nullptr) {
    std::vector<Real> packed(static_cast<size_t>(n_set));
    softmax_gather<Real>(logit.data(), set, n_set, packed.data());
    for (int j = 0; j < n_set; ++j) ps[size_t(set[j])] = packed[size_t(j)];
    for (int j = 0; j < n_set; ++j) sum_s += packed[size_t(j)] * dp[size_t(set[j])];
  }
  for (int64_t j = 0; j < n_keys; ++j) {
    const size_t u = size_t(j);
    const Real dlogit = zd * pd[u] * (dp[u] - sum_d) + zs * ps[u] * (dp[u] - sum_s);
    const Real draw = scale * dlogit;
    for (int i = 0; i < hd; ++i) dq[i] += draw * k[j * hd + i];
    if (j >= grad_from) {
      const Real pj = zd * pd[u] + zs * ps[u];
      Real* dkj = dk + (j - grad_from) * hd;
      Real* dvj = dv + (j - grad_from) * hd;
      for (int i = 0; i < hd; ++i) {
        dkj[i] += draw * q[i];
        dvj[i] += pj * dout[i];
      }
    }
  }
  return set != nullptr ? sum_d - sum_s : Real(0);
}

// Dense causal attention of a chunk of n_q queries at positions pos0 … pos0 + n_q − 1 for one KV
// head group (forward only: the context prefill). q: [n_q, group, hd] with row stride q_stride;
// k, v: [pos0 + n_q, hd]; out: [n_q, group, hd] with row stride out_stride.
template <typename Real>
void attend_causal(const Real* q, int n_q, int group, int hd, int q_stride, const Real* k,
                   const Real* v, int pos0, Real scale, Real* out, int out_stride) {
  // Rows (query, head in group) in chunks so the score block stays under ~4 M entries.
  const int n_keys = pos0 + n_q;
  const int chunk = std::max(1, (1 << 22) / std::max(1, n_keys * group));
  std::vector<Real> qb, s, o;
  for (int t0 = 0; t0 < n_q; t0 += chunk) {
    const int nt = std::min(chunk, n_q - t0), rows = nt * group, keys = pos0 + t0 + nt;
    qb.resize(size_t(rows) * hd);
    for (int t = 0; t < nt; ++t)
      std::copy_n(q + int64_t(t0 + t) * q_stride, group * hd, qb.data() + int64_t(t) * group * hd);
    s.resize(size_t(rows) * keys);
    gemm<Real>(true, rows, keys, hd, scale, qb.data(), k, Real(0), s.data());
    for (int r = 0; r < rows; ++r) {
      Real* row = s.data() + int64_t(r) * keys;
      const int visible = pos0 + t0 + r / group + 1;
      softmax_gather<Real>(row, nullptr, visible, row);
      std::fill(row + visible, row + keys, Real(0));
    }
    o.resize(size_t(rows) * hd);
    gemm<Real>(false, rows, hd, keys, Real(1), s.data(), v, Real(0), o.data());
    for (int t = 0; t < nt; ++t)
      std::copy_n(o.data() + int64_t(t) * group * hd, group * hd, out + int64_t(t0 + t) * out_stride);
  }
}

// Distillation loss scale · Σ_i (s_i − t_i)² over n values (scale: 1/T for logits, 1/(T·d) for
// hidden states), summed in double; ds[n] = 2·scale·(s − t) unless nullptr.
template <typename Real>
double squared_error(const Real* s, const Real* t, int64_t n, double scale, Real* ds) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Real e = s[i] - t[i];
    sum += double(e) * double(e);
    if (ds != nullptr) ds[i] = Real(2 * scale) * e;
  }
  return scale * sum;
}

// Size k of the set a head passes on for a row with n_visible = p + 1 keys:
// max(1, ceil(keep_ratio · S)), the product in double exactly as written (so 0.3 · 10 =
// 3.0000000000000004 gives 4); at most S. The CUDA port calls this same function.
inline int student_budget(double keep_ratio, int n_visible) {
  const int k = int(std::ceil(keep_ratio * double(n_visible)));
  return std::clamp(k, 1, std::max(1, n_visible));
}

// The set of a row at position p: {p} ∪ the k − 1 positions j < p with the largest a_j (the
// group-mean raw logit; only a[0 .. p) is read), ties to the lower position. set: ascending.
template <typename Real>
void select_set(const Real* a, int p, int k, std::vector<int32_t>& set) {
  const int n_top = std::clamp(k - 1, 0, p);
  set.resize(size_t(p));
  for (int j = 0; j < p; ++j) set[size_t(j)] = j;
  std::partial_sort(set.begin(), set.begin() + n_top, set.end(), [a](int32_t i, int32_t j) {
    return a[i] > a[j] || (a[i] == a[j] && i < j);
  });
  set.resize(size_t(n_top));
  std::sort(set.begin(), set.end());
  set.push_back(p);
}

}  // namespace lychee::train
