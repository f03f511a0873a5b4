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
  std::string prefill = "auto";    // CUDA: the context prefill in tf32, bf16 or auto (resolve_prefill)
  std::string teacher_attention = "tf32";  // CUDA: the teacher's attention in tf32 or bf16 (check_teacher_attention)
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

// The CUDA context prefill `--prefill` gives for this model: "tf32" (TF32 products, the TF32
// flash attention), "bf16" (bf16 products and cuDNN's SDPA: GpuStudentTuning::prefill_bf16 and
// prefill_cudnn) or "auto": bf16 for models of at least kBf16PrefillParams parameters (the 8B
// shapes, where the prefill is most of a long sample's step) with TF32 on, tf32 otherwise (small
// models keep the TF32 numerics their committed roles were trained with, and --no-tf32 means exact
// fp32). Error(kInvalidArgument) for another value, or bf16 with tf32 off.
constexpr int64_t kBf16PrefillParams = 1'000'000'000;
std::string resolve_prefill(const std::string& prefill, const ModelConfig& c, bool tf32);

// `--teacher-attention`: "tf32" (the default: the TF32 flash kernel, as the student's dense rows)
// or "bf16" (cuDNN's SDPA in bf16, GpuStudentTuning::teacher_cudnn: 0.18 s less per step at 32K +
// 1K on the 8B shape, 54 ms at 8K, H200; the student's dense rows stay TF32, so all gates 1 give
// bf16's rounding of the teacher's attention as the loss instead of ~0). Error(kInvalidArgument)
// for another value, bf16 with tf32 off, or bf16 off the GPU (device: the resolved one).
void check_teacher_attention(const std::string& teacher_attention, bool tf32, const std::string& device);

// Runs the training; progress lines (the run's description first, then the trainer's) go to
// `progress`. Error(kInvalidArgument) naming the option when a value does not fit the model.
TrainHeadsRun train_heads(const TrainHeadsConfig& config, const TrainProgress& progress = {});

}  // namespace lychee::train
