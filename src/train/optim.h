// Optimisation pieces of the head-role trainer (docs/trainer.md): AdamW over the flat gate
// parameters (GateSet::params()), the authors' warm-up/constant/decay learning-rate factor, and
// the Lagrange multiplier of the budget constraint E‖z‖₀ − N_target.
//
// One step of the min-max problem min_params max_{λ ≥ 0} L_distill + λ·(E‖z‖₀ − N_target):
//   grad = dL_distill/dparams (GateSet::backward) + λ·dE‖z‖₀/dparams (GateSet::penalty_grad(λ, grad));
//   adam.step(params, grad, lr · lr_factor(step, n_steps)); gates.project();
//   lagrangian.update(E‖z‖₀ − N_target)   (the constraint at the parameters the step started from).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace lychee::train {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // decoupled: p ← p·(1 − lr·weight_decay) before the Adam update
  void validate() const;      // Error(kInvalidArgument) naming the bad field
};

// AdamW (Loshchilov & Hutter) as PyTorch's torch.optim.AdamW computes it, in f64. Per step t
// (1-based) and parameter i:
//   p ← p·(1 − lr·wd);  m ← β1·m + (1 − β1)·g;  v ← β2·v + (1 − β2)·g²;
//   p ← p − lr·(m/(1 − β1^t)) / (√(v/(1 − β2^t)) + eps).
class AdamW {
 public:
  explicit AdamW(int n_params, const AdamWOptions& options = {});

  // One update of params [n_params] with grad [n_params] at learning rate lr (already scaled by
  // the schedule). Error(kInvalidArgument) on a size mismatch or a non-finite gradient entry
  // (named by index), before anything is changed.
  void step(std::span<double> params, std::span<const double> grad, double lr);

  int n_params() const { return int(m_.size()); }
  int64_t n_steps() const { return step_; }  // updates done so far (t of the last update)
  const AdamWOptions& options() const { return options_; }

  // Checkpoint state {"step": t, "m": [n_params], "v": [n_params]}; doubles round-trip exactly.
  nlohmann::json to_json() const;
  // Restores to_json()'s state; Error(kInvalidFile) whose message begins with `source` (the
  // checkpoint's path) and names the field: missing or unknown keys, wrong sizes, negative step,
  // v < 0, non-finite values. Nothing changes unless the whole state is valid.
  void load_json(const nlohmann::json& state, std::string_view source = "optimizer state");

 private:
  AdamWOptions options_;
  std::vector<double> m_, v_;  // [n_params] first and second moments
  int64_t step_ = 0;
};

// The authors' LambdaLR factor for step s (0-based) of n_steps N:
//   min(1, max((s + 1)/(N·warmup_frac), floor), max((N − s)/(N·decay_frac), floor))
// i.e. linear warm-up over the first 20% (never below the floor), constant 1, then linear decay
// over the last 20% down to the floor. A zero fraction drops that ramp. For N = 3000: step 0 →
// 0.1, step 599 → 1, steps 599..2400 → 1, step 2999 → 0.1. Error(kInvalidArgument) for N < 1,
// s outside [0, N), fractions outside [0, 1] or a floor outside [0, 1].
double lr_factor(int64_t step, int64_t n_steps, double warmup_frac = 0.2, double decay_frac = 0.2,
                 double floor = 0.1);

// The Lagrange multiplier λ ≥ 0 of E‖z‖₀ − N_target, by projected gradient ascent:
// λ ← max(0, λ + lr·constraint), constraint = E‖z‖₀ − N_target. λ grows while the expected
// count is over the target and shrinks (to 0 at most) while it is under, so the count settles at
// the target from either side. The authors' code differs: a multiplicative, one-sided update on
// the moving average of relu(density − target) that never lets λ fall (method-reference-code.md
// §3.2); this is the paper's min-max as written.
struct Lagrangian {
  double lambda = 0.0;  // initial value: TrainOptions::lambda_init
  double lr = 0.05;     // ascent step: TrainOptions::lambda_lr
  void update(double constraint);
};

}  // namespace lychee::train
