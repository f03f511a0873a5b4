// The student/teacher pass of head-role training (docs/trainer.md, "The pass"): a frozen model
// runs the target tokens after a context that was prefilled densely once; the teacher attends
// densely, the student mixes dense and sparse attention per (layer, KV head) with gate values z,
// and the pass returns the distillation loss and its gradient with respect to z. Weights are
// frozen: every backward here is with respect to activations only.
//
// Two implementations share these semantics: CpuStudent<Real> (the fp64/fp32 oracle, checked
// against finite differences) and cuda::GpuStudent (fp32, checked against CpuStudent).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace lychee::train {

enum class DistillLoss {
  kLogits,  // (1/T) Σ_t Σ_v (s_tv − t_tv)²: the paper's squared L2 distance of logits
  kHidden,  // (1/T)(1/d) Σ_t Σ_i (h_s − h_t)² on the final-norm hidden states (the authors' code)
};

struct StudentOptions {
  // Per query row at absolute position p (S = p + 1 visible keys) the set a head passes on holds
  // k = max(1, ceil(keep_ratio · S)) tokens: the current token p plus the k − 1 earlier tokens
  // with the highest group-mean raw logit q̄·k (ties: lower position first).
  double keep_ratio = 0.3;
  // false (the paper): every head of layer l passes its new set to layer l + 1's same-index
  // head. true (as inference does): a head of layer l >= 1 passes its set only when it acts as
  // a retrieval head in this sample (z > 0.5); otherwise the set at that index is left as it was.
  bool propagate_only_retrieval = false;
  DistillLoss loss = DistillLoss::kLogits;
  // CUDA only: TF32 tensor cores for the fp32 matrix products (off for the parity tests).
  bool tf32 = true;
};

// Shapes: n_layers × n_kv_heads gate values z[layer * n_kv_heads + kv_head]; layer 0's entries
// are ignored (layer 0 is dense and has no gate) and get gradient 0.
class Student {
 public:
  virtual ~Student() = default;
  // Dense causal prefill of the context (replaces any previous context). Its K/V are fixed for
  // the teacher and the student and receive no gradient.
  virtual void set_context(std::span<const int32_t> tokens) = 0;
  // Dense forward of the target tokens after the context; keeps the teacher's outputs (logits
  // or final hidden states, per options().loss) for student() to compare with.
  virtual void teacher(std::span<const int32_t> targets) = 0;
  // Student forward over the same targets with gates z, the loss against the teacher's outputs,
  // and dloss/dz (same layout as z; layer 0 = 0). Returns the loss.
  virtual double student(std::span<const float> z, std::span<float> dz) = 0;
  virtual const StudentOptions& options() const = 0;
};

}  // namespace lychee::train
