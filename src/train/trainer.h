// The head-role training loop (docs/trainer.md): per step one sample, dense context prefill,
// teacher and student over the targets, a gate sample, the distillation loss plus λ times the
// expected number of retrieval heads minus the target, AdamW on the gate parameters and
// gradient ascent on λ. Writes a head-role file, a CSV log, a checkpoint to resume from and an
// SVG heatmap into one output directory.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attention/head_roles.h"
#include "model/config.h"
#include "train/data.h"
#include "train/gates.h"
#include "model/student.h"

namespace lychee::train {

enum class RoleDecision {
  kThreshold,  // E[z] > 0.5 (the paper); the count may differ from the target
  kTopN,       // exactly N gated heads with the largest E[z] (equal counts for ablations)
};
RoleDecision parse_role_decision(const std::string& name);

struct TrainOptions {
  GateKind gate = GateKind::kHardKuma;
  int n_retrieval = 0;        // N_target: expected retrieval heads among the gated (layer >= 1) ones
  int steps = 3000;
  double lr = 0.01;           // AdamW on the gate parameters, times the warm-up/decay schedule
  double weight_decay = 0.0;
  double lambda_init = 0.0;   // Lagrange multiplier of E‖z‖₀ − N_target
  double lambda_lr = 1e-5;    // its gradient-ascent step (λ clipped at 0); see docs/trainer.md
  uint64_t seed = 0;          // gate noise and data order; step s uses sample s of the data
  RoleDecision decision = RoleDecision::kThreshold;
  int log_every = 10;         // CSV rows and progress lines
  int snapshot_every = 0;     // heatmap columns (0: about 60 over the run)
  int checkpoint_every = 100;
  std::string out_dir;        // roles.json, train_log.csv, checkpoint.json, heatmap.svg, summary.json
  bool resume = false;        // continue from out_dir/checkpoint.json
  int stop_after = 0;         // > 0: checkpoint and return after this step (resume later)
  bool progress = true;       // progress lines on stderr
};

struct TrainResult {
  HeadRoles roles;
  std::vector<double> expected_z;  // [n_layers * n_kv_heads]
  double final_loss = 0.0;         // mean loss of the last 5% of steps
  double lambda = 0.0;
  double expected_l0 = 0.0;
  double seconds = 0.0;            // wall time of this run (without resumed steps)
  int steps_run = 0;
  bool finished = true;            // false when stop_after ended the run early (no role file yet)
  nlohmann::json summary;
};

// One progress line (the CLI prints it; tests may capture it).
using TrainProgress = std::function<void(const std::string& line)>;

TrainResult train_head_roles(const ModelConfig& config, Student& student, const TrainData& data,
                             const TrainOptions& options, const nlohmann::json& provenance,
                             const TrainProgress& progress = {});

// Data parallelism over R ranks (docs/trainer.md, "Data parallel"): step s runs R samples, rank r
// taking sample s · R + r with gate noise of its own (rank 0's is the single-rank run's), and
// descends on the mean of the R gradients; λ, the schedule and the checkpoints are per step as
// with one rank (R = 1 is train_head_roles above, bit for bit). ranks[r] is rank r's student: one
// Student may serve several ranks, which then run in turn; distinct students (one per GPU) run on
// threads of their own. reduce sums the ranks' gradients in place (null: host_gradient_sum); any
// reducer that sums exactly gives the same run, so two GPUs equal one GPU serving both ranks.
// grads[r]: [n_params] rank r's gradient; on return every grads[r] holds the sum over ranks.
// (runtime/backend.h names the same std::function type for the GPU ranks' NCCL reducer.)
using GradientReduce = std::function<void(std::span<std::vector<double>> grads)>;
// The sum in rank order, on the host.
void host_gradient_sum(std::span<std::vector<double>> grads);

TrainResult train_head_roles(const ModelConfig& config, std::span<Student* const> ranks, const TrainData& data,
                             const TrainOptions& options, const nlohmann::json& provenance,
                             const TrainProgress& progress = {}, const GradientReduce& reduce = {});

}  // namespace lychee::train
