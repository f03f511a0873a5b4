// The CPU oracle of the head-role trainer's pass, op by op (src/train/backward_ops.h): every
// op's backward against central finite differences in fp64, the group attention against the row
// op, and the selection rule by hand. The whole pass is in test_train_student.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "cpu/model.h"
#include "model/checkpoint.h"
#include "test_util.h"
#include "train/cpu_student.h"

namespace lychee::train {
namespace {

using Vec = std::vector<double>;

Vec random_vec(std::mt19937& rng, size_t n, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  Vec v(n);
  for (double& x : v) x = u(rng);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// max |analytic − central difference| over max |analytic|, with the worst index.
struct GradError {
  double rel = 0, max_abs = 0, ref_max = 0;
  size_t worst = 0;
};

GradError check_grad(Vec x, const Vec& grad, const std::function<double(const Vec&)>& f,
                     double eps = 1e-6) {
  GradError e;
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + eps;
    const double fp = f(x);
    x[i] = x0 - eps;
    const double fm = f(x);
    x[i] = x0;
    const double err = std::fabs((fp - fm) / (2 * eps) - grad[i]);
    if (err > e.max_abs) e.max_abs = err, e.worst = i;
    e.ref_max = std::max(e.ref_max, std::fabs(grad[i]));
  }
  e.rel = e.max_abs / std::max(e.ref_max, 1e-300);
  return e;
}

constexpr double kOpTol = 1e-7;  // fp64 central differences, eps 1e-6

// Expects a relative error under kOpTol and records it as a test property (--gtest_output=xml).
#define EXPECT_GRAD_OK(e, what)                                                              \
  do {                                                                                       \
    std::ostringstream name_;                                                                \
    name_ << what;                                                                           \
    ::testing::Test::RecordProperty(name_.str(), fmt::format("{:.2e}", (e).rel));            \
    EXPECT_LT((e).rel, kOpTol) << name_.str() << ": worst index " << (e).worst << ", |err| " \
                               << (e).max_abs << " vs max |grad| " << (e).ref_max;           \
  } while (0)

TEST(TrainOps, LinearBackward) {
  std::mt19937 rng(1);
  for (auto [n, k, m] : {std::array{1, 1, 1}, std::array{3, 19, 7}, std::array{5, 3, 99}}) {
    const Vec x = random_vec(rng, size_t(n * k)), w = random_vec(rng, size_t(m * k)),
              b = random_vec(rng, size_t(m)), wy = random_vec(rng, size_t(n * m));
    auto f = [&](const Vec& xx) {
      Vec y(size_t(n * m));
      linear(xx.data(), w.data(), b.data(), y.data(), n, k, m);
      return dot(y, wy);
    };
    Vec dx(x.size(), 0.5);
    linear_backward(wy.data(), w.data(), dx.data(), n, k, m, /*accumulate=*/true);
    for (double& g : dx) g -= 0.5;
    EXPECT_GRAD_OK(check_grad(x, dx, f), "linear " << n << "x" << k << "x" << m);
  }
}

TEST(TrainOps, RmsNormBackward) {
  std::mt19937 rng(2);
  for (int d : {1, 3, 19, 99}) {
    const int n = 3;
    Vec x = random_vec(rng, size_t(n * d));
    for (int j = 0; j < d; ++j) x[size_t(j)] *= 1e-3;  // a row near eps
    const Vec w = random_vec(rng, size_t(d)), wy = random_vec(rng, size_t(n * d));
    const double eps = 1e-5;
    auto f = [&](const Vec& xx) {
      Vec y(xx.size());
      rmsnorm(xx.data(), w.data(), y.data(), n, d, eps);
      return dot(y, wy);
    };
    Vec dx = wy;  // in place: dx aliases dy
    rmsnorm_backward(x.data(), w.data(), dx.data(), dx.data(), n, d, eps, false);
    EXPECT_GRAD_OK(check_grad(x, dx, f), "rmsnorm d=" << d);
  }
}

TEST(TrainOps, RopeBackward) {
  std::mt19937 rng(3);
  for (int hd : {2, 6, 38}) {
    const int n_tok = 3, n_heads = 2;
    const std::vector<int32_t> pos = {0, 7, 1177};
    const Vec x = random_vec(rng, size_t(n_tok * n_heads * hd)), wy = random_vec(rng, x.size()),
              inv_freq = random_vec(rng, size_t(hd / 2), 0.0, 1.0);
    auto f = [&](const Vec& xx) {
      Vec y = xx;
      rope(y.data(), pos.data(), n_tok, n_heads, hd, inv_freq.data());
      return dot(y, wy);
    };
    Vec dx = wy;
    rope_backward(dx.data(), pos.data(), n_tok, n_heads, hd, inv_freq.data());
    EXPECT_GRAD_OK(check_grad(x, dx, f), "rope hd=" << hd);
    Vec round_trip = x;  // a rotation: the backward undoes the forward
    rope(round_trip.data(), pos.data(), n_tok, n_heads, hd, inv_freq.data());
    rope_backward(round_trip.data(), pos.data(), n_tok, n_heads, hd, inv_freq.data());
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(round_trip[i], x[i], 1e-14);
  }
}

TEST(TrainOps, SwiGluBackward) {
  std::mt19937 rng(4);
  const size_t n = 1177;
  const Vec g = random_vec(rng, n, -12, 12), u = random_vec(rng, n, -3, 3), wy = random_vec(rng, n);
  Vec dg(n), du(n);
  swiglu_backward(g.data(), u.data(), wy.data(), dg.data(), du.data(), int64_t(n));
  auto f_g = [&](const Vec& gg) {
    Vec y(n);
    swiglu(gg.data(), u.data(), y.data(), int64_t(n));
    return dot(y, wy);
  };
  auto f_u = [&](const Vec& uu) {
    Vec y(n);
    swiglu(g.data(), uu.data(), y.data(), int64_t(n));
    return dot(y, wy);
  };
  EXPECT_GRAD_OK(check_grad(g, dg, f_g), "swiglu dg");
  EXPECT_GRAD_OK(check_grad(u, du, f_u), "swiglu du");
}

TEST(TrainOps, SquaredErrorGradient) {
  std::mt19937 rng(5);
  const Vec s = random_vec(rng, 99), t = random_vec(rng, 99);
  Vec ds(s.size());
  const double loss = squared_error(s.data(), t.data(), 99, 1.0 / 7, ds.data());
  double want = 0;
  for (size_t i = 0; i < s.size(); ++i) want += (s[i] - t[i]) * (s[i] - t[i]) / 7;
  EXPECT_NEAR(loss, want, 1e-14);
  auto f = [&](const Vec& ss) { return squared_error(ss.data(), t.data(), 99, 1.0 / 7, nullptr); };
  EXPECT_GRAD_OK(check_grad(s, ds, f), "squared error");
}

// One row of mixed attention: q, k, v, z all perturbed; dk, dv checked for keys >= grad_from.
TEST(TrainOps, AttendMixRowBackward) {
  std::mt19937 rng(6);
  struct Case {
    int hd, n_keys, grad_from;
    std::vector<int32_t> set;
    double z;
    bool dense;
  };
  const std::vector<Case> cases = {{3, 1, 0, {0}, 0.37, false},
                                   {19, 3, 1, {0, 2}, 0.0, false},
                                   {19, 19, 5, {2, 3, 11, 18}, 0.37, false},
                                   {3, 19, 18, {18}, 1.0, false},
                                   {19, 99, 40, {}, 0.61, false},
                                   {19, 19, 0, {}, 1.0, true},
                                   {3, 99, 97, {}, 0.25, false}};
  for (Case c : cases) {
    if (c.set.empty() && !c.dense) {  // every third key and the last
      for (int j = 0; j + 1 < c.n_keys; j += 3) c.set.push_back(j);
      c.set.push_back(c.n_keys - 1);
    }
    const int hd = c.hd, n = c.n_keys, g0 = c.grad_from;
    const double scale = 1.0 / std::sqrt(double(hd));
    const Vec q = random_vec(rng, size_t(hd), -3, 3), k = random_vec(rng, size_t(n * hd)),
              v = random_vec(rng, size_t(n * hd)), wo = random_vec(rng, size_t(hd));
    const int32_t* set = c.dense ? nullptr : c.set.data();
    const int n_set = int(c.set.size());
    // x = [q, k, v, z]
    Vec x = q;
    x.insert(x.end(), k.begin(), k.end());
    x.insert(x.end(), v.begin(), v.end());
    x.push_back(c.z);
    auto f = [&](const Vec& xx) {
      Vec out(static_cast<size_t>(hd));
      attend_mix_row(xx.data(), xx.data() + hd, xx.data() + hd + n * hd, hd, n, set, n_set, scale,
                     xx.back(), out.data(), nullptr);
      return dot(out, wo);
    };
    Vec dq(static_cast<size_t>(hd), 0.0), dk(size_t((n - g0) * hd), 0.0), dv(dk.size(), 0.0);
    const double dz =
        attend_mix_row_backward(q.data(), k.data(), v.data(), hd, n, set, n_set, scale, c.z,
                                wo.data(), dq.data(), dk.data(), dv.data(), g0);
    // Analytic gradient in x's layout; keys below grad_from have none: leave those out.
    Vec grad = dq, xs = q;
    std::vector<size_t> idx;
    for (int j = g0; j < n; ++j)
      for (int i = 0; i < hd; ++i) idx.push_back(size_t(hd + j * hd + i));
    for (int j = g0; j < n; ++j)
      for (int i = 0; i < hd; ++i) idx.push_back(size_t(hd + n * hd + j * hd + i));
    grad.insert(grad.end(), dk.begin(), dk.end());
    grad.insert(grad.end(), dv.begin(), dv.end());
    grad.push_back(dz);
    idx.push_back(x.size() - 1);
    for (size_t i : idx) xs.push_back(x[i]);
    auto f_sub = [&](const Vec& sub) {
      Vec xx = x;
      for (int i = 0; i < hd; ++i) xx[size_t(i)] = sub[size_t(i)];
      for (size_t i = 0; i < idx.size(); ++i) xx[idx[i]] = sub[size_t(hd) + i];
      return f(xx);
    };
    const GradError e = check_grad(xs, grad, f_sub);
    EXPECT_GRAD_OK(e, "attend_mix_row hd=" << hd << " keys=" << n << " set=" << n_set
                                           << " z=" << c.z << " grad_from=" << g0);
    if (c.dense) {
      EXPECT_EQ(dz, 0.0);
    }
  }
}

TEST(TrainOps, AttendMixRowEqualities) {
  std::mt19937 rng(7);
  const int hd = 19, n = 23;
  const Vec q = random_vec(rng, hd, -3, 3), k = random_vec(rng, n * hd),
            v = random_vec(rng, n * hd);
  std::vector<int32_t> all(n), some = {1, 4, 22};
  for (int j = 0; j < n; ++j) all[size_t(j)] = j;
  Vec dense(hd), mixed(hd), full(hd), raw(n);
  attend_mix_row(q.data(), k.data(), v.data(), hd, n, nullptr, 0, 0.2, 1.0, dense.data(),
                 raw.data());
  attend_mix_row(q.data(), k.data(), v.data(), hd, n, some.data(), 3, 0.2, 1.0, mixed.data(),
                 nullptr);
  EXPECT_EQ(mixed, dense);  // z = 1 is dense bit for bit
  attend_mix_row(q.data(), k.data(), v.data(), hd, n, all.data(), n, 0.2, 0.3, full.data(),
                 nullptr);
  for (int i = 0; i < hd; ++i) EXPECT_NEAR(full[size_t(i)], dense[size_t(i)], 1e-15);
  for (int j = 0; j < n; ++j)
    EXPECT_NEAR(raw[size_t(j)], dot(q, Vec(k.begin() + j * hd, k.begin() + (j + 1) * hd)), 1e-13);
}

TEST(TrainOps, MixSoftmaxBackward) {
  std::mt19937 rng(9);
  for (auto [n, z, dense] :
       {std::tuple{1, 0.3, false}, std::tuple{19, 0.0, false}, std::tuple{99, 0.71, false},
        std::tuple{99, 1.0, false}, std::tuple{19, 1.0, true}}) {
    std::vector<int32_t> set;
    for (int j = n % 2; j < n; j += 4) set.push_back(j);
    if (set.empty()) set.push_back(0);
    const int32_t* sp = dense ? nullptr : set.data();
    const int n_set = int(set.size());
    const Vec l = random_vec(rng, size_t(n), -4, 4), wp = random_vec(rng, size_t(n));
    Vec x = l;
    x.push_back(z);
    auto f = [&](const Vec& xx) {
      Vec p(static_cast<size_t>(n));
      mix_softmax(xx.data(), n, sp, n_set, xx.back(), p.data());
      return dot(p, wp);
    };
    Vec grad = wp;  // dl aliases dp
    const double dz = mix_softmax_backward(l.data(), n, sp, n_set, z, grad.data(), grad.data());
    grad.push_back(dz);
    if (dense) grad.back() = 0;  // z is ignored when dense
    EXPECT_GRAD_OK(check_grad(x, grad, f),
                   "mix_softmax n=" << n << " z=" << z << (dense ? " dense" : ""));
  }
}

// The layer's block op (BLAS, chunked) against the row op, forward and backward, with sets; then
// its own gradient in q, the group's own k and v, and z against finite differences.
TEST(TrainOps, AttendMixGroupMatchesRowsAndFiniteDifferences) {
  std::mt19937 rng(10);
  struct Case {
    int hd, group, pos0, n_q;
    double z;
    bool dense;
  };
  for (const Case& c : {Case{6, 3, 5, 7, 0.37, false}, Case{3, 1, 0, 4, 0.0, false},
                        Case{19, 2, 23, 3, 1.0, false}, Case{6, 5, 11, 2, 0.8, true}}) {
    const int hd = c.hd, group = c.group, pos0 = c.pos0, n_q = c.n_q, qs = group * hd + 5;
    const int n_keys = pos0 + n_q;
    const double scale = 0.4;
    Vec q = random_vec(rng, size_t(n_q * qs), -2, 2), k = random_vec(rng, size_t(n_keys * hd)),
        v = random_vec(rng, k.size());
    std::vector<std::vector<int32_t>> sets(static_cast<size_t>(n_q));
    for (int t = 0; t < n_q; ++t) {
      for (int j = t % 3; j < pos0 + t; j += 3) sets[size_t(t)].push_back(j);
      sets[size_t(t)].push_back(pos0 + t);
    }
    const std::vector<int32_t>* sp = c.dense ? nullptr : sets.data();
    Vec out(q.size(), 0.0), mean(static_cast<size_t>(n_q * n_keys), -7.0),
        row(static_cast<size_t>(hd)), raw(static_cast<size_t>(n_keys));
    attend_mix_group(q.data(), n_q, group, hd, qs, k.data(), v.data(), pos0, sp, scale, c.z,
                     out.data(), qs, mean.data());
    const Vec wo = random_vec(rng, out.size());
    Vec dq_rows(q.size(), 0.0), dk_rows(size_t(n_q * hd), 0.0), dv_rows(dk_rows.size(), 0.0);
    double dz_rows = 0;
    for (int t = 0; t < n_q; ++t) {
      Vec m(size_t(pos0 + t + 1), 0.0);
      for (int g = 0; g < group; ++g) {
        const int64_t off = int64_t(t) * qs + g * hd;
        const int32_t* set = c.dense ? nullptr : sets[size_t(t)].data();
        const int n_set = int(sets[size_t(t)].size());
        attend_mix_row(q.data() + off, k.data(), v.data(), hd, pos0 + t + 1, set, n_set, scale, c.z,
                       row.data(), raw.data());
        for (int i = 0; i < hd; ++i) EXPECT_NEAR(out[size_t(off + i)], row[size_t(i)], 1e-13);
        for (int j = 0; j <= pos0 + t; ++j) m[size_t(j)] += raw[size_t(j)] / group;
        dz_rows += attend_mix_row_backward(
            q.data() + off, k.data(), v.data(), hd, pos0 + t + 1, set, n_set, scale, c.z,
            wo.data() + off, dq_rows.data() + off, dk_rows.data(), dv_rows.data(), pos0);
      }
      for (int j = 0; j <= pos0 + t; ++j)
        EXPECT_NEAR(mean[size_t(t * n_keys + j)], m[size_t(j)], 1e-13);
    }
    Vec dq(q.size(), 0.0), dk(dk_rows.size(), 0.0), dv(dk.size(), 0.0);
    const double dz =
        attend_mix_group_backward(q.data(), n_q, group, hd, qs, k.data(), v.data(), pos0, sp, scale,
                                  c.z, wo.data(), qs, dq.data(), dk.data(), dv.data());
    EXPECT_NEAR(dz, dz_rows, 1e-12);
    for (size_t i = 0; i < dq.size(); ++i) EXPECT_NEAR(dq[i], dq_rows[i], 1e-12);
    for (size_t i = 0; i < dk.size(); ++i) EXPECT_NEAR(dk[i], dk_rows[i], 1e-12);
    for (size_t i = 0; i < dv.size(); ++i) EXPECT_NEAR(dv[i], dv_rows[i], 1e-12);
    // x = [q, own k rows, own v rows, z]
    const size_t own = size_t(pos0) * hd, n_own = size_t(n_q) * hd;
    Vec x = q;
    x.insert(x.end(), k.begin() + own, k.end());
    x.insert(x.end(), v.begin() + own, v.end());
    x.push_back(c.z);
    auto f = [&](const Vec& xx) {
      Vec kk = k, vv = v, o(q.size(), 0.0);
      std::copy_n(xx.begin() + q.size(), n_own, kk.begin() + own);
      std::copy_n(xx.begin() + q.size() + n_own, n_own, vv.begin() + own);
      attend_mix_group(xx.data(), n_q, group, hd, qs, kk.data(), vv.data(), pos0, sp, scale,
                       xx.back(), o.data(), qs, nullptr);
      return dot(o, wo);
    };
    Vec grad = dq;
    grad.insert(grad.end(), dk.begin(), dk.end());
    grad.insert(grad.end(), dv.begin(), dv.end());
    grad.push_back(c.dense ? 0.0 : dz);
    EXPECT_GRAD_OK(check_grad(x, grad, f),
                   "attend_mix_group hd=" << hd << " group=" << group << " pos0=" << pos0 << " n_q="
                                          << n_q << " z=" << c.z << (c.dense ? " dense" : ""));
  }
}

TEST(TrainSelection, BudgetIsCeilOfTheProductInDouble) {
  EXPECT_EQ(student_budget(0.3, 1), 1);
  EXPECT_EQ(student_budget(0.01, 5), 1);
  EXPECT_EQ(student_budget(0.5, 10), 5);
  EXPECT_EQ(student_budget(0.25, 9), 3);
  EXPECT_EQ(student_budget(1.0, 7), 7);
  EXPECT_EQ(student_budget(0.3, 10), 3);
  EXPECT_EQ(student_budget(0.07, 100), 8);  // 0.07 * 100 = 7.000000000000001 in fp64: as written
  EXPECT_EQ(student_budget(0.3, 20), 6);    // 6.0 exactly
}

TEST(TrainSelection, HandComputedTiesAndCurrentToken) {
  //                     j: 0    1    2    3    4    5 (= p, its own score is never read)
  const std::vector<double> a = {5.0, 1.0, 5.0, 3.0, 5.0, 99.0};
  std::vector<int32_t> set;
  select_set(a.data(), 5, 3, set);
  EXPECT_EQ(set, (std::vector<int32_t>{0, 2, 5}));  // three-way tie at 5: lower positions first
  select_set(a.data(), 5, 4, set);
  EXPECT_EQ(set, (std::vector<int32_t>{0, 2, 4, 5}));
  select_set(a.data(), 5, 5, set);
  EXPECT_EQ(set, (std::vector<int32_t>{0, 2, 3, 4, 5}));
  select_set(a.data(), 5, 1, set);
  EXPECT_EQ(set, (std::vector<int32_t>{5}));  // the current token alone
  select_set(a.data(), 5, 6, set);
  EXPECT_EQ(set, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  select_set(a.data(), 0, 1, set);
  EXPECT_EQ(set, (std::vector<int32_t>{0}));
  const std::vector<float> b = {-1.0f, -0.5f, -0.5f, -2.0f};
  std::vector<int32_t> set_f;
  select_set(b.data(), 3, 2, set_f);  // p = 3: k − 1 = 1 of j < 3, the tie goes to j = 1
  EXPECT_EQ(set_f, (std::vector<int32_t>{1, 3}));
}

}  // namespace
}  // namespace lychee::train
