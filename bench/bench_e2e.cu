// End-to-end decode time per output token (TPOT) on the GPU: a Llama-3-8B-shaped model with
// random weights (no checkpoint needed: decode time does not depend on the values), or a
// real checkpoint with -m, at several context lengths and batch sizes, for each attention policy
// through the hybrid-head kernel, against its bandwidth bound (weight bytes + the KV and metadata
// bytes the policy's kernels read per step) / measured copy bandwidth.
//   bench_e2e [--contexts 16384,32768,65536,131072] [--batches 1,4] [--steps 32] [--json FILE]
//             [--policies full,lychee,tidal,quest,duo] [--budget 4096] [--retrieval 32] [--trace] [--sync]
//             [--weights bf16,fp8] [--fp8-selector-qkv bf16|fp8]
// --weights: the GPU weight formats to run, in turn (default bf16; fp8 = e4m3 linear matrices with
// a scale per output channel, gpu_weights.h). Every row records its format; with bf16 run first,
// rows of other formats also get their speedup over Full attention with bf16 weights at the same
// batch and context (issue 16's target: LycheeDecode with FP8 weights >= 3x over Full with bf16
// at batch 1 and 128K on the 8B shape), printed at the end. FP8 weights keep the Q/K/V matrices
// of the layers where a policy run selects for other heads in bf16, as the engine does
// (fp8_keep_for, runtime/engine.h; --fp8-selector-qkv fp8 rounds them too).
// --trace: after the timed steps, the same number of steps again under a CUPTI activity trace;
// each row of the JSON gets its per-step summary (kernel time by name, device busy/idle, host
// synchronisations; bench/cupti_trace.h) and the table a line of the largest items.
// LycheeDecode and DuoAttention get --retrieval retrieval KV heads in all (layer 0's included,
// the rest drawn with a fixed seed from layers 1..); every sparse policy reads --budget tokens per
// sparse head (DuoAttention: sink 64 + recent budget - 64).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <random>

#include "attention/policies.h"
#include "core/json_io.h"
#include "cuda/common/common.h"
#include "cuda/runner/gpu_runner.h"
#include "cupti_trace.h"
#include "model/checkpoint.h"
#include "runtime/engine.h"

namespace {

using namespace lychee;

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) v.push_back(std::stoi(item));
  return v;
}

// The decode spec of a policy name for the model (the same compilers the engine uses);
// retrieval heads: layer 0 and a seeded draw.
struct BenchPolicy {
  DecodeSpec spec;
  int n_retrieval = 0;  // retrieval KV heads of LycheeDecode / DuoAttention
  int window = 0;       // DuoAttention: sink + recent
};

BenchPolicy make_policy(const std::string& name, const ModelConfig& c, int budget, int n_retrieval) {
  const int n_heads = c.n_layers * c.n_kv_heads;
  const HeadRoles roles = seeded_head_roles(c, std::clamp(n_retrieval, c.n_kv_heads, n_heads), 7);
  SelectParams select;
  select.budget = budget;
  if (name == "full") return {full_spec(c)};
  if (name == "lychee") return {lychee_spec(c, roles, 64, select), roles.n_retrieval()};
  if (name == "tidal") return {tidal_spec(c, budget, default_tidal_layers(c.n_layers), 2)};
  if (name == "quest") return {quest_spec(c, budget, 16, 2)};
  if (name == "duo") return {duo_spec(c, roles, 64, budget - 64), roles.n_retrieval(), budget};
  throw std::runtime_error("unknown policy " + name);
}

// Tokens of K/V (and Quest's metadata bytes) the policy's kernels read per step and sequence, as
// run: per-query-head selections (TidalDecode, Quest) read their sets once per query head.
std::pair<double, double> policy_reads(const std::string& name, const BenchPolicy& p, const ModelConfig& c,
                                       double n, int budget) {
  const double L = c.n_layers, KV = c.n_kv_heads, G = c.group_size(), B = std::min<double>(budget, n);
  if (name == "lychee" || name == "duo") {
    const double r = p.n_retrieval;
    return {r * n + (L * KV - r) * (name == "duo" ? std::min<double>(p.window, n) : B), 0.0};
  }
  if (name == "tidal") {  // dense layers, two dense selection layers, the rest per query head
    return {4 * KV * n + (L - 4) * KV * G * B, 0.0};
  }
  if (name == "quest") {
    const double meta = (L - 2) * KV * G * std::ceil(n / 16.0) * 2 * c.head_dim * 2;
    return {2 * KV * n + (L - 2) * KV * G * B, meta};
  }
  return {L * KV * n, 0.0};
}

std::vector<std::string> split_names(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) v.push_back(item);
  return v;
}

// One line of the trace summary per step: device busy/idle, host waits, the largest kernels.
void print_trace(const nlohmann::json& t) {
  std::printf("       trace per step: span %.0f us, busy %.0f us, idle %.0f us (%.1f gaps > 5 us), %.0f device ops;",
              t["span_us_per_step"].get<double>(), t["device_busy_us_per_step"].get<double>(),
              t["device_idle_us_per_step"].get<double>(), t["idle_gaps_over_5us_per_step"].get<double>(),
              t["device_activities_per_step"].get<double>());
  for (const auto& s : t["host_syncs"])
    std::printf(" %s x%.1f %.0f us;", s["name"].get<std::string>().c_str(), s["calls_per_step"].get<double>(),
                s["us_per_step"].get<double>());
  std::printf("\n");
  int shown = 0;
  for (const auto& k : t["device"]) {
    if (++shown > 8) break;
    std::printf("         %8.1f us x%5.1f  %.90s\n", k["us_per_step"].get<double>(), k["calls_per_step"].get<double>(),
                k["name"].get<std::string>().c_str());
  }
}

struct Options {
  std::string contexts = "16384,32768,65536,131072", batches = "1,4", json_path, model;
  std::string policies = "full,lychee,tidal,quest,duo", weights = "bf16", fp8_selector_qkv = "bf16";
  int steps = 32, budget = 4096, n_retrieval = 32;
  bool graphs = true, trace = false, sync_steps = false;
};

// Full attention's TPOT with bf16 weights per (batch, context): what the other formats' rows are
// compared with (speedup_vs_full_bf16).
using FullBf16 = std::map<std::pair<int, int>, double>;

// A command line bench_e2e does not take (exit status 2, as before it had a type).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

GpuWeightFormat parse_weights(const std::string& name) {
  if (name == "bf16") return GpuWeightFormat::kBf16;
  if (name == "fp8") return GpuWeightFormat::kFp8;
  throw UsageError("--weights: unknown format '" + name + "' (bf16, fp8)");
}

// Every policy of one (weights, batch, context) on one runner; a row per policy.
void run_policies(const Options& opt, cuda::GpuRunner& r, const cuda::GpuWeights& w, const ModelConfig& c,
                  const std::string& weights, int batch, int ctx, double bw, FullBf16& full_bf16,
                  nlohmann::json& rows) {
  double full_ms = 0.0;
  for (const std::string& name : split_names(opt.policies)) {
    const BenchPolicy pol = make_policy(name, c, opt.budget, opt.n_retrieval);
    std::vector<cuda::GpuSeq> seqs(static_cast<size_t>(batch));
    std::vector<cuda::GpuSeq*> ptrs;
    for (auto& s : seqs) {
      r.assume_filled(s, ctx);
      ptrs.push_back(&s);
    }
    try {
      r.set_policy(pol.spec);
      std::vector<int32_t> tokens(static_cast<size_t>(batch), 1000), out(static_cast<size_t>(batch));
      r.decode(ptrs, tokens);
      r.greedy(batch, out);
      // Steps as generate runs them: step i+1 queued before step i's tokens reach the host
      // (--sync: each step's tokens waited for before the next is queued, as before).
      auto run_steps = [&](int n) {
        cuda::Ticket last = r.greedy_async(batch);
        for (int i = 0; i < n; ++i) {
          r.decode(ptrs, {});
          const cuda::Ticket next = r.greedy_async(batch);
          if (opt.sync_steps) r.wait_tokens(next, out);
          r.wait_tokens(last, out);
          last = next;
        }
        r.wait_tokens(last, out);
      };
      run_steps(3);  // warm-up (captures the graph)
      const uint64_t stalls0 = r.host_stalls();
      const auto t0 = std::chrono::steady_clock::now();
      run_steps(opt.steps);
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / opt.steps;
      const uint64_t stalls = r.host_stalls() - stalls0;
      const double mean_ctx = ctx + 4 + opt.steps / 2.0;
      const auto [tokens_read, meta_bytes] = policy_reads(name, pol, c, mean_ctx, opt.budget);
      const double kv_bytes = double(batch) * (tokens_read * c.head_dim * 2.0 * 2.0 + meta_bytes);
      const double bytes = double(cuda::weight_bytes_per_step(w, batch)) + kv_bytes;
      const double bound_ms = bytes / (bw * 1e9) * 1e3;
      if (name == "full") full_ms = ms;
      if (name == "full" && weights == "bf16") full_bf16[{batch, ctx}] = ms;
      std::printf("%6d %8d %8s %10.3f %10.3f %9.1f%% %8.1f %8.2fx\n", batch, ctx, name.c_str(), ms, bound_ms,
                  100.0 * bound_ms / ms, batch * 1e3 / ms, full_ms > 0 ? full_ms / ms : 0.0);
      std::fflush(stdout);
      nlohmann::json row = {{"batch", batch}, {"context", ctx}, {"policy", name}, {"weights", weights},
                            {"tpot_ms", ms}, {"bound_ms", bound_ms},
                            {"weight_bytes", cuda::weight_bytes_per_step(w, batch)}, {"kv_bytes", kv_bytes},
                            {"tokens_per_s", batch * 1e3 / ms}, {"cuda_graphs", opt.graphs},
                            {"speedup_vs_full", full_ms > 0 ? full_ms / ms : 0.0},
                            {"host_stalls", stalls}, {"pipelined", !opt.sync_steps}};
      if (const auto it = full_bf16.find({batch, ctx}); it != full_bf16.end()) row["speedup_vs_full_bf16"] = it->second / ms;
      if (opt.trace) {
        bench::CuptiTrace t;
        t.start();
        run_steps(opt.steps);
        t.stop();
        row["trace"] = t.summary(opt.steps);
        print_trace(row["trace"]);
      }
      rows.push_back(row);
    } catch (const std::exception& e) {
      std::printf("%6d %8d %8s   skipped: %s\n", batch, ctx, name.c_str(), e.what());
      rows.push_back({{"batch", batch}, {"context", ctx}, {"policy", name}, {"weights", weights}, {"skipped", e.what()}});
    }
    for (auto& s : seqs) r.release(s);
  }
}

// Every batch and context with weights w (of format `weights`): a runner each.
void run_weights(const Options& opt, const std::shared_ptr<const cuda::GpuWeights>& w, const ModelConfig& c,
                 const std::string& weights, double bw, FullBf16& full_bf16, nlohmann::json& rows) {
  for (int batch : parse_list(opt.batches)) {
    for (int ctx : parse_list(opt.contexts)) {
      const double kv_gib =
          double(batch) * (ctx + opt.steps + 128) * 2.0 * c.n_layers * c.kv_dim() * 2 / double(1u << 30);
      size_t free_b = 0, total_b = 0;
      LY_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
      if (kv_gib * double(1u << 30) > double(free_b) - 3e9) {
        std::printf("%6d %8d   skipped: the KV cache needs %.1f GiB, %.1f GiB free\n", batch, ctx, kv_gib,
                    double(free_b) / (1u << 30));
        rows.push_back({{"batch", batch}, {"context", ctx}, {"weights", weights}, {"skipped", "KV cache does not fit"},
                        {"kv_gib", kv_gib}});
        continue;
      }
      cuda::RunnerOptions o;
      o.max_batch = batch;
      o.max_context = ctx + opt.steps + 128;
      o.kv_memory_gib = kv_gib + 0.01;
      o.cuda_graphs = opt.graphs;
      cuda::GpuRunner r(w, o);
      r.fill_kv_random(99);
      run_policies(opt, r, *w, c, weights, batch, ctx, bw, full_bf16, rows);
    }
  }
}

// The issue's comparison: each policy with non-bf16 weights against Full with bf16 weights.
void print_speedups(const nlohmann::json& rows) {
  for (const auto& row : rows)
    if (row.contains("speedup_vs_full_bf16") && row["weights"] != "bf16")
      std::printf("%s with %s weights vs full with bf16: batch %d, context %d: %.2fx\n",
                  row["policy"].get<std::string>().c_str(), row["weights"].get<std::string>().c_str(),
                  row["batch"].get<int>(), row["context"].get<int>(), row["speedup_vs_full_bf16"].get<double>());
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--contexts") o.contexts = next();
    else if (a == "--batches") o.batches = next();
    else if (a == "--steps") o.steps = std::stoi(next());
    else if (a == "--json") o.json_path = next();
    else if (a == "-m") o.model = next();
    else if (a == "--no-graphs") o.graphs = false;
    else if (a == "--trace") o.trace = true;
    else if (a == "--sync") o.sync_steps = true;
    else if (a == "--policies") o.policies = next();
    else if (a == "--budget") o.budget = std::stoi(next());
    else if (a == "--retrieval") o.n_retrieval = std::stoi(next());
    else if (a == "--weights") o.weights = next();
    else if (a == "--fp8-selector-qkv") o.fp8_selector_qkv = next();
    else throw UsageError("unknown argument " + a);
  }
  if (o.fp8_selector_qkv != "bf16" && o.fp8_selector_qkv != "fp8")
    throw UsageError("--fp8-selector-qkv: bf16 or fp8, got '" + o.fp8_selector_qkv + "'");
  if (split_names(o.weights).empty()) throw UsageError("--weights: expected bf16, fp8 or both (bf16,fp8)");
  for (const std::string& name : split_names(o.weights)) parse_weights(name);  // reject before loading anything
  return o;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options opt = parse_args(argc, argv);
  std::optional<Checkpoint> ck;
  if (!opt.model.empty()) ck.emplace(Checkpoint::open(opt.model));
  const ModelConfig c = ck ? ck->config() : llama3_8b_shape();
  const double bw = cuda::device_copy_bandwidth_gbps();
  const auto& dev = cuda::device_info();
  nlohmann::json rows = nlohmann::json::array(), weight_bytes = nlohmann::json::object(),
                 fp8_kept = nlohmann::json::object();
  FullBf16 full_bf16;
  for (const std::string& weights : split_names(opt.weights)) {
    const GpuWeightFormat format = parse_weights(weights);
    // One format's weights at a time (the 8B shape's bf16 weights are 16 GB).
    Fp8Keep keep;
    if (format == GpuWeightFormat::kFp8 && opt.fp8_selector_qkv == "bf16") {
      std::vector<DecodeSpec> specs;
      for (const std::string& name : split_names(opt.policies))
        specs.push_back(make_policy(name, c, opt.budget, opt.n_retrieval).spec);
      keep = fp8_keep_for(specs);
    }
    fp8_kept[weights] = keep.qkv_layers;
    const std::shared_ptr<const cuda::GpuWeights> w =
        ck ? cuda::upload_weights(*ck, format, keep) : cuda::random_weights(c, 1234, format, keep);
    weight_bytes[weights] = cuda::weight_bytes(*w);
    std::printf("%s, %d SMs; copy bandwidth %.0f GB/s; model %s (%.2f GB of %s weights)\n", dev.name, dev.sm_count,
                bw, c.name.c_str(), double(cuda::weight_bytes(*w)) / 1e9, weights.c_str());
    std::printf("%6s %8s %8s %10s %10s %10s %8s %9s\n", "batch", "context", "policy", "TPOT ms", "bound ms",
                "% bound", "tok/s", "vs full");
    run_weights(opt, w, c, weights, bw, full_bf16, rows);
  }
  print_speedups(rows);
  if (!opt.json_path.empty()) {
    int driver = 0;
    cudaDriverGetVersion(&driver);
    std::string command;
    for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
    const std::vector<std::string> formats = split_names(opt.weights);
    nlohmann::json j = {{"gpu", dev.name}, {"driver", driver}, {"copy_gbps", bw}, {"model", c.name},
                        {"weight_bytes", weight_bytes[formats.front()]}, {"weight_bytes_by_format", weight_bytes},
                        {"fp8_selector_qkv", opt.fp8_selector_qkv}, {"bf16_qkv_layers_by_format", fp8_kept},
                        {"weights", formats}, {"steps", opt.steps}, {"budget", opt.budget},
                        {"retrieval_kv_heads", opt.n_retrieval}, {"command", command},
                        {"commit", std::getenv("LYCHEE_COMMIT") ? std::getenv("LYCHEE_COMMIT") : "unknown"},
                        {"rows", rows}};
    write_json_file(opt.json_path, j);
  }
  return 0;
} catch (const UsageError& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_e2e: error: %s\n", e.what());
  return 1;
}
