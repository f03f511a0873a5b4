// Head gates of the head-role trainer (docs/trainer.md): one gate z ∈ [0, 1] per (layer ≥ 1,
// KV head) that mixes dense and sparse attention in the student pass. Layer 0 has no gate and
// always reads z = 1. Three kinds behind one interface: the method's HardKuma gates, and the
// HardConcrete and direct-optimisation gates of the paper's ablation. GateSet samples z, passes
// dloss/dz back to its parameters, and gives the sparsity penalty and the per-gate statistics
// (E[z], P(z > 0), P(z = 1)) that the role decision reads.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace lychee::train {

enum class GateKind {
  kHardKuma,      // the method: z = clamp(p + (q − p)·X, 0, 1), X ~ Kumaraswamy(α, β)
  kHardConcrete,  // ablation (Louizos et al. 2018): z = clamp(γ + (ζ − γ)·S, 0, 1), S ~ BinConcrete(a, τ)
  kDirect,        // ablation (DuoAttention): z = g, one plain parameter in [0, 1] per gate, no noise
};

const char* gate_kind_name(GateKind kind);               // "hardkuma", "hardconcrete", "direct"
GateKind parse_gate_kind(const std::string& name);       // Error(kInvalidArgument) if unknown

struct GateOptions {
  // Stretch interval of both hard kinds: (p, q) for HardKuma, (γ, ζ) for HardConcrete; p < 0 < 1 < q.
  // With the defaults z = 0 below x = −p/(q − p) = 1/12 and z = 1 above (1 − p)/(q − p) = 11/12.
  double stretch_low = -0.1;
  double stretch_high = 1.1;
  // HardKuma init. Kuma(1, 1) is U(0, 1): E[z] = 0.5, P(z = 0) = P(z = 1) = 1/12 (the paper's init).
  double init_alpha = 1.0;
  double init_beta = 1.0;
  // HardConcrete temperature τ (Louizos et al.'s β = 2/3) and init of log a. log a = 0 is the
  // symmetric start like Kuma(1, 1): E[z] = 0.5, P(z = 0) = P(z = 1), but P(z > 0) = 0.832
  // rather than 11/12; log a = (1 − τ)·ln 11 ≈ 0.799 would match HardKuma's P(z > 0) instead.
  double temperature = 2.0 / 3.0;
  double init_log_a = 0.0;
  // Direct init: 1 = every head dense at the start, as DuoAttention initialises its gates.
  double init_gate = 1.0;
  // Noise u ~ U(0, 1) is clamped into [u_clamp, 1 − u_clamp] so the transforms stay finite.
  double u_clamp = 1e-6;
  void validate() const;  // Error(kInvalidArgument) naming the bad field
};

// ------------------------------------------------------------------ per-gate formulas
// Pure functions, so tests can check each against Monte Carlo and finite differences.

// One gate's value for noise u and its derivatives with respect to the gate's parameters
// (HardKuma: d/dlog α, d/dlog β; HardConcrete: d/dlog a, 0). Zero where z is clamped to 0 or 1.
struct GateDraw {
  double z = 0.0;
  double dz[2] = {0.0, 0.0};
};
// x = (1 − (1 − u)^(1/β))^(1/α) (the Kumaraswamy inverse CDF), z = clamp(p + (q − p)·x, 0, 1).
GateDraw hardkuma_draw(double log_alpha, double log_beta, double u, double p, double q);
// s = sigmoid((ln u − ln(1 − u) + log a)/τ), z = clamp(p + (q − p)·s, 0, 1).
GateDraw hardconcrete_draw(double log_a, double temperature, double u, double p, double q);

// P(X > x) of the unstretched variable: Kumaraswamy (1 − x^α)^β; binary concrete
// sigmoid(log a − τ·logit(x)). Then P(z > 0) = tail(−p/(q − p)), P(z = 1) = tail((1 − p)/(q − p)).
double kuma_tail(double alpha, double beta, double x);
double concrete_tail(double log_a, double temperature, double x);

// E[z] = ∫₀¹ P(z > t) dt = (q − p) ∫_{x0}^{x1} tail(x) dx with x0 = −p/(q − p), x1 = (1 − p)/(q − p):
// the mean of the rectified, stretched gate, point mass at 1 included. The integral is by
// adaptive Simpson (32 starting panels, Richardson-corrected, absolute tolerance 1e-11 over the
// interval); the tail is smooth and monotone on [x0, x1]. Measured absolute error: below 2e-13
// against 30-digit quadrature (mpmath) for log α, log β ∈ [−5, 5] and log a ∈ [−6, 6]; the tests
// hold it to 1e-12 of closed forms (α = 1 or β = 1) and to 1e-9 of a 10⁶-point midpoint rule at
// extreme shapes. About 0.04 ms per gate.
double hardkuma_expected_z(double alpha, double beta, double p, double q);
double hardconcrete_expected_z(double log_a, double temperature, double p, double q);

// ------------------------------------------------------------------ the gate set

// Everything per head that a head-role file or a log may record, [n_layers · n_kv_heads] each,
// layer 0 = 1; a field the kind does not have is empty (see GateSet::alpha() and the others).
struct GateReport {
  std::vector<double> expected_z, prob_nonzero, prob_one;
  std::vector<double> alpha, beta;  // kHardKuma
  std::vector<double> log_a;        // kHardConcrete
  std::vector<double> gate;         // kDirect
};

// Layouts. Gate values z, dloss/dz, expected_z(), prob_*(), alpha(), ...: [n_layers, n_kv_heads]
// f32/f64, index layer · n_kv_heads + kv_head, layer 0 = 1 (its dz is ignored). Gates and noise:
// [n_gates] with gate g = (layer − 1) · n_kv_heads + kv_head for layer ≥ 1, so gate g is entry
// g + n_kv_heads of the full layout. Parameters (params(), gradients), flat f64:
//   kHardKuma      [2, n_gates]: log α of every gate, then log β of every gate
//   kHardConcrete  [n_gates]:    log a
//   kDirect        [n_gates]:    g (kept in [0, 1] by project())
class GateSet {
 public:
  GateSet(GateKind kind, int n_layers, int n_kv_heads, const GateOptions& options = {});

  GateKind kind() const { return kind_; }
  const GateOptions& options() const { return options_; }
  int n_layers() const { return n_layers_; }
  int n_kv_heads() const { return n_kv_heads_; }
  int n_gates() const { return (n_layers_ - 1) * n_kv_heads_; }
  int n_params() const { return int(params_.size()); }
  std::span<double> params() { return params_; }  // for the optimiser and checkpoints
  std::span<const double> params() const { return params_; }

  // Draws one gate value per gate (u from rng's raw 64-bit output, the same on every platform;
  // kDirect draws nothing) and keeps dz/dparams of this sample for backward(). z: [n_layers ·
  // n_kv_heads], layer 0 written as 1.
  void sample(std::mt19937_64& rng, std::span<float> z);
  // The same with given noise u: [n_gates] in (0, 1), clamped like sample()'s; kDirect ignores it.
  void sample_with_u(std::span<const double> u, std::span<float> z);
  void sample_with_u(std::span<const double> u, std::span<double> z);  // f64 z, for tests
  // ADDS dloss/dparams of the last sample to grad [n_params] given dz = dloss/dz [n_layers ·
  // n_kv_heads] (layer 0 ignored). Uses the derivatives taken at sample time, so a parameter
  // update between sample() and backward() does not change the result.
  void backward(std::span<const float> dz, std::span<double> grad) const;

  // The sparsity penalty: E‖z‖₀ = Σ_gates P(z > 0) for the hard kinds (closed form), L1 = Σ g
  // for kDirect. Layer 0 is not counted.
  double penalty() const;
  // ADDS scale · dpenalty/dparams to grad [n_params] (scale = λ in the Lagrangian).
  void penalty_grad(double scale, std::span<double> grad) const;

  // Per head [n_layers · n_kv_heads], layer 0 = 1. kDirect: E[z] = g, P(z > 0) = [g > 0],
  // P(z = 1) = [g ≥ 1] (z is deterministic).
  std::vector<double> expected_z() const;
  std::vector<double> prob_nonzero() const;
  std::vector<double> prob_one() const;

  // After each optimiser step: clamps kDirect's g into [0, 1]; no-op for the hard kinds (their
  // log-parameters are unconstrained).
  void project();

  // Parameters per head for the head-role file ([n_layers · n_kv_heads], layer 0 = 1), or empty
  // when the kind has none of that name: alpha()/beta() = exp(log α), exp(log β) (kHardKuma,
  // gates.alpha/beta); gate() = g (kDirect, gates.gate); log_a() (kHardConcrete; the file has
  // no field for it, so the trainer keeps only expected_z).
  std::vector<double> alpha() const;
  std::vector<double> beta() const;
  std::vector<double> log_a() const;
  std::vector<double> gate() const;
  GateReport report() const;  // all of the above in one struct

  // How expected_z() is computed, in one line, for the head-role file's provenance.
  std::string expected_z_method() const;

 private:
  void draw(std::span<const double> u);  // fills z_ and dz_dparam_ from noise u [n_gates]
  std::vector<double> per_head(std::span<const double> per_gate) const;  // layer 0 = 1
  void check_full(size_t size, const char* what) const;

  GateKind kind_;
  GateOptions options_;
  int n_layers_ = 0;
  int n_kv_heads_ = 0;
  std::vector<double> params_;    // [n_params], layout above
  std::vector<double> u_;         // [n_gates] scratch noise
  std::vector<double> z_;         // [n_gates] last sample
  std::vector<double> dz_dparam_; // [n_gates, 2] of the last sample
  bool sampled_ = false;
};

// ------------------------------------------------------------------ role decisions
// Both take per-head values [n_layers · n_kv_heads] (expected_z()) and return roles of the same
// layout, 1 = retrieval; layer 0 is always 1 whatever its value. Error(kInvalidArgument) on a
// size that is not n_layers · n_kv_heads or a non-finite value (named by layer and head).

// The paper's rule: retrieval iff E[z] > threshold (strictly).
std::vector<uint8_t> roles_threshold(std::span<const double> expected_z, int n_layers, int n_kv_heads,
                                     double threshold = 0.5);
// Exactly n_retrieval gated heads (layers ≥ 1) with the largest E[z], ties to the lower index,
// plus layer 0. Error(kInvalidArgument) unless 0 ≤ n_retrieval ≤ (n_layers − 1) · n_kv_heads.
std::vector<uint8_t> roles_top_n(std::span<const double> expected_z, int n_layers, int n_kv_heads,
                                 int n_retrieval);

}  // namespace lychee::train
