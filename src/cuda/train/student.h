// The student/teacher pass of head-role training on the GPU (docs/trainer.md, "The pass";
// the semantics are train::Student's): fp32 weights and activations, cuBLAS matrix products
// (TF32 tensor cores when options.tf32, pedantic fp32 otherwise; bf16 for the context prefill with
// GpuStudentTuning::prefill_bf16 / prefill_cudnn), materialised attention rows
// for the student (top-k selection and dense/sparse mix on the device), hand-written backward
// with respect to activations. The interface has no CUDA types (like gpu_runner.h).
//
// Device memory is reserved at construction from max_context (longest context + targets) and
// max_targets; nothing is allocated per step. The largest parts, in fp32 (see memory_bytes()):
// weights; K/V of every layer [n_layers][2][n_kv_heads][max_context][head_dim]; two attention
// scratch buffers [n_heads][max(max_targets, 256)][max_context]; the student's per-layer
// activations [n_layers][max_targets][d + d + (q_dim + 2 kv_dim) + q_dim + 2 d_ff]; the logits
// of teacher and student [max_targets][vocab] each; the selected sets as bit masks
// [n_layers][n_kv_heads][max_targets][max_context / 32] u32; past ~56K max_context the selection's
// keys [n_kv_heads][max_targets][max_context] (they no longer fit a block's shared memory).
// With prefill_cudnn, cuDNN's graph for each query-length bucket (a power of two, at most ~8 of
// them) is built at its first use, with its workspace: the first steps of a run pay for those.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "model/checkpoint.h"
#include "model/config.h"
#include "model/weight_table.h"
#include "model/student.h"

namespace lychee::cuda {

// An f32 weight in Hugging Face layout, nullptr when absent; kOutput may return the embedding
// (tied), as HostWeights::get does.
using WeightSource = std::function<const float*(WeightId id, int layer)>;

// GPU-only choices (the semantics do not depend on them).
struct GpuStudentTuning {
  // Keep every layer's raw attention logits from the student forward for its backward
  // (+ n_layers × n_heads × max_targets × max_context × 4 bytes) instead of recomputing them
  // with one matrix product per layer.
  bool store_logits = false;
  // Dense prefill and teacher attention with the TF32 flash kernel when options.tf32 and
  // head_dim is 64 or 128 (otherwise materialised rows, like the student).
  bool flash = true;
  // The context prefill's projections (set_context) with bf16 tensor cores: a bf16 copy of the
  // layers' weights (+2 bytes per parameter of device memory, the embedding and LM head excepted:
  // the prefill uses neither) times the activations rounded to bf16, f32 accumulation and output.
  // The teacher and the student read the same context K/V, so all gates 1 still give the teacher;
  // only the context's representation moves (by bf16's 2^-9 relative rounding, as a bf16 inference
  // engine computes it). Needs options.tf32 and the long prefill chunks of flash or prefill_cudnn.
  // (Issue 40's first version rounded inside cuBLAS, CUBLAS_COMPUTE_32F_FAST_16BF on the fp32
  // weights: no faster than TF32 on an H200.)
  bool prefill_bf16 = false;
  // The context prefill's causal attention through cuDNN's fused SDPA (cuda/kernels'
  // PrefillAttention, as the inference prefill) on bf16 copies of q and of the layer's K/V, f32
  // accumulation, bf16 output (the O projection's input as it is with prefill_bf16, widened to f32
  // otherwise). The f32 K/V cache the teacher and the student read is what the projections wrote;
  // only the context's later layers see the bf16 attention. No gradient flows through the context,
  // so no backward is needed. Needs options.tf32 and head_dim a multiple of 8 up to 256; replaces
  // the TF32 flash kernel there (without a usable cuDNN, PrefillAttention's own bf16 kernel runs).
  bool prefill_cudnn = false;
  // The teacher's attention the same way (a measurement variant, not a default: the student's dense
  // rows stay TF32, so the teacher then differs from all gates 1 by bf16's rounding of its
  // attention, which does not cancel in the loss as the shared context K/V's does).
  bool teacher_cudnn = false;
  // The student's selection as its own pass (train_ops::select_rows): its keys, the group sums of
  // the raw logits, from one product per KV head (the group's queries summed, times the keys),
  // instead of summed by the rows kernel from the logits rows it streams; the rows kernel then
  // keeps only the input sets in shared memory (several blocks an SM instead of one past ~8K
  // columns) and no radix passes sit between its rows. The keys' scratch is the backward's G
  // buffer, free during the forward: no extra memory. 1: always; 0: the fused rows kernel; -1
  // (default): separate where the fused kernel's keys would keep it below two blocks an SM
  // (select_separately). H200, 8B shape (docs/results/gpu/session19/): at 32K + 1K the student
  // forward 463 -> 400 ms; at 8K + 1K and on the default model (7292 + 900) the fused kernel was
  // 1-3% faster (136 against 139 ms, 25.6 against 26.3 ms), so auto keeps it there.
  int separate_selection = -1;
  // Its keys staged in shared memory (1), read from the scratch where they lie (0), read there for
  // the first radix pass and the candidates gathered for the rest (2), or chosen by the row's length
  // (-1; train_ops::SelectRowsArgs::keys_mode).
  int select_keys = -1;
  // >= 0: CUDA events around the ops of this layer in teacher() and student() (a few µs of
  // overhead), reported in GpuStudentTimes::layer_ops.
  int profile_layer = -1;
};

// Whether the student's selection runs as its own pass (GpuStudentTuning::separate_selection):
// setting 1 or 0 as given; -1: where two blocks of the fused rows kernel, fused_smem_bytes each,
// would not fit an SM's smem_per_sm bytes of shared memory. Pure.
bool select_separately(int setting, size_t fused_smem_bytes, size_t smem_per_sm);

// Device time (CUDA events) of the phases of the last set_context / teacher / student calls.
struct GpuStudentTimes {
  double context_ms = 0.0;
  double teacher_ms = 0.0;
  double student_forward_ms = 0.0;   // embedding to final norm
  double student_loss_ms = 0.0;      // LM head, loss, its gradient back to the final norm
  double student_backward_ms = 0.0;  // the layers' backward and dz
  // With GpuStudentTuning::profile_layer: (op, ms) of that layer in the last teacher() and the
  // student() after it.
  std::vector<std::pair<std::string, double>> layer_ops;
};

class GpuStudent final : public train::Student {
 public:
  // max_context: the longest context + targets (<= config.max_context); max_targets: the most
  // targets of one sample (<= max_context).
  GpuStudent(const ModelConfig& config, const HostWeights& weights,
             const train::StudentOptions& options, int max_context, int max_targets,
             const GpuStudentTuning& tuning = {});
  GpuStudent(const ModelConfig& config, const WeightSource& weights,
             const train::StudentOptions& options, int max_context, int max_targets,
             const GpuStudentTuning& tuning = {});
  ~GpuStudent() override;
  GpuStudent(const GpuStudent&) = delete;
  GpuStudent& operator=(const GpuStudent&) = delete;

  void set_context(std::span<const int32_t> tokens) override;
  void teacher(std::span<const int32_t> targets) override;
  double student(std::span<const float> z, std::span<float> dz) override;
  const train::StudentOptions& options() const override;

  // The teacher's outputs of the last teacher() call: [T][vocab] logits or [T][d] final-norm
  // hidden states (per options().loss).
  std::vector<float> teacher_outputs() const;
  // The sets the last student() pass used in `layer` (1 <= layer < n_layers): for KV head h
  // and target row t, entry [h * T + t] holds its positions, ascending.
  std::vector<std::vector<int32_t>> selected_sets(int layer) const;
  // K (after RoPE) then V of the context in `layer`, [2][n_kv_heads][L][head_dim], as the last
  // set_context left them (the tests compare the prefill paths with it).
  std::vector<float> context_kv(int layer) const;
  // What ran the last cuDNN SDPA call (prefill_cudnn / teacher_cudnn): "cudnn", "split-kv" (the
  // kernels' own split kernel, chosen for few query rows over many keys), "fallback (why)", or
  // "none" without those options.
  std::string sdpa_backend() const;
  // Device bytes reserved at construction (cuDNN's workspace, grown at its graphs' builds, aside).
  size_t memory_bytes() const;
  // Waits for the device and returns the phase times of the last calls.
  GpuStudentTimes last_times() const;
  void synchronize() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lychee::cuda
