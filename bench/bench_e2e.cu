// End-to-end decode time per output token (TPOT) on the GPU: a Llama-3-8B-shaped model with
// random bf16 weights (no checkpoint needed: decode time does not depend on the values), or a
// real checkpoint with -m, at several context lengths and batch sizes, against the bandwidth
// bound (weight bytes + KV bytes read per step) / measured copy bandwidth.
//   bench_e2e [--contexts 16384,32768,65536,131072] [--batches 1,4] [--steps 32] [--json FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda/common.h"
#include "cuda/gpu_runner.h"
#include "model/checkpoint.h"

namespace {

using namespace lychee;

ModelConfig llama3_8b() {
  ModelConfig c;
  c.arch = Arch::kLlama;
  c.arch_label = "LlamaForCausalLM";
  c.name = "Llama-3-8B shape, random bf16 weights";
  c.n_layers = 32; c.d_model = 4096; c.n_heads = 32; c.n_kv_heads = 8; c.head_dim = 128;
  c.d_ff = 14336; c.vocab_size = 128256; c.max_context = 131072 + 1024;
  c.rms_eps = 1e-5f; c.rope_theta = 500000.0f;
  return c;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) v.push_back(std::stoi(item));
  return v;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string contexts = "16384,32768,65536,131072", batches = "1,4", json_path, model;
  int steps = 32;
  bool graphs = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--contexts") contexts = next();
    else if (a == "--batches") batches = next();
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--json") json_path = next();
    else if (a == "-m") model = next();
    else if (a == "--no-graphs") graphs = false;
    else { std::fprintf(stderr, "unknown argument %s\n", a.c_str()); return 2; }
  }
  std::shared_ptr<const cuda::GpuWeights> w;
  ModelConfig c;
  if (model.empty()) {
    c = llama3_8b();
    w = cuda::random_weights(c, 1234);
  } else {
    const Checkpoint ck = Checkpoint::open(model);
    c = ck.config();
    w = cuda::upload_weights(ck);
  }
  const double bw = cuda::device_copy_bandwidth_gbps();
  const auto& dev = cuda::device_info();
  std::printf("%s, %d SMs; copy bandwidth %.0f GB/s; model %s (%.2f GB of weights)\n", dev.name, dev.sm_count, bw,
              c.name.c_str(), double(cuda::weight_bytes(*w)) / 1e9);
  std::printf("%6s %8s %10s %10s %10s %8s\n", "batch", "context", "TPOT ms", "bound ms", "% bound", "tok/s");
  nlohmann::json rows = nlohmann::json::array();
  for (int batch : parse_list(batches)) {
    for (int ctx : parse_list(contexts)) {
      const double kv_gib = double(batch) * (ctx + steps + 128) * 2.0 * c.n_layers * c.kv_dim() * 2 / double(1u << 30);
      size_t free_b = 0, total_b = 0;
      LY_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
      if (kv_gib * double(1u << 30) > double(free_b) - 3e9) {
        std::printf("%6d %8d   skipped: the KV cache needs %.1f GiB, %.1f GiB free\n", batch, ctx, kv_gib,
                    double(free_b) / (1u << 30));
        rows.push_back({{"batch", batch}, {"context", ctx}, {"skipped", "KV cache does not fit"}, {"kv_gib", kv_gib}});
        continue;
      }
      cuda::RunnerOptions o;
      o.max_batch = batch;
      o.max_context = ctx + steps + 128;
      o.kv_memory_gib = kv_gib + 0.01;
      o.cuda_graphs = graphs;
      cuda::GpuRunner r(w, o);
      r.fill_kv_random(99);
      std::vector<cuda::GpuSeq> seqs(static_cast<size_t>(batch));
      std::vector<cuda::GpuSeq*> ptrs;
      for (auto& s : seqs) {
        r.assume_filled(s, ctx);
        ptrs.push_back(&s);
      }
      std::vector<int32_t> tokens(static_cast<size_t>(batch), 1000), out(static_cast<size_t>(batch));
      r.decode(ptrs, tokens);
      r.greedy(batch, out);
      for (int i = 0; i < 3; ++i) {  // warm-up (captures the graph)
        r.decode(ptrs, {});
        r.greedy(batch, out);
      }
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < steps; ++i) {
        r.decode(ptrs, {});
        r.greedy(batch, out);
      }
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
      const double mean_ctx = ctx + 4 + steps / 2.0;
      const double kv_bytes = double(batch) * mean_ctx * c.n_layers * c.kv_dim() * 2.0 * 2.0;
      const double bytes = double(cuda::weight_bytes_per_step(*w, batch)) + kv_bytes;
      const double bound_ms = bytes / (bw * 1e9) * 1e3;
      std::printf("%6d %8d %10.3f %10.3f %9.1f%% %8.1f\n", batch, ctx, ms, bound_ms, 100.0 * bound_ms / ms, batch * 1e3 / ms);
      rows.push_back({{"batch", batch}, {"context", ctx}, {"tpot_ms", ms}, {"bound_ms", bound_ms},
                      {"weight_bytes", cuda::weight_bytes_per_step(*w, batch)}, {"kv_bytes", kv_bytes},
                      {"tokens_per_s", batch * 1e3 / ms}, {"cuda_graphs", graphs}});
    }
  }
  if (!json_path.empty()) {
    int driver = 0;
    cudaDriverGetVersion(&driver);
    nlohmann::json j = {{"gpu", dev.name}, {"driver", driver}, {"copy_gbps", bw}, {"model", c.name},
                        {"weight_bytes", cuda::weight_bytes(*w)}, {"steps", steps}, {"rows", rows}};
    std::ofstream(json_path) << j.dump(1) << "\n";
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_e2e: error: %s\n", e.what());
  return 1;
}
