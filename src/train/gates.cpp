#include "train/gates.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace lychee::train {

const char* gate_kind_name(GateKind kind) {
  switch (kind) {
    case GateKind::kHardKuma: return "hardkuma";
    case GateKind::kHardConcrete: return "hardconcrete";
    case GateKind::kDirect: return "direct";
  }
  return "?";
}

GateKind parse_gate_kind(const std::string& name) {
  if (name == "hardkuma") return GateKind::kHardKuma;
  if (name == "hardconcrete") return GateKind::kHardConcrete;
  if (name == "direct") return GateKind::kDirect;
  fail(ErrorCode::kInvalidArgument, "unknown gate kind '{}' (hardkuma, hardconcrete, direct)", name);
}

void GateOptions::validate() const {
  const auto positive = [](double x) { return std::isfinite(x) && x > 0.0; };
  LY_CHECK(std::isfinite(stretch_low) && stretch_low < 0.0, ErrorCode::kInvalidArgument,
           "gate stretch_low must be < 0, got {}", stretch_low);
  LY_CHECK(std::isfinite(stretch_high) && stretch_high > 1.0, ErrorCode::kInvalidArgument,
           "gate stretch_high must be > 1, got {}", stretch_high);
  LY_CHECK(positive(init_alpha), ErrorCode::kInvalidArgument, "gate init_alpha must be > 0, got {}", init_alpha);
  LY_CHECK(positive(init_beta), ErrorCode::kInvalidArgument, "gate init_beta must be > 0, got {}", init_beta);
  LY_CHECK(positive(temperature), ErrorCode::kInvalidArgument, "gate temperature must be > 0, got {}", temperature);
  LY_CHECK(std::isfinite(init_log_a), ErrorCode::kInvalidArgument, "gate init_log_a must be finite, got {}", init_log_a);
  LY_CHECK(init_gate >= 0.0 && init_gate <= 1.0, ErrorCode::kInvalidArgument,
           "gate init_gate must be in [0, 1], got {}", init_gate);
  LY_CHECK(u_clamp > 0.0 && u_clamp < 0.5, ErrorCode::kInvalidArgument,
           "gate u_clamp must be in (0, 0.5), got {}", u_clamp);
}

// ------------------------------------------------------------------ per-gate formulas

namespace {

double sigmoid(double y) {
  if (y >= 0.0) return 1.0 / (1.0 + std::exp(-y));
  const double e = std::exp(y);
  return e / (1.0 + e);
}

// Rectifies the stretched value t = p + (q − p)·x; dt_dparam holds dt/dparam and is zeroed
// where z is clamped (the hard-sigmoid passes no gradient there).
GateDraw rectify(double t, double dt0, double dt1) {
  GateDraw d;
  if (t <= 0.0) return d;
  if (t >= 1.0) {
    d.z = 1.0;
    return d;
  }
  d.z = t;
  d.dz[0] = dt0;
  d.dz[1] = dt1;
  return d;
}

// Adaptive Simpson on one panel. A panel is accepted when the two halves agree with the whole
// to 15·tol_per_x·width (Simpson's error estimate); tol_per_x is absolute error per unit length,
// kept well above rounding (the integrands lie in [0, 1]) so the recursion ends. evals caps the
// work for pathological shapes.
template <class F>
double simpson_panel(const F& f, double a, double b, double fa, double fm, double fb, double whole,
                     double tol_per_x, int depth, int& evals) {
  const double m = 0.5 * (a + b), lm = 0.5 * (a + m), rm = 0.5 * (m + b);
  const double flm = f(lm), frm = f(rm);
  evals += 2;
  const double left = (m - a) / 6.0 * (fa + 4.0 * flm + fm);
  const double right = (b - m) / 6.0 * (fm + 4.0 * frm + fb);
  const double delta = left + right - whole;
  if (depth == 0 || evals > 400000 || std::abs(delta) <= 15.0 * tol_per_x * (b - a))
    return left + right + delta / 15.0;
  return simpson_panel(f, a, m, fa, flm, fm, left, tol_per_x, depth - 1, evals) +
         simpson_panel(f, m, b, fm, frm, fb, right, tol_per_x, depth - 1, evals);
}

// ∫_a^b f with an absolute tolerance of about tol in total.
template <class F>
double integrate(const F& f, double a, double b, double tol) {
  constexpr int kPanels = 32;
  const double tol_per_x = tol / (b - a);
  const double h = (b - a) / kPanels;
  int evals = 0;
  double sum = 0.0;
  for (int i = 0; i < kPanels; ++i) {
    const double lo = a + i * h, hi = i + 1 == kPanels ? b : a + (i + 1) * h, mid = 0.5 * (lo + hi);
    const double flo = f(lo), fmid = f(mid), fhi = f(hi);
    const double whole = (hi - lo) / 6.0 * (flo + 4.0 * fmid + fhi);
    sum += simpson_panel(f, lo, hi, flo, fmid, fhi, whole, tol_per_x, 30, evals);
  }
  return sum;
}

// E[z] = (q − p) ∫_{x0}^{x1} tail(x) dx (see the header).
template <class Tail>
double stretched_mean(const Tail& tail, double p, double q) {
  const double x0 = -p / (q - p), x1 = (1.0 - p) / (q - p);
  return (q - p) * integrate(tail, x0, x1, 1e-11);
}

}  // namespace

GateDraw hardkuma_draw(double log_alpha, double log_beta, double u, double p, double q) {
  const double a = std::exp(log_alpha), b = std::exp(log_beta);
  const double log_1mu = std::log1p(-u);     // ln(1 − u) < 0
  const double w = std::exp(log_1mu / b);    // (1 − u)^(1/β)
  const double v = -std::expm1(log_1mu / b); // 1 − w, without the cancellation near w = 1
  const double x = std::exp(std::log(v) / a);
  const double t = p + (q - p) * x;
  if (t <= 0.0 || t >= 1.0) return rectify(t, 0.0, 0.0);  // also covers v = 0 (log v = −inf)
  // dx/dlog α = −x·ln v / α; dv/dlog β = w·ln(1 − u)/β and dx/dv = x/(α·v).
  const double dx_dlog_alpha = -x * std::log(v) / a;
  const double dx_dlog_beta = x * w * log_1mu / (a * b * v);
  return rectify(t, (q - p) * dx_dlog_alpha, (q - p) * dx_dlog_beta);
}

GateDraw hardconcrete_draw(double log_a, double temperature, double u, double p, double q) {
  const double logit_u = std::log(u) - std::log1p(-u);
  const double s = sigmoid((logit_u + log_a) / temperature);
  const double t = p + (q - p) * s;
  return rectify(t, (q - p) * s * (1.0 - s) / temperature, 0.0);
}

double kuma_tail(double alpha, double beta, double x) {
  if (x <= 0.0) return 1.0;
  if (x >= 1.0) return 0.0;
  // (1 − x^α)^β with 1 − x^α = −expm1(α·ln x), accurate when x^α is close to 1 (small α).
  return std::exp(beta * std::log(-std::expm1(alpha * std::log(x))));
}

double concrete_tail(double log_a, double temperature, double x) {
  if (x <= 0.0) return 1.0;
  if (x >= 1.0) return 0.0;
  // P(S > x) = P(logit u > τ·logit x − log a) = sigmoid(log a − τ·logit x).
  return sigmoid(log_a - temperature * (std::log(x) - std::log1p(-x)));
}

double hardkuma_expected_z(double alpha, double beta, double p, double q) {
  return stretched_mean([&](double x) { return kuma_tail(alpha, beta, x); }, p, q);
}

double hardconcrete_expected_z(double log_a, double temperature, double p, double q) {
  return stretched_mean([&](double x) { return concrete_tail(log_a, temperature, x); }, p, q);
}

// ------------------------------------------------------------------ GateSet

GateSet::GateSet(GateKind kind, int n_layers, int n_kv_heads, const GateOptions& options)
    : kind_(kind), options_(options), n_layers_(n_layers), n_kv_heads_(n_kv_heads) {
  LY_CHECK(n_layers >= 1 && n_kv_heads >= 1, ErrorCode::kInvalidArgument,
           "gate set needs n_layers >= 1 and n_kv_heads >= 1, got {} x {}", n_layers, n_kv_heads);
  options_.validate();
  const size_t g = size_t(n_gates());
  switch (kind_) {
    case GateKind::kHardKuma:
      params_.assign(g, std::log(options_.init_alpha));
      params_.resize(2 * g, std::log(options_.init_beta));
      break;
    case GateKind::kHardConcrete: params_.assign(g, options_.init_log_a); break;
    case GateKind::kDirect: params_.assign(g, options_.init_gate); break;
  }
  u_.assign(g, 0.5);
  z_.assign(g, 0.0);
  dz_dparam_.assign(2 * g, 0.0);
}

void GateSet::check_full(size_t size, const char* what) const {
  const size_t want = size_t(n_layers_) * size_t(n_kv_heads_);
  LY_CHECK(size == want, ErrorCode::kInvalidArgument, "gate set: {} has {} entries, expected n_layers * n_kv_heads = {}",
           what, size, want);
}

void GateSet::draw(std::span<const double> u) {
  const int g_n = n_gates();
  if (kind_ == GateKind::kDirect) {
    // Deterministic: z = g, dz/dg = 1. g is kept in [0, 1] by project().
    for (int g = 0; g < g_n; ++g) {
      z_[g] = params_[g];
      dz_dparam_[2 * g] = 1.0;
      dz_dparam_[2 * g + 1] = 0.0;
    }
    sampled_ = true;
    return;
  }
  LY_CHECK(u.size() == size_t(g_n), ErrorCode::kInvalidArgument, "gate set: u has {} entries, expected n_gates = {}",
           u.size(), g_n);
  const double p = options_.stretch_low, q = options_.stretch_high, eps = options_.u_clamp;
  for (int g = 0; g < g_n; ++g) {
    LY_CHECK(u[g] >= 0.0 && u[g] <= 1.0, ErrorCode::kInvalidArgument, "gate set: u[{}] = {} is outside [0, 1]", g, u[g]);
    const double ug = std::clamp(u[g], eps, 1.0 - eps);
    const GateDraw d = kind_ == GateKind::kHardKuma
                           ? hardkuma_draw(params_[g], params_[g_n + g], ug, p, q)
                           : hardconcrete_draw(params_[g], options_.temperature, ug, p, q);
    z_[g] = d.z;
    dz_dparam_[2 * g] = d.dz[0];
    dz_dparam_[2 * g + 1] = d.dz[1];
  }
  sampled_ = true;
}

void GateSet::sample(std::mt19937_64& rng, std::span<float> z) {
  if (kind_ != GateKind::kDirect) {
    // The top 53 bits, centred in their cell: u ∈ (0, 1), the same sequence on every platform
    // (std::uniform_real_distribution's algorithm is left to the library).
    for (double& u : u_) u = (double(rng() >> 11) + 0.5) * 0x1.0p-53;
  }
  sample_with_u(u_, z);
}

void GateSet::sample_with_u(std::span<const double> u, std::span<float> z) {
  check_full(z.size(), "z");
  draw(u);
  std::fill(z.begin(), z.begin() + n_kv_heads_, 1.0f);
  for (int g = 0; g < n_gates(); ++g) z[size_t(g + n_kv_heads_)] = float(z_[g]);
}

void GateSet::sample_with_u(std::span<const double> u, std::span<double> z) {
  check_full(z.size(), "z");
  draw(u);
  std::fill(z.begin(), z.begin() + n_kv_heads_, 1.0);
  std::copy(z_.begin(), z_.end(), z.begin() + n_kv_heads_);
}

void GateSet::backward(std::span<const float> dz, std::span<double> grad) const {
  check_full(dz.size(), "dz");
  LY_CHECK(grad.size() == params_.size(), ErrorCode::kInvalidArgument, "gate set: grad has {} entries, expected n_params = {}",
           grad.size(), params_.size());
  LY_CHECK(sampled_, ErrorCode::kInvalidArgument, "gate set: backward() before any sample()");
  const int g_n = n_gates();
  for (int g = 0; g < g_n; ++g) {
    const double d = dz[size_t(g + n_kv_heads_)];
    grad[g] += d * dz_dparam_[2 * g];
    if (kind_ == GateKind::kHardKuma) grad[g_n + g] += d * dz_dparam_[2 * g + 1];
  }
}

double GateSet::penalty() const {
  if (kind_ == GateKind::kDirect) return std::accumulate(params_.begin(), params_.end(), 0.0);
  const std::vector<double> p0 = prob_nonzero();
  return std::accumulate(p0.begin() + n_kv_heads_, p0.end(), 0.0);
}

void GateSet::penalty_grad(double scale, std::span<double> grad) const {
  LY_CHECK(grad.size() == params_.size(), ErrorCode::kInvalidArgument, "gate set: grad has {} entries, expected n_params = {}",
           grad.size(), params_.size());
  const int g_n = n_gates();
  const double x0 = -options_.stretch_low / (options_.stretch_high - options_.stretch_low);
  for (int g = 0; g < g_n; ++g) {
    switch (kind_) {
      case GateKind::kHardKuma: {
        // P = (1 − x0^α)^β = exp(β·L), L = ln m, m = 1 − x0^α.
        // dP/dlog β = β·P·L; dP/dlog α = β·P·dL/dlog α = β·P·(−α·ln x0)·(1 − m)/m.
        const double a = std::exp(params_[g]), b = std::exp(params_[g_n + g]);
        const double m = -std::expm1(a * std::log(x0));
        const double prob = std::exp(b * std::log(m));
        if (prob == 0.0) break;  // underflow: both derivatives are 0 too
        grad[g] += scale * b * prob * (-a * std::log(x0)) * (1.0 - m) / m;
        grad[g_n + g] += scale * b * prob * std::log(m);
        break;
      }
      case GateKind::kHardConcrete: {
        const double prob = concrete_tail(params_[g], options_.temperature, x0);
        grad[g] += scale * prob * (1.0 - prob);
        break;
      }
      case GateKind::kDirect: grad[g] += scale; break;
    }
  }
}

std::vector<double> GateSet::per_head(std::span<const double> per_gate) const {
  std::vector<double> out(size_t(n_layers_) * size_t(n_kv_heads_), 1.0);
  std::copy(per_gate.begin(), per_gate.end(), out.begin() + n_kv_heads_);
  return out;
}

std::vector<double> GateSet::expected_z() const {
  const int g_n = n_gates();
  const double p = options_.stretch_low, q = options_.stretch_high;
  std::vector<double> e(static_cast<size_t>(g_n));
  for (int g = 0; g < g_n; ++g) {
    switch (kind_) {
      case GateKind::kHardKuma:
        e[g] = hardkuma_expected_z(std::exp(params_[g]), std::exp(params_[g_n + g]), p, q);
        break;
      case GateKind::kHardConcrete: e[g] = hardconcrete_expected_z(params_[g], options_.temperature, p, q); break;
      case GateKind::kDirect: e[g] = params_[g]; break;
    }
  }
  return per_head(e);
}

namespace {

// P(z > 0) (at_one = false) or P(z = 1) (at_one = true) of every gate.
std::vector<double> gate_probs(GateKind kind, std::span<const double> params, int n_gates, const GateOptions& o,
                               bool at_one) {
  const double p = o.stretch_low, q = o.stretch_high;
  const double x = at_one ? (1.0 - p) / (q - p) : -p / (q - p);
  std::vector<double> out(static_cast<size_t>(n_gates));
  for (int g = 0; g < n_gates; ++g) {
    switch (kind) {
      case GateKind::kHardKuma:
        out[g] = kuma_tail(std::exp(params[g]), std::exp(params[n_gates + g]), x);
        break;
      case GateKind::kHardConcrete: out[g] = concrete_tail(params[g], o.temperature, x); break;
      case GateKind::kDirect: out[g] = at_one ? double(params[g] >= 1.0) : double(params[g] > 0.0); break;
    }
  }
  return out;
}

}  // namespace

std::vector<double> GateSet::prob_nonzero() const {
  return per_head(gate_probs(kind_, params_, n_gates(), options_, false));
}

std::vector<double> GateSet::prob_one() const {
  return per_head(gate_probs(kind_, params_, n_gates(), options_, true));
}

void GateSet::project() {
  if (kind_ != GateKind::kDirect) return;
  for (double& g : params_) g = std::clamp(g, 0.0, 1.0);
}

std::vector<double> GateSet::alpha() const {
  if (kind_ != GateKind::kHardKuma) return {};
  std::vector<double> a(params_.begin(), params_.begin() + n_gates());
  for (double& x : a) x = std::exp(x);
  return per_head(a);
}

std::vector<double> GateSet::beta() const {
  if (kind_ != GateKind::kHardKuma) return {};
  std::vector<double> b(params_.begin() + n_gates(), params_.end());
  for (double& x : b) x = std::exp(x);
  return per_head(b);
}

std::vector<double> GateSet::log_a() const {
  if (kind_ != GateKind::kHardConcrete) return {};
  return per_head(params_);
}

std::vector<double> GateSet::gate() const {
  if (kind_ != GateKind::kDirect) return {};
  return per_head(params_);
}

GateReport GateSet::report() const {
  GateReport r;
  r.expected_z = expected_z();
  r.prob_nonzero = prob_nonzero();
  r.prob_one = prob_one();
  r.alpha = alpha();
  r.beta = beta();
  r.log_a = log_a();
  r.gate = gate();
  return r;
}

std::string GateSet::expected_z_method() const {
  if (kind_ == GateKind::kDirect) return "E[z] = g (deterministic gate)";
  const double p = options_.stretch_low, q = options_.stretch_high;
  return fmt::format("E[z] = (q-p) * integral of P(X > x) over [{:.6g}, {:.6g}] (stretch p={}, q={}), "
                     "adaptive Simpson, abs. error < 1e-12",
                     -p / (q - p), (1.0 - p) / (q - p), p, q);
}

// ------------------------------------------------------------------ role decisions

namespace {

void check_role_input(std::span<const double> values, int n_layers, int n_kv_heads, const char* who) {
  LY_CHECK(n_layers >= 1 && n_kv_heads >= 1 && values.size() == size_t(n_layers) * size_t(n_kv_heads),
           ErrorCode::kInvalidArgument, "{}: {} values, expected n_layers * n_kv_heads = {} x {}", who, values.size(),
           n_layers, n_kv_heads);
  for (size_t i = 0; i < values.size(); ++i)
    LY_CHECK(std::isfinite(values[i]), ErrorCode::kInvalidArgument, "{}: value [layer {}][kv head {}] is {}", who,
             i / size_t(n_kv_heads), i % size_t(n_kv_heads), values[i]);
}

}  // namespace

std::vector<uint8_t> roles_threshold(std::span<const double> expected_z, int n_layers, int n_kv_heads,
                                     double threshold) {
  check_role_input(expected_z, n_layers, n_kv_heads, "roles_threshold");
  std::vector<uint8_t> roles(expected_z.size(), 1);
  for (size_t i = size_t(n_kv_heads); i < roles.size(); ++i) roles[i] = expected_z[i] > threshold ? 1 : 0;
  return roles;
}

std::vector<uint8_t> roles_top_n(std::span<const double> expected_z, int n_layers, int n_kv_heads,
                                 int n_retrieval) {
  check_role_input(expected_z, n_layers, n_kv_heads, "roles_top_n");
  const int n_gated = int(expected_z.size()) - n_kv_heads;
  LY_CHECK(n_retrieval >= 0 && n_retrieval <= n_gated, ErrorCode::kInvalidArgument,
           "roles_top_n: n_retrieval must be in [0, {}] (the gated heads of layers >= 1), got {}", n_gated,
           n_retrieval);
  std::vector<int> order(static_cast<size_t>(n_gated));
  std::iota(order.begin(), order.end(), n_kv_heads);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return expected_z[a] > expected_z[b]; });
  std::vector<uint8_t> roles(expected_z.size(), 0);
  std::fill(roles.begin(), roles.begin() + n_kv_heads, 1);
  for (int i = 0; i < n_retrieval; ++i) roles[size_t(order[i])] = 1;
  return roles;
}

}  // namespace lychee::train
