// CpuStudent<Real>: the CPU oracle of the student/teacher pass (docs/trainer.md, "The pass") with
// a hand-written backward. Real = double for the finite-difference tests, float for parity with
// cuda::GpuStudent. The weights are converted to Real once; every activation, the context prefill
// included, is computed in Real (the loss is summed in double).
//
// A pass: set_context(ctx) prefills the context densely and keeps its K/V per layer; teacher(tgt)
// runs the targets densely and keeps their outputs; student(z, dz) runs them with the z-mix,
// returns the loss and fills dz. Positions: the context holds 0 … L−1, target row t is at L + t.
//
// Parity with another implementation: the selection is a discrete top-k over raw logits, so a
// near-tie may go the other way in another precision or summation order. float and double agree
// on every set at L = 40 but differ in 19 of 5568 rows (one token each) at L = 1024 on
// SmolLM2-135M, which moves the loss by 4e-4 relative: compare selected() first, or use short
// contexts.
// Threads: OpenMP over KV heads where the work is large enough, BLAS inside.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "model/checkpoint.h"
#include "model/config.h"
#include "train/backward_ops.h"
#include "model/student.h"

namespace lychee::train {

template <typename Real>
class CpuStudent final : public Student {
 public:
  // max_context: the most context + target tokens one pass holds (K/V are sized for it), in
  // [2, config.max_context]. Throws Error(kInvalidArgument) for bad options, Error(kNotFound) for
  // a weight the config needs and `weights` lacks.
  CpuStudent(const ModelConfig& config, const HostWeights& weights, StudentOptions options,
             int max_context);

  // May be empty (targets then start at position 0). Drops the teacher's outputs.
  void set_context(std::span<const int32_t> tokens) override;
  void teacher(std::span<const int32_t> targets) override;
  // dz: the same size as z, or empty to run the forward and the loss only.
  double student(std::span<const float> z, std::span<float> dz) override;
  const StudentOptions& options() const override { return options_; }

  // student() in Real throughout (the fp64 tests); same contract.
  Real student_real(std::span<const Real> z, std::span<Real> dz);

  const ModelConfig& config() const { return config_; }
  int max_context() const { return max_context_; }
  int context_length() const { return n_ctx_ < 0 ? 0 : n_ctx_; }  // L
  int n_targets() const { return int(targets_.size()); }          // T of the last teacher()
  Real last_loss() const { return last_loss_; }                   // of the last student pass
  // [T, vocab] logits (DistillLoss::kLogits) or [T, d_model] final-norm hidden states (kHidden):
  // the teacher's, and the last student pass's.
  std::span<const Real> teacher_output() const { return teacher_out_; }
  std::span<const Real> student_output() const { return student_out_; }
  // The sets of the last student pass: for each target row t, the ascending positions in
  // [0, L + t] that KV head `kv_head` of `layer` attended to in its sparse part (the set as it
  // stood before this layer's own selection). Layer 0 is dense: T empty rows.
  const std::vector<std::vector<int32_t>>& selected(int layer, int kv_head) const;
  // K (after RoPE) then V of the context in `layer`: [2][n_kv_heads][L][head_dim] (the GPU
  // prefill's tests compare with it).
  std::vector<Real> context_kv(int layer) const {
    const size_t L = size_t(context_length()), hd = size_t(config_.head_dim), n_kv = size_t(config_.n_kv_heads);
    std::vector<Real> out;
    out.reserve(2 * n_kv * L * hd);
    for (const auto* cache : {&k_.at(size_t(layer)), &v_.at(size_t(layer))})
      for (size_t h = 0; h < n_kv; ++h)
        out.insert(out.end(), cache->begin() + ptrdiff_t(h * max_context_ * hd),
                   cache->begin() + ptrdiff_t((h * max_context_ + L) * hd));
    return out;
  }

 private:
  struct LayerWeights {  // HF layout in Real; an absent optional weight is an empty vector
    std::vector<Real> attn_norm, wq, wk, wv, wo, bq, bk, bv, bo, q_norm, k_norm;
    std::vector<Real> ffn_norm, w_gate, w_up, w_down, b_gate, b_up, b_down;
  };
  // What the student's backward needs of one layer; T = n_targets.
  struct LayerActs {
    std::vector<Real> x;             // [T, d] the layer's input
    std::vector<Real> q_pre, k_pre;  // [T, q_dim], [T, kv_dim] before the qk norms (Qwen3 only)
    std::vector<Real> q;             // [T, q_dim] after RoPE (K/V after RoPE live in k_, v_)
    std::vector<Real> x2;            // [T, d] after the attention's residual add
    std::vector<Real> gate, up;      // [T, d_ff] before SwiGLU
  };
  using Sets = std::vector<std::vector<std::vector<int32_t>>>;  // [n_kv_heads][T][set]

  void check_tokens(std::span<const int32_t> tokens, const char* what) const;
  void embed(std::span<const int32_t> tokens, Real* x) const;
  void project_qkv(int layer, const Real* x, int n, int pos0, LayerActs* acts, Real* q);
  void mlp(int layer, Real* x, int n, LayerActs* acts) const;
  void attend_targets(int layer, const Real* q, const Real* z, const Sets* in, Sets* out,
                      Real* att) const;
  void forward_targets(const Real* z, std::vector<Real>& out);
  void backward(const Real* z, const Real* dout, Real* dz);
  const Real* lm_head() const { return output_.empty() ? tok_embd_.data() : output_.data(); }

  ModelConfig config_;
  StudentOptions options_;
  int max_context_ = 0;
  std::vector<LayerWeights> layers_;
  std::vector<Real> tok_embd_, output_norm_, output_;  // output_ empty when tied
  std::vector<Real> inv_freq_;                          // [head_dim / 2]
  // [n_layers][n_kv_heads, max_context, head_dim]: K after RoPE, V; rows L … of the last pass.
  std::vector<std::vector<Real>> k_, v_;
  int n_ctx_ = -1;  // L; -1: no context yet
  std::vector<int32_t> targets_;
  std::vector<int32_t> target_pos_;  // [T] L + t
  std::vector<Real> teacher_out_, student_out_;
  bool have_teacher_ = false;
  Real last_loss_ = 0;
  std::vector<LayerActs> acts_;  // [n_layers]
  std::vector<Real> x_final_;    // [T, d] before the final norm
  std::vector<Sets> used_sets_;  // [n_layers]: the sets each layer's sparse part read
};

extern template class CpuStudent<float>;
extern template class CpuStudent<double>;

}  // namespace lychee::train
