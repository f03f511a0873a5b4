// One head-role training step on the GPU (cuda::GpuStudent): set_context + teacher + student
// (forward, loss, backward) for a model shape with random fp32 weights, per phase (CUDA events,
// median over steps after one warm-up), for several GpuStudent variants on the same inputs (dz of
// each compared with the first's), with the device memory the student reserves and the peak the
// device saw (cudaMemGetInfo, CUDA context and cuBLAS included). Nothing here depends on the
// weights' values but the selection, so random weights time what a real checkpoint would.
//   bench_train_step [--shape smollm2-135m|llama3-8b|qwen2.5-7b|qwen3-8b] [--context N] [--targets N]
//                    [--steps 6] [--layers N] [--all] [--variants 'NAME;NAME'] [--json FILE]
// Shapes: smollm2-135m (default: 30 layers, d 576, 9/3 heads of 64, d_ff 1536, vocab 49152,
// tied); llama3-8b (32 layers, d 4096, 32/8 heads of 128, d_ff 14336, vocab 128256, θ 500000);
// qwen2.5-7b (28 layers, d 3584, 28/4 heads of 128, d_ff 18944, vocab 152064, q/k/v biases,
// θ 1e6); qwen3-8b (36 layers, d 4096, 32/8 heads of 128, d_ff 12288, vocab 151936, q/k norms).
// Without --all the default variant, the bf16 + cuDNN prefill and stored logits run (stored
// logits are skipped where they would not fit); the first variant also times the ops of one middle layer
// (CUDA events around each op).
//
// Napkin numbers for SmolLM2 at 7292 + 900 tokens: the prefill is ~1.6 TFLOP of projections plus
// ~1.9 TFLOP of causal attention; the student's attention rows move ~9 × 900 × 8192 × 4 B =
// 0.27 GB per pass over the logits, ~8 passes per layer (forward and backward), ~65 GB in all:
// ~25 ms at 2.6 TB/s.
// Napkin numbers for Llama-3-8B at 32768 + 1024 (H100: 989 TFLOP/s bf16 dense, 495 TF32, ~3 TB/s;
// H200 the same FLOP/s, ~4.3 TB/s): 6.98 G non-embedding parameters.
//   context prefill: projections 2 × 6.98e9 × 32768 = 457 TFLOP, causal attention
//     2 × L² × 128 × 32 heads × 31 layers = 272 TFLOP: 0.74 s at the bf16 peak, 1.47 s at TF32's.
//   teacher: projections 14.3 + LM head 1.1 + attention 4 × 1024 × 33.3K × 128 × 32 × 32 = 17.9
//     TFLOP: 34 ms bf16, 67 ms TF32; 28 GB of fp32 weights read: 9 ms.
//   student forward: the teacher's FLOPs plus the rows: S [32][1024][33.8K] f32 = 4.4 GB per
//     layer, written by the GEMM, read twice and W written by the rows kernel, read by W·V:
//     ~17.7 GB per layer, 567 GB in all: 0.19 s at 3 TB/s.
//   backward: G = dO·Vᵀ, S recomputed and dQ = dS·K are 8.8 TFLOP each (27 TFLOP, 53 ms TF32) plus
//     14 TFLOP of projections; the rows: G and S written (8.8 GB), read twice and G rewritten by the
//     rows kernel (22 GB), G read by dQ (4.4 GB): ~35 GB per layer, 1.09 TB in all: 0.36 s.
//   So ~2.2 s with a TF32 prefill and materialised rows at their bounds; the prefill in bf16 takes
//   0.74 s off that bound.
//   Expected with the bf16 + cuDNN prefill (from call 2 on the H200: the bf16 products ran the 8K
//   prefill's 114 TFLOP in ~0.26 s, ~440 TFLOP/s with their fp32 element-wise passes; cuDNN's SDPA
//   ~600 TFLOP/s on one H100 sequence, docs/kernels/prefill-attention.md): prefill ~1.0 s of products + ~0.5 s of
//   attention + ~10 ms of K/V rounding (~30 GB); teacher 0.29 s, student 0.46 + 0.38 s as measured
//   (unchanged): ~2.6 s per step, ~70 GiB reserved (call 2's 72.0 less the 2 GiB bf16 copy of the
//   embedding and LM head, plus ~0.3 GiB of bf16 q, output and one layer's K/V). The teacher's
//   attention on cuDNN (variant "... and teacher") would take ~0.2 s more off; the student's rows
//   kernels (~0.33 + 0.19 s at 32K on the H200) are then the largest attention item. Memory: fp32 weights 32.1 GB, K/V of every layer 8.9 GB, S and G
//   buffers 8.9 GB, per-layer activations 6.2 GB, logits 1.1 GB, sets 1.1 GB: ~58 GB.
//
// Measured (H100 80GB HBM3, driver 580.159.04, 2026-11, median of 5 steps, ms):
//   context + targets   context  teacher  s.fwd  s.loss  s.bwd  step (wall)  device memory
//   7292 + 900            27.6     8.8    27.0    0.8    26.2      90.5        2.68 GiB
//   7292 + 900 stored     27.9     8.9    27.1    0.8    22.8      87.6       10.10 GiB
//   8192 + 900            33.1     9.6    31.1    0.8    31.6     106.3        2.79 GiB
// Layer 15 at 7292 + 900: S = QKᵀ 0.13, softmax/select/mix 0.54, W·V 0.16, backward G = dO·Vᵀ
// 0.13, S recomputed 0.13, attention rows 0.33, dQ/dK/dV 0.24 (the rest < 0.1 each). Versions:
// scalar row loops gave 0.60 / 0.46 ms for the two rows kernels (float4 with 4 loads in flight
// per thread: 0.54 / 0.33); the materialised prefill took 110 ms against 27 for flash; the teacher's
// flash without key splits (135 blocks on 132 SMs) 12.6 ms against 8.8; pedantic fp32 460 ms.
// Llama-3-8B shape (the issue's report, H100, before this bench had shapes): 8K + 1K 0.85 s/step,
// 43 GiB; 32K + 1K 5.5 s/step, 57 GiB. Per-phase figures: docs/results/train_speed/.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_env.h"
#include "core/json_io.h"
#include "cuda/common/common.h"
#include "cuda/train/student.h"
#include "model/config.h"
#include "model/weight_table.h"

namespace {

using namespace lychee;

// The shapes this bench knows (model/config.h has llama3-8b and smollm2-135m; the two Qwen
// shapes exercise the q/k/v biases and the q/k norms).
ModelConfig bench_shape(const std::string& name) {
  if (name == "llama3-8b" || name == "smollm2-135m") {
    ModelConfig c = model_shape(name);
    c.name = name + " shape, random fp32 weights";
    c.max_context = std::max(c.max_context, 131072 + 1024);  // the bench may go past SmolLM2's 8K
    return c;
  }
  ModelConfig c;
  c.arch_label = "Qwen2ForCausalLM";
  c.max_context = 131072 + 1024;
  c.rms_eps = 1e-6f;
  c.rope_theta = 1000000.0f;
  c.head_dim = 128;
  if (name == "qwen2.5-7b") {
    c.arch = Arch::kQwen2;
    c.n_layers = 28; c.d_model = 3584; c.n_heads = 28; c.n_kv_heads = 4;
    c.d_ff = 18944; c.vocab_size = 152064; c.qkv_bias = true;
  } else if (name == "qwen3-8b") {
    c.arch = Arch::kQwen3;
    c.arch_label = "Qwen3ForCausalLM";
    c.n_layers = 36; c.d_model = 4096; c.n_heads = 32; c.n_kv_heads = 8;
    c.d_ff = 12288; c.vocab_size = 151936; c.qk_norm = true;
  } else {
    throw std::invalid_argument("unknown --shape '" + name + "' (known: smollm2-135m, llama3-8b, qwen2.5-7b, qwen3-8b)");
  }
  c.name = name + " shape, random fp32 weights";
  return c;
}

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform values of the given mean and standard deviation, filled on all cores (an 8B model is
// 8 G values; the step's time does not depend on them).
std::vector<float> random_values(size_t n, uint64_t seed, float mean, float sd) {
  std::vector<float> v(n);
  const float a = sd * 1.7320508f;  // uniform on [-a, a] has this standard deviation
  const size_t n_threads = std::clamp<size_t>(n >> 22, 1, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t k = 0; k < n_threads; ++k)
    pool.emplace_back([&, k] {
      for (size_t i = k * n / n_threads; i < (k + 1) * n / n_threads; ++i)
        v[i] = mean + a * (float(mix(seed * 0x100000001b3ull + i) >> 40) / float(1 << 24) * 2.0f - 1.0f);
    });
  for (std::thread& t : pool) t.join();
  return v;
}

struct HostModel {
  std::map<std::pair<int, int>, std::vector<float>> w;  // (WeightId, layer)
  const float* get(WeightId id, int layer) const {
    auto it = w.find({int(id), layer});
    if (it == w.end() && id == WeightId::kOutput) it = w.find({int(WeightId::kTokEmbd), 0});  // tied
    return it == w.end() ? nullptr : it->second.data();
  }
};

// Every weight the shape has (model/weight_table.h): norms around 1, matrices of std
// 0.5 / √fan_in (activations stay O(1) over the layers), biases and embeddings small.
HostModel random_model(const ModelConfig& c) {
  HostModel m;
  uint64_t seed = 1;
  for (const WeightSpec& spec : weight_table()) {
    if (spec.optional || (spec.present != nullptr && !spec.present(c))) continue;
    const std::vector<int64_t> shape = spec.shape(c);
    const size_t n = size_t(weight_numel(spec, c));
    const bool norm = spec.id == WeightId::kAttnNorm || spec.id == WeightId::kFfnNorm ||
                      spec.id == WeightId::kOutputNorm || spec.id == WeightId::kQNorm || spec.id == WeightId::kKNorm;
    const float mean = norm ? 1.0f : 0.0f;
    const float sd = norm ? 0.1f : shape.size() == 1 ? 0.02f
                     : spec.id == WeightId::kTokEmbd ? 0.5f : 0.5f / std::sqrt(float(shape[1]));
    for (int l = 0; l < (spec.per_layer ? c.n_layers : 1); ++l) m.w[{int(spec.id), l}] = random_values(n, seed++, mean, sd);
  }
  return m;
}

struct Variant {
  const char* name;
  bool tf32, flash, store_logits, prefill_bf16, prefill_cudnn, teacher_cudnn;
  int steps;  // 0: the --steps value
  bool always;
  bool fused_selection = false;  // GpuStudentTuning::separate_selection 0 (else 1: the separate pass)
  int select_keys = -1;  // GpuStudentTuning::select_keys
};

// "bf16 + cudnn prefill" is `train-heads --prefill bf16` (auto's choice for the 8B shapes);
// "bf16 prefill" its products alone (attention on the TF32 flash kernel, call 2's variant).
const Variant kVariants[] = {{"tf32, flash prefill", true, true, false, false, false, false, 0, true},
                             {"bf16 + cudnn prefill", true, true, false, true, true, false, 0, true},
                             {"bf16 prefill", true, true, false, true, false, false, 0, false},
                             {"cudnn prefill, tf32 products", true, true, false, false, true, false, 0, false},
                             {"bf16 + cudnn prefill and teacher", true, true, false, true, true, true, 0, false},
                             {"tf32, flash, stored logits", true, true, true, false, false, false, 0, true},
                             {"tf32, materialised prefill", true, false, false, false, false, false, 0, false},
                             {"fp32 pedantic", false, false, false, false, false, false, 2, false},
                             {"bf16 + cudnn prefill, fused selection", true, true, false, true, true, false, 0, false, true},
                             {"tf32, flash prefill, fused selection", true, true, false, false, false, false, 0, false, true},
                             {"bf16 + cudnn prefill, selection keys in place", true, true, false, true, true, false, 0, false,
                              false, 0},
                             {"bf16 + cudnn prefill, selection keys in smem", true, true, false, true, true, false, 0, false,
                              false, 1},
                             {"bf16 + cudnn prefill, selection compacted", true, true, false, true, true, false, 0, false,
                              false, 2}};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double device_used_gib() {
  size_t free_b = 0, total_b = 0;
  LY_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return double(total_b - free_b) / double(1u << 30);
}

struct Args {
  std::string shape = "smollm2-135m", json_path, variants;
  int n_ctx = 7292, n_tgt = 900, steps = 6, n_layers = 0;
  bool all = false;
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(s + " needs a value");
      return std::string(argv[++i]);
    };
    if (s == "--shape") a.shape = next();
    else if (s == "--context") a.n_ctx = std::stoi(next());
    else if (s == "--targets") a.n_tgt = std::stoi(next());
    else if (s == "--steps") a.steps = std::stoi(next());
    else if (s == "--layers") a.n_layers = std::stoi(next());
    else if (s == "--json") a.json_path = next();
    else if (s == "--variants") a.variants = next();
    else if (s == "--all") a.all = true;
    else throw std::invalid_argument("unknown argument " + s);
  }
  if (a.n_ctx < 0 || a.n_tgt < 1 || a.steps < 1) throw std::invalid_argument("--context >= 0, --targets >= 1, --steps >= 1");
  return a;
}

// The variants to run: --variants names them (comma-separated, as printed), else --all or the
// default ones.
std::vector<const Variant*> chosen_variants(const Args& a) {
  std::vector<const Variant*> out;
  if (!a.variants.empty()) {
    std::stringstream ss(a.variants);
    for (std::string name; std::getline(ss, name, ';');) {
      const Variant* found = nullptr;
      for (const Variant& v : kVariants)
        if (name == v.name) found = &v;
      if (found == nullptr) throw std::invalid_argument("--variants: unknown variant '" + name + "'");
      out.push_back(found);
    }
    return out;
  }
  for (const Variant& v : kVariants)
    if (v.always || a.all) out.push_back(&v);
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse_args(argc, argv);
  ModelConfig c = bench_shape(args.shape);
  if (args.n_layers > 0) c.n_layers = args.n_layers;
  const int n_ctx = args.n_ctx, n_tgt = args.n_tgt;
  const auto tg0 = std::chrono::steady_clock::now();
  const HostModel host = random_model(c);
  const double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - tg0).count();
  const cuda::WeightSource source = [&host](WeightId id, int layer) { return host.get(id, layer); };
  const size_t n_gates = size_t(c.n_layers) * c.n_kv_heads;
  const double base_gib = device_used_gib();
  std::printf("%s on %s: context %d + %d targets, %d layers (%.1f G parameters, generated in %.1f s)\n",
              c.name.c_str(), cuda::device_info().name, n_ctx, n_tgt, c.n_layers, double(c.n_params()) * 1e-9, gen_s);

  std::vector<std::pair<std::string, double>> layer_ops;
  nlohmann::json results = nlohmann::json::array();
  std::vector<float> dz_ref;
  std::printf("%-28s %9s %9s %9s %9s %9s %9s %8s %8s %11s %9s\n", "variant", "context", "teacher", "s.fwd", "s.loss",
              "s.bwd", "step", "GiB", "dev GiB", "loss", "dz diff");
  const std::vector<const Variant*> variants = chosen_variants(args);
  for (const Variant* vp : variants) {
    const Variant& v = *vp;
    const double ld = double((n_ctx + n_tgt + 3) / 4 * 4);
    const double store_gib = double(c.n_layers) * c.n_heads * n_tgt * ld * 4.0 / double(1u << 30);
    if (v.store_logits && store_gib > 0.5 * double(cuda::device_info().total_memory) / double(1u << 30)) {
      std::printf("%-28s skipped: the stored logits alone need %.1f GiB\n", v.name, store_gib);
      continue;
    }
    train::StudentOptions so;
    so.tf32 = v.tf32;
    cuda::GpuStudentTuning tuning;
    tuning.flash = v.flash;
    tuning.store_logits = v.store_logits;
    tuning.prefill_bf16 = v.prefill_bf16;
    tuning.prefill_cudnn = v.prefill_cudnn;
    tuning.teacher_cudnn = v.teacher_cudnn;
    tuning.separate_selection = v.fused_selection ? 0 : 1;
    tuning.select_keys = v.select_keys;
    const bool first = vp == variants.front();
    if (first) tuning.profile_layer = c.n_layers / 2;
    std::unique_ptr<cuda::GpuStudent> sp;
    try {
      sp = std::make_unique<cuda::GpuStudent>(c, source, so, n_ctx + n_tgt, n_tgt, tuning);
    } catch (const std::exception& e) {  // e.g. no memory for the stored logits
      if (first) throw;                     // the reference variant must run
      std::printf("%-28s skipped: %s\n", v.name, e.what());
      continue;
    }
    cuda::GpuStudent& s = *sp;
    std::vector<double> ctx_ms, tea_ms, fwd_ms, loss_ms, bwd_ms, wall_ms;
    double loss = 0.0;
    std::vector<float> dz(n_gates);
    const int n_steps = (v.steps > 0 ? v.steps : args.steps) + 1;
    for (int step = 0; step < n_steps; ++step) {
      // Fresh tokens and gates per step; the last step's inputs are the same for every variant.
      const uint64_t seed = uint64_t(1000 + n_steps - 1 - step);
      std::vector<int32_t> ctx(static_cast<size_t>(n_ctx)), tgt(static_cast<size_t>(n_tgt));
      for (size_t i = 0; i < ctx.size(); ++i) ctx[i] = int32_t(mix(seed * 7919 + i) % uint64_t(c.vocab_size));
      for (size_t i = 0; i < tgt.size(); ++i) tgt[i] = int32_t(mix(seed * 7919 + 1000000 + i) % uint64_t(c.vocab_size));
      std::vector<float> z(n_gates);
      for (size_t i = 0; i < n_gates; ++i) z[i] = float(mix(seed * 31 + i) >> 40) / float(1 << 24);
      s.synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      s.set_context(ctx);
      s.teacher(tgt);
      loss = s.student(z, dz);
      const auto t1 = std::chrono::steady_clock::now();
      if (step == 0) continue;  // warm-up
      const cuda::GpuStudentTimes t = s.last_times();
      ctx_ms.push_back(t.context_ms);
      tea_ms.push_back(t.teacher_ms);
      fwd_ms.push_back(t.student_forward_ms);
      loss_ms.push_back(t.student_loss_ms);
      bwd_ms.push_back(t.student_backward_ms);
      if (first) layer_ops = t.layer_ops;  // the last step's
      wall_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    double diff = 0.0;
    if (dz_ref.empty()) {
      dz_ref = dz;
    } else {
      double num = 0, den = 0;
      for (size_t i = 0; i < n_gates; ++i) {
        num += double(dz[i] - dz_ref[i]) * (dz[i] - dz_ref[i]);
        den += double(dz_ref[i]) * dz_ref[i];
      }
      diff = std::sqrt(num / std::max(den, 1e-300));
    }
    const double gib = double(s.memory_bytes()) / double(1u << 30), dev_gib = device_used_gib();
    const std::string sdpa = v.prefill_cudnn || v.teacher_cudnn ? "  sdpa " + s.sdpa_backend() : "";
    std::printf("%-28s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %8.2f %8.2f %11.5g %9.2e%s\n", v.name, median(ctx_ms),
                median(tea_ms), median(fwd_ms), median(loss_ms), median(bwd_ms), median(wall_ms), gib, dev_gib, loss,
                diff, sdpa.c_str());
    std::fflush(stdout);
    results.push_back({{"variant", v.name}, {"sdpa", s.sdpa_backend()}, {"context_ms", median(ctx_ms)},
                       {"teacher_ms", median(tea_ms)},
                       {"student_forward_ms", median(fwd_ms)}, {"student_loss_ms", median(loss_ms)},
                       {"student_backward_ms", median(bwd_ms)}, {"step_wall_ms", median(wall_ms)},
                       {"memory_gib", gib}, {"device_used_gib", dev_gib}, {"device_used_before_gib", base_gib},
                       {"loss", loss}, {"dz_rel_diff_vs_first", diff}, {"steps", n_steps - 1}});
  }
  std::printf("ops of layer %d (last step of the first variant):\n", c.n_layers / 2);
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& [name, ms] : layer_ops) {
    std::printf("  %-40s %8.3f ms\n", name.c_str(), ms);
    ops.push_back({{"op", name}, {"ms", ms}});
  }
  if (!args.json_path.empty()) {
    nlohmann::json j = {{"bench", "train_step"}, {"gpu", cuda::device_info().name}, {"driver", bench::driver_string()},
                        {"shape", args.shape}, {"model", c.name}, {"context", n_ctx}, {"targets", n_tgt},
                        {"layers", c.n_layers}, {"params", c.n_params()}, {"results", results}, {"layer_ops", ops}};
    write_json_file(args.json_path, j);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_train_step: %s\n", e.what());
  return 1;
}
