// The whole head-role training run behind `lychee train-heads` and the Python module's
// lychee.train_heads: open the model, resolve the device, build the data and the student
// (CPU oracle or GPU pass), train, and write the output directory. One function so the CLI and
// the bindings cannot drift apart.
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"
#include "train/trainer.h"

namespace lychee::train {

// The options of `lychee train-heads`, one field per flag (docs/trainer.md).
struct TrainHeadsConfig {
  std::string model;               // "" = the default model
  std::string device = "auto";     // cpu, cuda, auto
  int retrieval_heads = 0;         // target retrieval KV heads in layers >= 1; 0 = 1/8 of all KV heads
  std::string gate = "hardkuma";   // hardkuma, hardconcrete, direct
  std::string data = "passkey";    // passkey or jsonl:PATH
  std::string haystack = "essays"; // essays or synthetic
  std::string propagate = "all";   // all or retrieval
  std::string loss = "logits";     // logits or hidden
  std::string decision = "threshold";  // threshold or top-n
  int steps = 3000, min_len = 1024, max_len = 0, passkeys = 10, passkey_words = 32;
  double lr = 0.01, lambda_lr = 1e-5, lambda_init = 0.0, keep_ratio = 0.3;
  uint64_t seed = 0;
  std::string out;                 // "" = runs/heads-<model>-<gate>
  bool resume = false;
  int log_every = 10, checkpoint_every = 100;
  int stop_after = 0;              // > 0: checkpoint and stop after this step (--resume continues)
  bool tf32 = true;                // CUDA: TF32 tensor cores for the fp32 products
  std::string prefill = "tf32";    // CUDA: the context prefill in tf32 or bf16 (GpuStudentTuning::prefill_bf16)
  int data_parallel = 1;           // ranks: samples per step, one per GPU (docs/trainer.md, "Data parallel")
  std::string gpus;                // CUDA: rank r's device, comma-separated ("" = 0, 1, ..., ranks − 1)
};

struct TrainHeadsRun {
  TrainResult result;
  ModelConfig config;
  std::string device;   // resolved: cpu or cuda
  std::string out_dir;
  int n_target = 0;     // the target number of retrieval heads in layers >= 1
};

// Runs the training; progress lines (the run's description first, then the trainer's) go to
// `progress`. Error(kInvalidArgument) naming the option when a value does not fit the model.
TrainHeadsRun train_heads(const TrainHeadsConfig& config, const TrainProgress& progress = {});

}  // namespace lychee::train
