// One head-role training step on the GPU (cuda::GpuStudent): set_context + teacher + student
// (forward, loss, backward) for the default model's shapes (SmolLM2-135M: 30 layers, d 576, 9/3
// heads of 64, d_ff 1536, vocab 49152, tied embeddings) with random fp32 weights, per phase
// (CUDA events, median over steps after one warm-up), for several GpuStudent variants on the
// same inputs (dz of each compared with the first's). Nothing here depends on the weights'
// values but the selection, so random weights time what a real checkpoint would.
//   bench_train_step [--context 7292] [--targets 900] [--steps 6] [--layers 30] [--all] [--json FILE]
// Without --all only the default variant and stored logits run; the first variant also times the
// ops of one middle layer (CUDA events around each op).
// Napkin numbers for 7292 + 900 tokens: the prefill is ~1.6 TFLOP of projections plus ~1.9 TFLOP
// of causal attention; the student's attention rows move ~9 × 900 × 8192 × 4 B = 0.27 GB per
// pass over the logits, ~8 passes per layer (forward and backward), ~65 GB in all: ~25 ms at
// 2.6 TB/s.
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
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/json_io.h"
#include "cuda/common/common.h"
#include "cuda/train/student.h"
#include "model/config.h"

namespace {

using namespace lychee;

ModelConfig smollm2_shapes(int n_layers) {
  ModelConfig c;
  c.arch = Arch::kLlama;
  c.arch_label = "LlamaForCausalLM";
  c.name = "SmolLM2-135M shape, random fp32 weights";
  c.n_layers = n_layers; c.d_model = 576; c.n_heads = 9; c.n_kv_heads = 3; c.head_dim = 64;
  c.d_ff = 1536; c.vocab_size = 49152; c.max_context = 16384;
  c.rms_eps = 1e-5f; c.rope_theta = 100000.0f; c.tie_embeddings = true;
  return c;
}

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform values of the given standard deviation (the step's time does not depend on them).
std::vector<float> random_values(size_t n, uint64_t seed, float mean, float std) {
  std::vector<float> v(n);
  const float a = std * 1.7320508f;  // uniform on [-a, a] has this std
  for (size_t i = 0; i < n; ++i) v[i] = mean + a * (float(mix(seed * 0x100000001b3ull + i) >> 40) / float(1 << 24) * 2.0f - 1.0f);
  return v;
}

struct HostModel {
  std::map<std::pair<int, int>, std::vector<float>> w;  // (WeightId, layer)
  const float* get(WeightId id, int layer) const {
    if (id == WeightId::kOutput) id = WeightId::kTokEmbd;  // tied
    auto it = w.find({int(id), layer});
    return it == w.end() ? nullptr : it->second.data();
  }
};

HostModel random_model(const ModelConfig& c) {
  HostModel m;
  const size_t d = size_t(c.d_model), q = size_t(c.q_dim()), kv = size_t(c.kv_dim()), ff = size_t(c.d_ff);
  uint64_t seed = 1;
  auto put = [&](WeightId id, int layer, size_t n, float mean, float std) {
    m.w[{int(id), layer}] = random_values(n, seed++, mean, std);
  };
  put(WeightId::kTokEmbd, 0, size_t(c.vocab_size) * d, 0.0f, 0.5f);
  put(WeightId::kOutputNorm, 0, d, 1.0f, 0.1f);
  for (int l = 0; l < c.n_layers; ++l) {
    put(WeightId::kAttnNorm, l, d, 1.0f, 0.1f);
    put(WeightId::kWq, l, q * d, 0.0f, 0.06f);
    put(WeightId::kWk, l, kv * d, 0.0f, 0.06f);
    put(WeightId::kWv, l, kv * d, 0.0f, 0.04f);
    put(WeightId::kWo, l, d * q, 0.0f, 0.04f);
    put(WeightId::kFfnNorm, l, d, 1.0f, 0.1f);
    put(WeightId::kWGate, l, ff * d, 0.0f, 0.04f);
    put(WeightId::kWUp, l, ff * d, 0.0f, 0.04f);
    put(WeightId::kWDown, l, d * ff, 0.0f, 0.03f);
  }
  return m;
}

struct Variant {
  const char* name;
  bool tf32, flash, store_logits;
  int steps;  // 0: the --steps value
  bool always;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) try {
  int n_ctx = 7292, n_tgt = 900, steps = 6, n_layers = 30;
  bool all = false;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--context") n_ctx = std::stoi(next());
    else if (a == "--targets") n_tgt = std::stoi(next());
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--layers") n_layers = std::stoi(next());
    else if (a == "--json") json_path = next();
    else if (a == "--all") all = true;
    else { std::fprintf(stderr, "unknown argument %s\n", a.c_str()); return 2; }
  }
  const ModelConfig c = smollm2_shapes(n_layers);
  const HostModel host = random_model(c);
  const cuda::WeightSource source = [&host](WeightId id, int layer) { return host.get(id, layer); };
  const size_t n_gates = size_t(c.n_layers) * c.n_kv_heads;
  std::printf("%s on %s: context %d + %d targets, %d layers\n", c.name.c_str(), cuda::device_info().name, n_ctx,
              n_tgt, c.n_layers);

  const Variant variants[] = {{"tf32, flash prefill", true, true, false, 0, true},
                              {"tf32, flash, stored logits", true, true, true, 0, true},
                              {"tf32, materialised prefill", true, false, false, 0, false},
                              {"fp32 pedantic", false, false, false, 2, false}};
  std::vector<std::pair<std::string, double>> layer_ops;
  nlohmann::json results = nlohmann::json::array();
  std::vector<float> dz_ref;
  std::printf("%-28s %9s %9s %9s %9s %9s %9s %8s %11s %9s\n", "variant", "context", "teacher", "s.fwd", "s.loss",
              "s.bwd", "step", "GiB", "loss", "dz diff");
  for (const Variant& v : variants) {
    if (!v.always && !all) continue;
    train::StudentOptions so;
    so.tf32 = v.tf32;
    cuda::GpuStudentTuning tuning;
    tuning.flash = v.flash;
    tuning.store_logits = v.store_logits;
    if (&v == &variants[0]) tuning.profile_layer = c.n_layers / 2;
    cuda::GpuStudent s(c, source, so, n_ctx + n_tgt, n_tgt, tuning);
    std::vector<double> ctx_ms, tea_ms, fwd_ms, loss_ms, bwd_ms, wall_ms;
    double loss = 0.0;
    std::vector<float> dz(n_gates);
    const int n_steps = (v.steps > 0 ? v.steps : steps) + 1;
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
      if (&v == &variants[0]) layer_ops = t.layer_ops;  // the last step's
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
    const double gib = double(s.memory_bytes()) / double(1u << 30);
    std::printf("%-28s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %8.2f %11.5g %9.2e\n", v.name, median(ctx_ms),
                median(tea_ms), median(fwd_ms), median(loss_ms), median(bwd_ms), median(wall_ms), gib, loss, diff);
    std::fflush(stdout);
    results.push_back({{"variant", v.name}, {"context_ms", median(ctx_ms)}, {"teacher_ms", median(tea_ms)},
                       {"student_forward_ms", median(fwd_ms)}, {"student_loss_ms", median(loss_ms)},
                       {"student_backward_ms", median(bwd_ms)}, {"step_wall_ms", median(wall_ms)},
                       {"memory_gib", gib}, {"loss", loss}, {"dz_rel_diff_vs_first", diff},
                       {"steps", n_steps - 1}});
  }
  std::printf("ops of layer %d (last step of the first variant):\n", c.n_layers / 2);
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& [name, ms] : layer_ops) {
    std::printf("  %-40s %8.3f ms\n", name.c_str(), ms);
    ops.push_back({{"op", name}, {"ms", ms}});
  }
  if (!json_path.empty()) {
    nlohmann::json j = {{"bench", "train_step"}, {"gpu", cuda::device_info().name}, {"model", c.name},
                        {"context", n_ctx}, {"targets", n_tgt}, {"layers", c.n_layers}, {"results", results},
                        {"layer_ops", ops}};
    write_json_file(json_path, j);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_train_step: %s\n", e.what());
  return 1;
}
