// A Backend runs one loaded model on one device: it opens sessions (sequences in its KV cache),
// says how many bytes a decode step reads and how fast the device can read them, and times
// batched decoding. The CPU reference and the CUDA backend implement it; the Engine holds one.
// backends.cpp is the one file that knows which backends this build has.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "attention/decode_spec.h"
#include "model/checkpoint.h"
#include "model/student.h"
#include "core/kv_dtype.h"
#include "runtime/session.h"

namespace lychee {

struct BackendOptions {
  // CPU backend only: kNative (the default) keeps GGUF block-quantised matrices in their blocks
  // (integer dot products at decode, dequantised sgemm for long prompt chunks; a file without
  // quantised matrices is all f32 under it); kF32 expands every weight to f32 (the reference path,
  // which the parity tests name); kFp8 is kF32 with the linear matrices rounded through FP8 e4m3
  // (model/checkpoint.h).
  WeightFormat cpu_weights = WeightFormat::kNative;
  // CUDA backend only: how the GPU holds the linear matrices (model/checkpoint.h): bf16 (the
  // default) or FP8 e4m3 with one scale per output channel. The CPU backend has no FP8 form of
  // its own beyond cpu_weights = kFp8 and refuses kFp8 here (make_backend).
  GpuWeightFormat gpu_weights = GpuWeightFormat::kBf16;
  // FP8's exceptions (cpu_weights = kFp8 or gpu_weights = kFp8): Q/K/V matrices kept unrounded.
  Fp8Keep fp8_keep;
  double kv_memory_gib = 0.0;  // 0 = sized from max_batch x max_context, capped by free memory
  // How K/V are held (core/kv_dtype.h): the CPU backend rounds its f32 cache through FP8 codes,
  // the CUDA backend stores the codes and scales in its pages.
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kBf16;
  int max_context = 0;         // 0 = the model's context length
  int max_batch = 8;
  int page_size = 64;
  // CUDA backend only: tensor parallelism, the global KV heads GPU r (device r) holds (empty or
  // one entry: one GPU).
  std::vector<std::vector<int>> tp_kv_heads;
  // CUDA backend only (benchmarks): seeded random weights of this shape (in gpu_weights' format)
  // instead of the checkpoint's (decode time does not depend on the values); null = the
  // checkpoint's weights.
  const ModelConfig* random_shape = nullptr;
  uint64_t random_seed = 1234;  // bench_e2e's
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;  // "cpu" or "cuda"
  // A new sequence able to hold `capacity` tokens (<= the model's context).
  virtual std::unique_ptr<Session> new_session(int capacity) = 0;
  // Bytes of weights a decode step of one sequence reads.
  virtual uint64_t weight_bytes_per_token() const = 0;
  // The memory bandwidth that bounds a decode step on this device, GB/s (measured, ~1 s).
  virtual double measure_bandwidth_gbps() const = 0;
  // `batch` sequences each prefilled with `prompt`, then `steps` greedy decode steps of the
  // whole batch; returns the seconds the steps took.
  virtual double time_batched_decode(int batch, std::span<const int32_t> prompt, int steps,
                                     const DecodeSpec* spec = nullptr) = 0;
  // Why this backend cannot run `spec` (naming the option), or "" when it can.
  virtual std::string unsupported(const DecodeSpec& spec) const = 0;
  // The KV cache's allocation unit in tokens, and how many such pages the pool holds (0: no
  // shared pool; a session's memory is its own, taken at creation). A session of c tokens holds
  // at most ceil(c / page) pages.
  virtual int kv_page_tokens() const { return 1; }
  virtual int64_t kv_pool_pages() const { return 0; }
};

// "cpu", "cuda", or "auto" resolved on this machine (cuda when this build has it and a device is
// usable). Error(kUnsupported) for "cuda" without one, naming why.
std::string resolve_device(const std::string& requested);
// Whether a usable CUDA device is present ("" if so), else why not (the CUDA error, or that the
// build has no CUDA backend).
std::string cuda_device_status();

// The backend for a resolved device ("cpu" or "cuda"), weights loaded from `ck`.
std::unique_ptr<Backend> make_backend(const std::string& device, const Checkpoint& ck, const BackendOptions& o);
// Why the CUDA backend cannot run `spec` on model c with KV pages of `page_size` tokens, or "".
// Pure host code; in a build without CUDA it says so.
std::string cuda_unsupported(const DecodeSpec& spec, const ModelConfig& c, int page_size);

// The head-role trainer's student/teacher pass on the GPU (model/student.h; the CPU one is the
// trainer's own oracle, train/cpu_student.h). Error(kUnsupported) in a build without CUDA.
std::unique_ptr<train::Student> make_gpu_student(const ModelConfig& c, const HostWeights& w,
                                                 const train::StudentOptions& options, int max_context,
                                                 int max_targets);

// Data-parallel head-role training (docs/trainer.md, "Data parallel"): rank r on CUDA device
// rank_devices[r]; one GPU student per distinct device (ranks on one device share it and run in
// turn), built in parallel from `w`; `reduce` sums the ranks' gate gradients: every device's
// gradients gathered to every device over NCCL (bit copies), then summed in rank order, so the
// sum is the host's exactly (null with one device: the trainer's host sum). The type is
// train::GradientReduce (train/trainer.h) spelled out: grads[r] [n_params] in, the sum in each out.
// prefill_bf16: the bf16 context prefill, GpuStudentTuning::prefill_bf16 and prefill_cudnn
// (cuda/train/student.h); teacher_bf16: the teacher's attention on cuDNN too (teacher_cudnn).
// Error(kInvalidArgument)
// naming a device that does not exist; kUnsupported without CUDA.
struct GpuStudentRanks {
  std::vector<std::unique_ptr<train::Student>> students;  // one per distinct device
  std::vector<train::Student*> ranks;                    // [n_ranks]
  std::function<void(std::span<std::vector<double>> grads)> reduce;
};
GpuStudentRanks make_gpu_student_ranks(const ModelConfig& c, const HostWeights& w,
                                       const train::StudentOptions& options, int max_context, int max_targets,
                                       std::span<const int> rank_devices, bool prefill_bf16,
                                       bool teacher_bf16 = false);

// The CPU reference backend (cpu_backend.cpp).
std::unique_ptr<Backend> make_cpu_backend(const Checkpoint& ck, WeightFormat weights = WeightFormat::kF32,
                                          const Fp8Keep& keep = {}, KvCacheDtype kv_dtype = KvCacheDtype::kBf16);

}  // namespace lychee
