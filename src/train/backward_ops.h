// Ops of the student/teacher pass (docs/trainer.md, "The pass") and their backward with respect
// to activations, templated on Real (float, double): the CPU oracle of the head-role trainer.
// Weights are frozen, so no op computes a weight gradient. Plain loops, BLAS for the matrix
// products; every backward is checked against central finite differences in fp64
// (tests/test_train_ops.cpp). Shapes are row-major, outermost first. Optional pointers
// (bias, raw logits, loss gradient) are not deduced, so nullptr may be passed as is.
//
// The attention comes twice: attend_mix_row (one query row, plain loops: the semantics as
// written) and attend_mix_group (all rows of one KV head group through BLAS, the mix applied to
// the softmax weights by mix_softmax), which CpuStudent uses and the tests hold equal to the row
// op, forward and backward.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace lychee::train {

// c[n, m] = alpha · op(a) · op(b) + beta · c with leading dimensions: op(a) is [n, k] (a stored
// [n, lda] or, transposed, [k, lda]), op(b) is [k, m] (b stored [k, ldb] or, transposed, [m, ldb]).
template <typename Real>
void gemm_ld(bool trans_a, bool trans_b, int n, int m, int k, Real alpha, const Real* a, int lda,
             const Real* b, int ldb, Real beta, Real* c, int ldc) {
  static_assert(std::is_same_v<Real, float> || std::is_same_v<Real, double>);
  if (n == 0 || m == 0) return;
  if (k == 0) {  // BLAS rejects a leading dimension of 0
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j)
        c[i * ldc + j] = beta == Real(0) ? Real(0) : beta * c[i * ldc + j];
    return;
  }
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<Real, float>)
    cblas_sgemm(CblasRowMajor, ta, tb, n, m, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    cblas_dgemm(CblasRowMajor, ta, tb, n, m, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// c[n, m] = alpha · a[n, k] · op(b) + beta · c, op(b) = bᵀ for b [m, k] (trans_b) or b [k, m].
template <typename Real>
void gemm(bool trans_b, int n, int m, int k, Real alpha, const Real* a, const Real* b, Real beta,
          Real* c) {
  gemm_ld<Real>(false, trans_b, n, m, k, alpha, a, k, b, trans_b ? k : m, beta, c, m);
}

// y[n, m] = x[n, k] · w[m, k]ᵀ + b[m] (b may be nullptr).
template <typename Real>
void linear(const Real* x, const Real* w, const std::type_identity_t<Real>* b, Real* y, int n,
            int k, int m) {
  gemm<Real>(true, n, m, k, Real(1), x, w, Real(0), y);
  if (b != nullptr)
    for (int64_t i = 0; i < n; ++i)
      for (int j = 0; j < m; ++j) y[i * m + j] += b[j];
}

// Input gradient of linear: dx[n, k] = dy[n, m] · w[m, k], added to dx when accumulate.
template <typename Real>
void linear_backward(const Real* dy, const Real* w, Real* dx, int n, int k, int m,
                     bool accumulate) {
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
void rmsnorm_backward(const Real* x, const Real* w, const Real* dy, Real* dx, int n, int d,
                      Real eps, bool accumulate) {
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
      const Real sin_a = Real(std::sin(double(angle)));
      sn[size_t(i)] = transpose ? -sin_a : sin_a;
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
void rope_backward(Real* dx, const int32_t* pos, int n_tok, int n_heads, int hd,
                   const Real* inv_freq) {
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

// One query row of the mixed attention of docs/trainer.md, as written (the reference for
// attend_mix_group). q: [hd]; k, v: [n_keys, hd], every
// key visible to the row. set: ascending key ids in [0, n_keys) (n_set >= 1), or nullptr for
// dense only (z is then taken as 1: layer 0 and the teacher).
//   dense  = softmax(scale · q·kᵀ) · v
//   sparse = softmax of the same logits over the set only (the others masked to −∞) · v
//   out[hd] = z · dense + (1 − z) · sparse   (z·d + (1−z)·s, so z = 1 gives dense bit-exactly)
// raw: [n_keys] receives the unscaled logits q·k_j (for the selection), or nullptr.
template <typename Real>
void attend_mix_row(const Real* q, const Real* k, const Real* v, int hd, int n_keys,
                    const int32_t* set, int n_set, Real scale, Real z, Real* out,
                    std::type_identity_t<Real>* raw) {
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

// The weights of V of one row of the mixed attention, from its scaled logits l[n] (every key
// visible): p[n] = z · softmax(l) + (1 − z) · (softmax over the set, 0 elsewhere); set nullptr:
// p = softmax(l) (dense). z = 1 gives the dense weights bit for bit. p must not alias l.
template <typename Real>
void mix_softmax(const Real* l, int n, const int32_t* set, int n_set, Real z, Real* p) {
  softmax_gather<Real>(l, nullptr, n, p);
  if (set == nullptr) return;
  std::vector<Real> ps(static_cast<size_t>(n_set));
  softmax_gather<Real>(l, set, n_set, ps.data());
  for (int j = 0; j < n; ++j) p[j] *= z;
  for (int i = 0; i < n_set; ++i) p[set[i]] += (Real(1) - z) * ps[size_t(i)];
}

// Backward of mix_softmax for dp[n] = dloss/dp: dl[n] = z·pd·(dp − Σ pd·dp) + (1 − z)·ps·(dp −
// Σ ps·dp) (dl may alias dp). Returns dloss/dz = Σ (pd − ps)·dp, 0 for dense.
template <typename Real>
Real mix_softmax_backward(const Real* l, int n, const int32_t* set, int n_set, Real z,
                          const Real* dp, Real* dl) {
  const size_t nn = static_cast<size_t>(n);
  std::vector<Real> pd(nn), ps(set != nullptr ? nn : 0, Real(0));
  std::vector<Real> packed(set != nullptr ? size_t(n_set) : 0);
  softmax_gather<Real>(l, nullptr, n, pd.data());
  Real sum_d = 0, sum_s = 0;
  for (int j = 0; j < n; ++j) sum_d += pd[size_t(j)] * dp[j];
  if (set != nullptr) {
    softmax_gather<Real>(l, set, n_set, packed.data());
    for (int i = 0; i < n_set; ++i) ps[size_t(set[i])] = packed[size_t(i)];
    for (int i = 0; i < n_set; ++i) sum_s += packed[size_t(i)] * dp[set[i]];
  }
  const Real zd = set != nullptr ? z : Real(1);
  for (int j = 0; j < n; ++j) {  // reads dp[j] before writing dl[j]: dl may alias dp
    const Real sparse = set != nullptr ? (Real(1) - z) * ps[size_t(j)] * (dp[j] - sum_s) : Real(0);
    dl[j] = zd * pd[size_t(j)] * (dp[j] - sum_d) + sparse;
  }
  return set != nullptr ? sum_d - sum_s : Real(0);
}

// One chunk of attend_mix_group (internal): query positions t0 … t0 + nt − 1, rows (t, head g
// of the group) gathered to qb[rows, hd]; raw = qb·kᵀ [rows, keys], l = scale · raw and the
// weights p of mix_softmax, zero beyond each row's own position.
template <typename Real>
struct MixChunk {
  int t0 = 0, nt = 0, rows = 0, keys = 0;
  std::vector<Real> qb, raw, l, p;
};

template <typename Real>
void mix_chunk_forward(const Real* q, int group, int hd, int q_stride, const Real* k, int pos0,
                       const std::vector<int32_t>* sets, Real scale, Real z, MixChunk<Real>& c) {
  c.rows = c.nt * group;
  c.keys = pos0 + c.t0 + c.nt;
  c.qb.resize(size_t(c.rows) * hd);
  for (int t = 0; t < c.nt; ++t)
    std::copy_n(q + int64_t(c.t0 + t) * q_stride, group * hd,
                c.qb.data() + int64_t(t) * group * hd);
  c.raw.resize(size_t(c.rows) * c.keys);
  gemm<Real>(true, c.rows, c.keys, hd, Real(1), c.qb.data(), k, Real(0), c.raw.data());
  c.l.assign(c.raw.size(), Real(0));
  c.p.assign(c.raw.size(), Real(0));
  for (int r = 0; r < c.rows; ++r) {
    const int t = c.t0 + r / group, n = pos0 + t + 1;
    const int64_t off = int64_t(r) * c.keys;
    for (int j = 0; j < n; ++j) c.l[size_t(off + j)] = scale * c.raw[size_t(off + j)];
    const std::vector<int32_t>* set = sets != nullptr ? &sets[t] : nullptr;
    mix_softmax<Real>(c.l.data() + off, n, set ? set->data() : nullptr, set ? int(set->size()) : 0,
                      z, c.p.data() + off);
  }
}

// Query rows per chunk so that a chunk's [rows, keys] blocks stay under ~4 M entries.
inline int mix_chunk_positions(int n_q, int group, int pos0) {
  return std::max(1, (1 << 22) / std::max(1, (pos0 + n_q) * group));
}

// Mixed attention (docs/trainer.md) of one KV head group for n_q query positions pos0 … pos0 +
// n_q − 1, each seeing keys 0 … its own position. q: [n_q, group, hd] with row stride q_stride;
// k, v: [pos0 + n_q, hd]; sets: [n_q] ascending key sets (nullptr: dense, z ignored); out:
// [n_q, group, hd] with row stride out_stride. mean_raw (optional): [n_q, pos0 + n_q], row t's
// entries j <= pos0 + t get the group-mean raw logit (1/group)·Σ_g q_g·k_j, for the selection.
// Row by row this is attend_mix_row with the mix on the weights: out = (z·pd + (1 − z)·ps)·v.
template <typename Real>
void attend_mix_group(const Real* q, int n_q, int group, int hd, int q_stride, const Real* k,
                      const Real* v, int pos0, const std::vector<int32_t>* sets, Real scale, Real z,
                      Real* out, int out_stride, std::type_identity_t<Real>* mean_raw) {
  const int chunk = mix_chunk_positions(n_q, group, pos0), width = pos0 + n_q;
  MixChunk<Real> c;
  std::vector<Real> o;
  for (c.t0 = 0; c.t0 < n_q; c.t0 += chunk) {
    c.nt = std::min(chunk, n_q - c.t0);
    mix_chunk_forward<Real>(q, group, hd, q_stride, k, pos0, sets, scale, z, c);
    o.resize(size_t(c.rows) * hd);
    gemm<Real>(false, c.rows, hd, c.keys, Real(1), c.p.data(), v, Real(0), o.data());
    for (int t = 0; t < c.nt; ++t)
      std::copy_n(o.data() + int64_t(t) * group * hd, group * hd,
                  out + int64_t(c.t0 + t) * out_stride);
    for (int t = 0; t < c.nt && mean_raw != nullptr; ++t) {
      Real* m = mean_raw + int64_t(c.t0 + t) * width;
      const int n = pos0 + c.t0 + t + 1;
      std::fill(m, m + n, Real(0));
      for (int g = 0; g < group; ++g)
        for (int j = 0; j < n; ++j) m[j] += c.raw[size_t((int64_t(t) * group + g) * c.keys + j)];
      for (int j = 0; j < n; ++j) m[j] /= Real(group);
    }
  }
}

// Backward of attend_mix_group for dout [n_q, group, hd] (row stride dout_stride), recomputing
// the weights: dq (row stride q_stride) += ∂/∂q; dk, dv: [n_q, hd] += the gradients of the
// group's own keys pos0 … pos0 + n_q − 1 (keys below pos0, the fixed context, get none).
// Returns dloss/dz = Σ_rows dout · (dense − sparse); 0 for dense.
template <typename Real>
Real attend_mix_group_backward(const Real* q, int n_q, int group, int hd, int q_stride,
                               const Real* k, const Real* v, int pos0,
                               const std::vector<int32_t>* sets, Real scale, Real z,
                               const Real* dout, int dout_stride, Real* dq, Real* dk, Real* dv) {
  const int chunk = mix_chunk_positions(n_q, group, pos0);
  MixChunk<Real> c;
  std::vector<Real> db, ds, dqb;
  Real dz = 0;
  for (c.t0 = 0; c.t0 < n_q; c.t0 += chunk) {
    c.nt = std::min(chunk, n_q - c.t0);
    mix_chunk_forward<Real>(q, group, hd, q_stride, k, pos0, sets, scale, z, c);
    db.resize(size_t(c.rows) * hd);
    for (int t = 0; t < c.nt; ++t)
      std::copy_n(dout + int64_t(c.t0 + t) * dout_stride, group * hd,
                  db.data() + int64_t(t) * group * hd);
    ds.assign(size_t(c.rows) * c.keys, Real(0));  // dloss/dp, then dloss/d(raw logit)
    gemm<Real>(true, c.rows, c.keys, hd, Real(1), db.data(), v, Real(0), ds.data());
    for (int r = 0; r < c.rows; ++r) {
      const int t = c.t0 + r / group, n = pos0 + t + 1;
      Real* row = ds.data() + int64_t(r) * c.keys;
      const std::vector<int32_t>* set = sets != nullptr ? &sets[t] : nullptr;
      dz += mix_softmax_backward<Real>(c.l.data() + int64_t(r) * c.keys, n,
                                       set ? set->data() : nullptr, set ? int(set->size()) : 0, z,
                                       row, row);
      for (int j = 0; j < n; ++j) row[j] *= scale;
      std::fill(row + n, row + c.keys, Real(0));
    }
    dqb.resize(size_t(c.rows) * hd);
    gemm<Real>(false, c.rows, hd, c.keys, Real(1), ds.data(), k, Real(0), dqb.data());
    for (int t = 0; t < c.nt; ++t)
      for (int i = 0; i < group * hd; ++i)
        dq[int64_t(c.t0 + t) * q_stride + i] += dqb[size_t(int64_t(t) * group * hd + i)];
    // The chunk's rows see the group's own keys 0 … t0 + nt − 1 (columns pos0 …).
    const int n_own = c.t0 + c.nt;
    gemm_ld<Real>(true, false, n_own, hd, c.rows, Real(1), ds.data() + pos0, c.keys, c.qb.data(),
                  hd, Real(1), dk, hd);
    gemm_ld<Real>(true, false, n_own, hd, c.rows, Real(1), c.p.data() + pos0, c.keys, db.data(), hd,
                  Real(1), dv, hd);
  }
  return sets != nullptr ? dz : Real(0);
}

// Distillation loss scale · Σ_i (s_i − t_i)² over n values (scale: 1/T for logits, 1/(T·d) for
// hidden states), summed in double; ds[n] = 2·scale·(s − t) unless nullptr.
template <typename Real>
double squared_error(const Real* s, const Real* t, int64_t n, double scale,
                     std::type_identity_t<Real>* ds) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Real e = s[i] - t[i];
    sum += double(e) * double(e);
    if (ds != nullptr) ds[i] = Real(2 * scale) * e;
  }
  return scale * sum;
}

// Size k of the set a head passes on for a row with n_visible = p + 1 keys:
// max(1, ceil(keep_ratio · S)), the product in double exactly as written, as the engine's ratio
// selection does (so 0.07 · 100 = 7.000000000000001 gives 8); at most S. The CUDA port calls
// this same function.
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
  std::partial_sort(set.begin(), set.begin() + n_top, set.end(),
                    [a](int32_t i, int32_t j) { return a[i] > a[j] || (a[i] == a[j] && i < j); });
  set.resize(size_t(n_top));
  std::sort(set.begin(), set.end());
  set.push_back(p);
}

}  // namespace lychee::train
