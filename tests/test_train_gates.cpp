// Head gates and optimiser of the head-role trainer: HardKuma and HardConcrete sampling against
// Monte Carlo and closed forms, E[z] quadrature against closed forms and a brute-force rule,
// reparameterisation and penalty gradients against finite differences, GateSet::backward, the
// direct gate, role decisions, AdamW by hand, its checkpoint round trip, the LR schedule and λ.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/gates.h"
#include "train/optim.h"

namespace lychee::train {
namespace {

constexpr double kP = -0.1, kQ = 1.1;  // the default stretch

double sigmoid(double y) { return 1.0 / (1.0 + std::exp(-y)); }

template <class F>
ErrorCode error_code_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kInternal;  // "did not throw"; no test expects kInternal
}

// Monte Carlo statistics of each gated head over n samples from GateSet::sample.
struct McStats {
  std::vector<double> p_zero, p_one, mean, sd;
};

McStats monte_carlo(GateSet& gates, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int h = gates.n_kv_heads(), g_n = gates.n_gates();
  std::vector<float> z(size_t(gates.n_layers() * h));
  std::vector<double> zero(g_n), one(g_n), sum(g_n), sum2(g_n);
  for (int s = 0; s < n; ++s) {
    gates.sample(rng, z);
    for (int i = 0; i < h; ++i) EXPECT_EQ(z[i], 1.0f);
    for (int g = 0; g < g_n; ++g) {
      const double v = z[g + h];
      EXPECT_TRUE(v >= 0.0 && v <= 1.0) << v;
      zero[g] += v == 0.0;
      one[g] += v == 1.0;
      sum[g] += v;
      sum2[g] += v * v;
    }
  }
  McStats st;
  for (int g = 0; g < g_n; ++g) {
    st.p_zero.push_back(zero[g] / n);
    st.p_one.push_back(one[g] / n);
    st.mean.push_back(sum[g] / n);
    st.sd.push_back(std::sqrt(std::max(0.0, sum2[g] / n - st.mean[g] * st.mean[g])));
  }
  return st;
}

// Checks MC statistics of gate g against the set's closed forms within 4 sigma.
void expect_matches_mc(const GateSet& gates, const McStats& st, int n) {
  const std::vector<double> p0 = gates.prob_nonzero(), p1 = gates.prob_one(), ez = gates.expected_z();
  const int h = gates.n_kv_heads();
  for (int g = 0; g < gates.n_gates(); ++g) {
    const double pz = 1.0 - p0[g + h], po = p1[g + h];
    const auto tol = [n](double p) { return 4.0 * std::sqrt(std::max(p * (1.0 - p), 1.0 / n) / n); };
    EXPECT_NEAR(st.p_zero[g], pz, tol(pz)) << "P(z=0) of gate " << g;
    EXPECT_NEAR(1.0 - st.p_zero[g], p0[g + h], tol(pz)) << "P(z>0) of gate " << g;
    EXPECT_NEAR(st.p_one[g], po, tol(po)) << "P(z=1) of gate " << g;
    EXPECT_NEAR(st.mean[g], ez[g + h], 4.0 * st.sd[g] / std::sqrt(double(n)) + 1e-7) << "E[z] of gate " << g;
  }
}

// ---------------------------------------------------------------- HardKuma

TEST(HardKuma, UniformInitHasOneTwelfthAtEachEnd) {
  GateSet gates(GateKind::kHardKuma, 3, 2);
  ASSERT_EQ(gates.n_gates(), 4);
  ASSERT_EQ(gates.n_params(), 8);
  for (double p : gates.params()) EXPECT_EQ(p, 0.0);
  const std::vector<double> p0 = gates.prob_nonzero(), p1 = gates.prob_one(), ez = gates.expected_z();
  for (int i = 0; i < 6; ++i) {
    const bool layer0 = i < 2;
    EXPECT_NEAR(p0[i], layer0 ? 1.0 : 11.0 / 12.0, 1e-15) << i;
    EXPECT_NEAR(p1[i], layer0 ? 1.0 : 1.0 / 12.0, 1e-15) << i;
    EXPECT_NEAR(ez[i], layer0 ? 1.0 : 0.5, 1e-13) << i;  // z is symmetric about 0.5 under U(0, 1)
  }
  EXPECT_NEAR(gates.penalty(), 4.0 * 11.0 / 12.0, 1e-14);
  EXPECT_EQ(gates.alpha(), std::vector<double>(6, 1.0));
  EXPECT_TRUE(gates.log_a().empty());
  EXPECT_TRUE(gates.gate().empty());
}

TEST(HardKuma, MonteCarloMatchesClosedForms) {
  // One gated layer with three shapes: uniform, mass near 0, mass near 1.
  GateSet gates(GateKind::kHardKuma, 2, 3);
  const double shapes[3][2] = {{1.0, 1.0}, {0.5, 2.0}, {3.0, 0.7}};
  for (int g = 0; g < 3; ++g) {
    gates.params()[g] = std::log(shapes[g][0]);
    gates.params()[3 + g] = std::log(shapes[g][1]);
  }
  // The closed form of P(z > 0) written out here, independently of kuma_tail.
  const std::vector<double> p0 = gates.prob_nonzero();
  for (int g = 0; g < 3; ++g)
    EXPECT_NEAR(p0[3 + g], std::pow(1.0 - std::pow(1.0 / 12.0, shapes[g][0]), shapes[g][1]), 1e-14);
  EXPECT_NEAR(gates.prob_one()[4], std::pow(1.0 - std::pow(11.0 / 12.0, 0.5), 2.0), 1e-14);
  const int n = 200000;
  const McStats st = monte_carlo(gates, n, 42);
  expect_matches_mc(gates, st, n);
  EXPECT_NEAR(st.p_zero[0], 1.0 / 12.0, 4.0 * std::sqrt(1.0 / 12.0 * 11.0 / 12.0 / n));
  EXPECT_NEAR(st.p_one[0], 1.0 / 12.0, 4.0 * std::sqrt(1.0 / 12.0 * 11.0 / 12.0 / n));
}

TEST(HardKuma, ExpectedZMatchesClosedFormsAtAlphaOneOrBetaOne) {
  const double x0 = 1.0 / 12.0, x1 = 11.0 / 12.0;
  for (double b : {0.05, 0.3, 1.0, 2.5, 20.0}) {
    // α = 1: tail (1 − x)^β integrates to [(1 − x0)^(β+1) − (1 − x1)^(β+1)]/(β + 1).
    const double want = (kQ - kP) * (std::pow(1 - x0, b + 1) - std::pow(1 - x1, b + 1)) / (b + 1);
    EXPECT_NEAR(hardkuma_expected_z(1.0, b, kP, kQ), want, 1e-12) << "beta " << b;
  }
  for (double a : {0.05, 0.3, 2.5, 20.0}) {
    // β = 1: tail 1 − x^α integrates to (x1 − x0) − (x1^(α+1) − x0^(α+1))/(α + 1).
    const double want = (kQ - kP) * ((x1 - x0) - (std::pow(x1, a + 1) - std::pow(x0, a + 1)) / (a + 1));
    EXPECT_NEAR(hardkuma_expected_z(a, 1.0, kP, kQ), want, 1e-12) << "alpha " << a;
  }
}

TEST(HardKuma, ExpectedZAtExtremeShapesMatchesMidpointRule) {
  const double x0 = 1.0 / 12.0, x1 = 11.0 / 12.0;
  const int n = 1000000;
  // Steep steps inside (1/12, 11/12) (30, 1e4), (8, 200); mass piled at one end (60, 3), (4, 0.1);
  // shapes far from uniform on both parameters (0.05, 0.05), (0.1, 0.8).
  for (auto [a, b] : {std::pair{30.0, 1e4}, {8.0, 200.0}, {60.0, 3.0}, {0.05, 0.05}, {4.0, 0.1}, {0.1, 0.8}}) {
    double sum = 0.0;
    for (int i = 0; i < n; ++i) sum += kuma_tail(a, b, x0 + (i + 0.5) * (x1 - x0) / n);
    const double want = (kQ - kP) * sum * (x1 - x0) / n;
    const double got = hardkuma_expected_z(a, b, kP, kQ);
    EXPECT_NEAR(got, want, 1e-9) << "alpha " << a << " beta " << b;
    // E[z] lies between P(z = 1) and P(z > 0).
    EXPECT_GE(got, kuma_tail(a, b, x1) - 1e-12);
    EXPECT_LE(got, kuma_tail(a, b, x0) + 1e-12);
  }
}

TEST(HardKuma, ReparameterisationGradientsMatchFiniteDifferences) {
  const double h = 1e-6;
  int n_interior = 0;
  for (double la : {-1.2, -0.3, 0.0, 0.4, 1.1}) {
    for (double lb : {-0.9, 0.0, 0.7, 1.5}) {
      for (double u : {0.05, 0.3, 0.5, 0.77, 0.95}) {
        const GateDraw d = hardkuma_draw(la, lb, u, kP, kQ);
        // Kumaraswamy inverse CDF written out here: x = (1 − (1 − u)^(1/β))^(1/α).
        const double x = std::pow(1.0 - std::pow(1.0 - u, std::exp(-lb)), std::exp(-la));
        EXPECT_NEAR(d.z, std::clamp(kP + (kQ - kP) * x, 0.0, 1.0), 1e-13);
        if (d.z < 1e-4 || d.z > 1.0 - 1e-4) {
          if (d.z == 0.0 || d.z == 1.0) {
            EXPECT_TRUE(d.dz[0] == 0.0 && d.dz[1] == 0.0);
          }
          continue;  // clamped, or too close to the kink for a central difference
        }
        ++n_interior;
        const double fa = (hardkuma_draw(la + h, lb, u, kP, kQ).z - hardkuma_draw(la - h, lb, u, kP, kQ).z) / (2 * h);
        const double fb = (hardkuma_draw(la, lb + h, u, kP, kQ).z - hardkuma_draw(la, lb - h, u, kP, kQ).z) / (2 * h);
        EXPECT_NEAR(d.dz[0], fa, 1e-7 * std::max(1.0, std::abs(fa))) << la << " " << lb << " " << u;
        EXPECT_NEAR(d.dz[1], fb, 1e-7 * std::max(1.0, std::abs(fb))) << la << " " << lb << " " << u;
      }
    }
  }
  EXPECT_GT(n_interior, 40);
}

// Central differences of penalty() per parameter against penalty_grad(scale), which must ADD.
void expect_penalty_grad_matches_fd(GateSet& gates, double h, double tol) {
  const double scale = 1.7, preset = 0.25;
  std::vector<double> grad(size_t(gates.n_params()), preset);
  gates.penalty_grad(scale, grad);
  for (int i = 0; i < gates.n_params(); ++i) {
    const double keep = gates.params()[i];
    gates.params()[i] = keep + h;
    const double up = gates.penalty();
    gates.params()[i] = keep - h;
    const double down = gates.penalty();
    gates.params()[i] = keep;
    const double fd = (up - down) / (2 * h);
    EXPECT_NEAR(grad[i] - preset, scale * fd, tol * std::max(1.0, std::abs(fd))) << "param " << i;
  }
}

TEST(HardKuma, PenaltyGradientMatchesFiniteDifferences) {
  GateSet gates(GateKind::kHardKuma, 3, 4);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> dist(-2.0, 2.0);
  for (double& p : gates.params()) p = dist(rng);
  expect_penalty_grad_matches_fd(gates, 1e-6, 1e-8);
}

// ---------------------------------------------------------------- HardConcrete

TEST(HardConcrete, ClosedFormsAndMonteCarlo) {
  GateSet gates(GateKind::kHardConcrete, 2, 3);
  EXPECT_NEAR(gates.expected_z()[3], 0.5, 1e-12);  // log a = 0 is symmetric about 0.5
  EXPECT_NEAR(1.0 - gates.prob_nonzero()[3], gates.prob_one()[3], 1e-15);  // P(z = 0) = P(z = 1)
  EXPECT_NEAR(gates.prob_nonzero()[3], 0.832, 1e-3);                       // as GateOptions says
  const double log_as[3] = {0.0, -1.5, 2.0};
  for (int g = 0; g < 3; ++g) gates.params()[g] = log_as[g];
  // Louizos et al.'s P(z > 0) = sigmoid(log a − β·ln(−γ/ζ)), written out here.
  const std::vector<double> p0 = gates.prob_nonzero();
  for (int g = 0; g < 3; ++g)
    EXPECT_NEAR(p0[3 + g], sigmoid(log_as[g] - 2.0 / 3.0 * std::log(0.1 / 1.1)), 1e-14) << g;
  EXPECT_NEAR(gates.penalty(), p0[3] + p0[4] + p0[5], 1e-14);
  const int n = 200000;
  expect_matches_mc(gates, monte_carlo(gates, n, 43), n);
}

TEST(HardConcrete, GradientsMatchFiniteDifferences) {
  const double h = 1e-6, tau = 2.0 / 3.0;
  int n_interior = 0;
  for (double la : {-2.0, -0.5, 0.0, 0.8, 2.5}) {
    for (double u : {0.02, 0.2, 0.5, 0.7, 0.97}) {
      const GateDraw d = hardconcrete_draw(la, tau, u, kP, kQ);
      const double s = sigmoid((std::log(u / (1 - u)) + la) / tau);
      EXPECT_NEAR(d.z, std::clamp(kP + (kQ - kP) * s, 0.0, 1.0), 1e-13);
      EXPECT_EQ(d.dz[1], 0.0);
      if (d.z < 1e-4 || d.z > 1.0 - 1e-4) continue;
      ++n_interior;
      const double fd =
          (hardconcrete_draw(la + h, tau, u, kP, kQ).z - hardconcrete_draw(la - h, tau, u, kP, kQ).z) / (2 * h);
      EXPECT_NEAR(d.dz[0], fd, 1e-7 * std::max(1.0, std::abs(fd))) << la << " " << u;
    }
  }
  EXPECT_GT(n_interior, 10);
  GateSet gates(GateKind::kHardConcrete, 3, 3);
  for (int g = 0; g < gates.n_gates(); ++g) gates.params()[g] = -2.0 + 0.7 * g;
  expect_penalty_grad_matches_fd(gates, 1e-6, 1e-8);
}

// ---------------------------------------------------------------- GateSet::backward

// backward(dz) against central differences of Σ dz·z(u; params) with the noise u held fixed.
void expect_backward_matches_fd(GateKind kind, const std::vector<double>& params0) {
  const int n_layers = 4, h = 3;
  GateSet gates(kind, n_layers, h);
  ASSERT_EQ(params0.size(), size_t(gates.n_params()));
  std::copy(params0.begin(), params0.end(), gates.params().begin());
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  std::vector<double> u(size_t(gates.n_gates()));
  for (double& x : u) x = unif(rng);
  std::vector<float> dz(size_t(n_layers * h));
  for (float& x : dz) x = float(unif(rng) * 4.0 - 2.0);
  for (int i = 0; i < h; ++i) dz[i] = 1000.0f;  // layer 0: ignored
  const auto loss = [&]() {
    std::vector<double> z(dz.size());
    gates.sample_with_u(u, z);
    double sum = 0.0;
    for (size_t i = size_t(h); i < z.size(); ++i) sum += double(dz[i]) * z[i];
    return sum;
  };
  std::vector<double> z(dz.size());
  gates.sample_with_u(u, z);
  int n_clamped = 0, n_interior = 0;
  for (size_t i = size_t(h); i < z.size(); ++i) {
    ASSERT_TRUE(z[i] == 0.0 || z[i] == 1.0 || (z[i] > 1e-3 && z[i] < 1.0 - 1e-3)) << "too near a kink: " << z[i];
    (z[i] == 0.0 || z[i] == 1.0 ? n_clamped : n_interior)++;
  }
  if (kind != GateKind::kDirect) {
    EXPECT_GT(n_clamped, 0);
  }
  EXPECT_GT(n_interior, 3);
  const double preset = -0.5;
  std::vector<double> grad(size_t(gates.n_params()), preset);
  gates.backward(dz, grad);
  const double eps = 1e-6;
  for (int i = 0; i < gates.n_params(); ++i) {
    const double keep = gates.params()[i];
    gates.params()[i] = keep + eps;
    const double up = loss();
    gates.params()[i] = keep - eps;
    const double down = loss();
    gates.params()[i] = keep;
    const double fd = (up - down) / (2 * eps);
    EXPECT_NEAR(grad[i] - preset, fd, 1e-7 * std::max(1.0, std::abs(fd))) << "param " << i;
  }
}

TEST(GateSetBackward, HardKumaMatchesFiniteDifferences) {
  std::vector<double> p(18);
  for (int i = 0; i < 18; ++i) p[i] = std::sin(1.3 * i) * 1.2;  // log α, log β in [−1.2, 1.2]
  expect_backward_matches_fd(GateKind::kHardKuma, p);
}

TEST(GateSetBackward, HardConcreteMatchesFiniteDifferences) {
  std::vector<double> p(9);
  for (int i = 0; i < 9; ++i) p[i] = std::cos(0.9 * i) * 1.5;
  expect_backward_matches_fd(GateKind::kHardConcrete, p);
}

TEST(GateSetBackward, DirectMatchesFiniteDifferences) {
  std::vector<double> p(9);
  for (int i = 0; i < 9; ++i) p[i] = 0.05 + 0.1 * i;
  expect_backward_matches_fd(GateKind::kDirect, p);
}

TEST(GateSetBackward, UsesTheDerivativesOfTheSampleTime) {
  GateSet gates(GateKind::kHardKuma, 2, 2);
  const std::vector<double> u = {0.4, 0.6};
  std::vector<float> z(4), dz = {0, 0, 1.0f, -2.0f};
  gates.sample_with_u(u, z);
  std::vector<double> before(4, 0.0), after(4, 0.0);
  gates.backward(dz, before);
  for (double& p : gates.params()) p += 0.3;  // an optimiser step between sample and backward
  gates.backward(dz, after);
  EXPECT_EQ(before, after);
  EXPECT_NE(before[0], 0.0);
}

TEST(GateSet, SamplingIsReproducibleAndLayerZeroIsOne) {
  GateSet a(GateKind::kHardKuma, 3, 2), b(GateKind::kHardKuma, 3, 2);
  std::mt19937_64 ra(5), rb(5);
  std::vector<float> za(6), zb(6);
  a.sample(ra, za);
  b.sample(rb, zb);
  EXPECT_EQ(za, zb);
  EXPECT_EQ(za[0], 1.0f);
  EXPECT_EQ(za[1], 1.0f);
  a.sample(ra, za);
  EXPECT_NE(za, zb);  // fresh noise on the next step
}

TEST(GateSet, ParameterLayoutAndAccessors) {
  GateSet gates(GateKind::kHardKuma, 3, 2);  // gates: (1,0) (1,1) (2,0) (2,1)
  gates.params()[3] = std::log(2.5);         // log α of layer 2, head 1
  gates.params()[4 + 1] = std::log(0.4);     // log β of layer 1, head 1
  const std::vector<double> a = gates.alpha(), b = gates.beta();
  EXPECT_NEAR(a[5], 2.5, 1e-14);
  EXPECT_NEAR(b[3], 0.4, 1e-14);
  EXPECT_EQ(a[4], 1.0);
  EXPECT_EQ(b[5], 1.0);
  EXPECT_NEAR(gates.expected_z()[5], hardkuma_expected_z(2.5, 1.0, kP, kQ), 1e-15);
  const GateReport r = gates.report();
  EXPECT_EQ(r.alpha, a);
  EXPECT_EQ(r.beta, b);
  EXPECT_EQ(r.expected_z, gates.expected_z());
  EXPECT_TRUE(r.gate.empty() && r.log_a.empty());
  EXPECT_NE(gates.expected_z_method().find("[0.0833333, 0.916667]"), std::string::npos) << gates.expected_z_method();
}

TEST(GateSet, RejectsBadShapesAndOrder) {
  GateSet gates(GateKind::kHardKuma, 3, 2);
  std::vector<float> z(5), dz(6);
  std::vector<double> grad(8);
  std::mt19937_64 rng(1);
  EXPECT_EQ(error_code_of([&] { gates.backward(dz, grad); }), ErrorCode::kInvalidArgument);  // before sample
  EXPECT_EQ(error_code_of([&] { gates.sample(rng, z); }), ErrorCode::kInvalidArgument);
  std::vector<double> short_grad(7);
  EXPECT_EQ(error_code_of([&] { gates.penalty_grad(1.0, short_grad); }), ErrorCode::kInvalidArgument);
  const std::vector<double> bad_u = {0.5, 0.5, 1.5, 0.5};
  std::vector<float> z6(6);
  EXPECT_EQ(error_code_of([&] { gates.sample_with_u(bad_u, z6); }), ErrorCode::kInvalidArgument);
  GateOptions o;
  o.stretch_low = 0.1;
  EXPECT_EQ(error_code_of([&] { GateSet(GateKind::kHardKuma, 3, 2, o); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_code_of([&] { GateSet(GateKind::kDirect, 0, 2); }), ErrorCode::kInvalidArgument);
}

// ---------------------------------------------------------------- direct

TEST(Direct, DeterministicGatePenaltyAndProjection) {
  GateSet gates(GateKind::kDirect, 2, 3);
  EXPECT_EQ(gates.gate(), std::vector<double>(6, 1.0));  // DuoAttention-style init: all dense
  gates.params()[0] = -0.3;
  gates.params()[1] = 1.4;
  gates.params()[2] = 0.6;
  EXPECT_NEAR(gates.penalty(), -0.3 + 1.4 + 0.6, 1e-15);
  std::vector<double> grad = {0.5, 0.5, 0.5};
  gates.penalty_grad(2.0, grad);
  EXPECT_EQ(grad, (std::vector<double>{2.5, 2.5, 2.5}));
  gates.project();
  EXPECT_EQ(gates.gate(), (std::vector<double>{1, 1, 1, 0.0, 1.0, 0.6}));
  std::mt19937_64 rng(3), untouched(3);
  std::vector<float> z(6);
  gates.sample(rng, z);
  EXPECT_EQ(z, (std::vector<float>{1, 1, 1, 0.0f, 1.0f, 0.6f}));
  EXPECT_EQ(rng(), untouched());  // no noise drawn
  EXPECT_EQ(gates.expected_z(), (std::vector<double>{1, 1, 1, 0.0, 1.0, 0.6}));
  EXPECT_EQ(gates.prob_nonzero(), (std::vector<double>{1, 1, 1, 0, 1, 1}));
  EXPECT_EQ(gates.prob_one(), (std::vector<double>{1, 1, 1, 0, 1, 0}));
  EXPECT_TRUE(gates.alpha().empty());
  EXPECT_EQ(gates.report().gate, gates.gate());
  EXPECT_TRUE(gates.report().alpha.empty());
}

// ---------------------------------------------------------------- role decisions

TEST(Roles, ThresholdIsStrictAndForcesLayerZero) {
  const std::vector<double> ez = {0.0, 0.2, 0.5, 0.51, 0.9, 0.5000001};
  EXPECT_EQ(roles_threshold(ez, 3, 2), (std::vector<uint8_t>{1, 1, 0, 1, 1, 1}));
  EXPECT_EQ(roles_threshold(ez, 3, 2, 0.8), (std::vector<uint8_t>{1, 1, 0, 0, 1, 0}));
  EXPECT_EQ(error_code_of([&] { roles_threshold(ez, 2, 2); }), ErrorCode::kInvalidArgument);  // 6 != 2 x 2
}

TEST(Roles, TopNBreaksTiesToTheLowerIndexAndSkipsLayerZero) {
  // Layer 0 has the largest values but is not counted; gated ties at 0.7 go to index 3 then 5.
  const std::vector<double> ez = {0.99, 0.99, 0.3, 0.7, 0.1, 0.7, 0.7, 0.2};
  EXPECT_EQ(roles_top_n(ez, 4, 2, 0), (std::vector<uint8_t>{1, 1, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(roles_top_n(ez, 4, 2, 1), (std::vector<uint8_t>{1, 1, 0, 1, 0, 0, 0, 0}));
  EXPECT_EQ(roles_top_n(ez, 4, 2, 2), (std::vector<uint8_t>{1, 1, 0, 1, 0, 1, 0, 0}));
  EXPECT_EQ(roles_top_n(ez, 4, 2, 4), (std::vector<uint8_t>{1, 1, 1, 1, 0, 1, 1, 0}));
  EXPECT_EQ(roles_top_n(ez, 4, 2, 6), std::vector<uint8_t>(8, 1));
  EXPECT_EQ(error_code_of([&] { roles_top_n(ez, 4, 2, 7); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_code_of([&] { roles_top_n(ez, 4, 2, -1); }), ErrorCode::kInvalidArgument);
  const std::vector<double> nan_ez = {1, 1, NAN, 0.2};
  try {
    roles_top_n(nan_ez, 2, 2, 1);
    FAIL() << "no error for a NaN E[z]";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[layer 1][kv head 0] is nan"), std::string::npos) << e.what();
  }
}

TEST(GateKindNames, RoundTripAndNameTheBadValue) {
  for (GateKind k : {GateKind::kHardKuma, GateKind::kHardConcrete, GateKind::kDirect})
    EXPECT_EQ(parse_gate_kind(gate_kind_name(k)), k);
  try {
    parse_gate_kind("HardKuma");
    FAIL() << "no error for 'HardKuma'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'HardKuma'"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- AdamW, schedule, λ

TEST(AdamW, TwoStepsByHand) {
  AdamW adam(3);
  std::vector<double> p = {0.5, -1.0, 2.0};
  adam.step(p, std::vector<double>{0.1, -0.2, 0.0}, 0.01);
  // Step 1: m̂ = g, v̂ = g², so p −= lr·g/(|g| + eps): 0.5 − 0.01·0.1/(0.1 + 1e-8); a zero gradient moves nothing.
  EXPECT_NEAR(p[0], 0.4900000009999999, 1e-15);
  EXPECT_NEAR(p[1], -0.9900000004999999, 1e-15);
  EXPECT_EQ(p[2], 2.0);
  adam.step(p, std::vector<double>{-0.3, 0.05, 1e-3}, 0.01);
  // Step 2, p[0]: m = 0.9·0.01 − 0.03 = −0.021, v = 0.999·1e-5 + 0.001·0.09 = 9.999e-5;
  // m̂ = −0.021/0.19, v̂ = 9.999e-5/0.001999; p = 0.490000001 − 0.01·m̂/(√v̂ + 1e-8).
  EXPECT_NEAR(p[0], 0.49494189911200653, 1e-14);
  EXPECT_NEAR(p[1], -0.9853053191100446, 1e-14);
  EXPECT_NEAR(p[2], 1.992558736973369, 1e-14);
  EXPECT_EQ(adam.n_steps(), 2);
}

TEST(AdamW, WeightDecayIsDecoupled) {
  AdamWOptions o;
  o.weight_decay = 0.1;
  AdamW adam(2, o);
  std::vector<double> p = {3.0, -2.0};
  // With a zero gradient the Adam part is 0: p shrinks by exactly lr·wd. (L2 folded into the
  // gradient would move each by about lr instead.)
  adam.step(p, std::vector<double>{0.0, 0.0}, 0.05);
  EXPECT_DOUBLE_EQ(p[0], 3.0 * (1.0 - 0.05 * 0.1));
  EXPECT_DOUBLE_EQ(p[1], -2.0 * (1.0 - 0.05 * 0.1));
  AdamW adam2(1, o);
  std::vector<double> q = {3.0};
  adam2.step(q, std::vector<double>{0.2}, 0.05);
  EXPECT_NEAR(q[0], 3.0 * (1.0 - 0.005) - 0.05 * 0.2 / (0.2 + 1e-8), 1e-15);
}

TEST(AdamW, StateRoundTripResumesBitExactly) {
  std::mt19937_64 rng(9);
  std::normal_distribution<double> nd;
  std::vector<std::vector<double>> grads(6, std::vector<double>(5));
  for (auto& g : grads)
    for (double& x : g) x = nd(rng);
  AdamW straight(5);
  std::vector<double> p1(5, 0.3), p2(5, 0.3);
  for (const auto& g : grads) straight.step(p1, g, 0.01);
  AdamW first(5);
  for (int s = 0; s < 3; ++s) first.step(p2, grads[s], 0.01);
  const nlohmann::json saved = nlohmann::json::parse(first.to_json().dump());  // through text
  AdamW resumed(5);
  resumed.load_json(saved, "ckpt.json");
  EXPECT_EQ(resumed.n_steps(), 3);
  for (int s = 3; s < 6; ++s) resumed.step(p2, grads[s], 0.01);
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(resumed.to_json(), straight.to_json());
}

TEST(AdamW, LoadStateNamesTheBadField) {
  AdamW adam(2);
  nlohmann::json s = adam.to_json();
  s["m"] = {0.0, 0.0, 0.0};
  try {
    adam.load_json(s, "ckpt.json");
    FAIL() << "no error for a 3-entry m";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidFile);
    EXPECT_NE(std::string(e.what()).find("ckpt.json: optimizer.m has 3 entries"), std::string::npos) << e.what();
  }
  nlohmann::json t = adam.to_json();
  t["lr"] = 0.1;
  EXPECT_EQ(error_code_of([&] { adam.load_json(t, "c"); }), ErrorCode::kInvalidFile);
  nlohmann::json u = adam.to_json();
  u["v"] = {1.0, -1.0};
  EXPECT_EQ(error_code_of([&] { adam.load_json(u, "c"); }), ErrorCode::kInvalidFile);
  std::vector<double> p(2);
  EXPECT_EQ(error_code_of([&] { adam.step(p, std::vector<double>{0.0, NAN}, 0.1); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(adam.n_steps(), 0);
}

TEST(LrFactor, AuthorsScheduleAtKeySteps) {
  const int64_t n = 3000;  // ramps of N/5 = 600 steps
  EXPECT_DOUBLE_EQ(lr_factor(0, n), 0.1);     // 1/600 floored
  EXPECT_DOUBLE_EQ(lr_factor(59, n), 0.1);    // 60/600
  EXPECT_DOUBLE_EQ(lr_factor(60, n), 61.0 / 600.0);
  EXPECT_DOUBLE_EQ(lr_factor(299, n), 0.5);
  EXPECT_DOUBLE_EQ(lr_factor(599, n), 1.0);
  EXPECT_DOUBLE_EQ(lr_factor(1500, n), 1.0);
  EXPECT_DOUBLE_EQ(lr_factor(2400, n), 1.0);  // 600/600
  EXPECT_DOUBLE_EQ(lr_factor(2401, n), 599.0 / 600.0);
  EXPECT_DOUBLE_EQ(lr_factor(2939, n), 61.0 / 600.0);
  EXPECT_DOUBLE_EQ(lr_factor(2999, n), 0.1);  // 1/600 floored
  EXPECT_DOUBLE_EQ(lr_factor(0, n, 0.0, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(lr_factor(0, 10, 0.5, 0.2, 0.0), 0.2);  // (0+1)/5
  EXPECT_EQ(error_code_of([&] { lr_factor(3000, n); }), ErrorCode::kInvalidArgument);
}

TEST(Lagrangian, GradientAscentClippedAtZero) {
  Lagrangian l{0.5, 0.1};
  l.update(2.0);  // over budget by 2 heads
  EXPECT_DOUBLE_EQ(l.lambda, 0.7);
  l.update(-3.0);  // under budget: shrinks
  EXPECT_NEAR(l.lambda, 0.4, 1e-15);
  l.update(-10.0);
  EXPECT_EQ(l.lambda, 0.0);  // clipped, not −0.6
  l.update(-1.0);
  EXPECT_EQ(l.lambda, 0.0);
  l.update(3.0);
  EXPECT_NEAR(l.lambda, 0.3, 1e-15);
}

}  // namespace
}  // namespace lychee::train
