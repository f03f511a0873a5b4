// End-to-end decode time per output token (TPOT) on the GPU: a Llama-3-8B-shaped model with
// random weights (no checkpoint needed: decode time does not depend on the values), another
// named shape with --shape (smollm2-135m: the default model's), or a real checkpoint with -m, at several context lengths and batch sizes, for each attention policy
// through the hybrid-head kernel, against its bandwidth bound (weight bytes + the KV and metadata
// bytes the policy's kernels read per step) / measured copy bandwidth.
//   bench_e2e [-m DIR | --shape llama3-8b|llama3-70b|smollm2-135m] [--contexts 16384,32768,65536,131072] [--batches 1,4] [--steps 32] [--json FILE]
//             [--policies full,lychee,tidal,quest,duo] [--budget 4096] [--block-size 64] [--retrieval 32] [--trace] [--sync]
//             [--weights bf16,fp8] [--fp8-selector-qkv bf16|fp8]
//             [--tensor-parallel 1,2] [--tp-rule permutation|contiguous] [--tp-lm-head split|rank0]
//             [--profile-attention] [--kv-cache-dtype bf16,fp8]
//   bench_e2e --prefill 32768[,65536] [--prefill-pass 2048,8192] [--reps 3] [--trace] [--json FILE]
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
// --tensor-parallel: the GPU counts to run, in turn (each a runner over that many GPUs, devices
// 0..N-1; the model sharded by KV heads with the assignment --tp-rule picks from LycheeDecode's
// roles, docs/scaling.md). A row's bound is then its slowest GPU's: that rank's weights (rank 0
// reads its vocabulary rows of the LM head, or with --tp-lm-head rank0 rank 0 all of it) and the KV its
// heads read. --tp-lm-head: split (the runner's default) or rank0. --profile-attention: each row also times every
// layer's attention on every GPU (median of 5 eager steps) and reports the slowest GPU against the
// mean per layer. Under TP at batch >= 2 each LycheeDecode row also records the attention balance
// the mirrored-row rule would give (attention/tp_rows.h: tp_assign_rows, tp_work_balance: KV tokens read per layer and
// GPU) beside the runner's (every row the same assignment), as "tp_rows_model".
// --prefill: instead of decode steps, the time to the first token of one prompt of each length
// (random token ids, batch 1, Full attention): the runner's prefill in passes of --prefill-pass
// tokens each (RunnerOptions::max_prefill_tokens; a runner per pass size, so they alternate in one
// run; LYCHEE_PREFILL_POW2 cuts them in powers of two, RunnerOptions::prefill_pow2_tail), then
// the greedy token on the host; a warm-up prompt first (cuDNN's plans, cuBLASLt's
// heuristics), the median of --reps. Rows give the prompt tokens/s and the TFLOP/s of the pass's
// products and causal attention (2 x the linear weights' elements per token, 4 x d x the
// attended pairs per query head and layer); --trace adds one more prompt under CUPTI and its
// kernel time by name (what a serving TTFT is made of: issue 37's prefill against vLLM's).
// --kv-cache-dtype: the KV cache element types to run (default bf16; fp8 = e4m3 codes with one
// f32 scale per token and KV head, core/kv_dtype.h), in turn for each batch and context (a runner
// each, so they alternate in one run). Rows record it; the KV bytes of the bound are the codes
// and scales read (d + 4 bytes per token and head for K and for V). A row of FP8 KV or FP8 weights
// also gets its speedup over Full with bf16 weights and bf16 KV at the same batch and context
// (issue 38's targets).
// LycheeDecode and DuoAttention get --retrieval retrieval KV heads in all (layer 0's included,
// the rest drawn with a fixed seed from layers 1..); every sparse policy reads --budget tokens per
// sparse head (DuoAttention: sink 64 + recent budget - 64); LycheeDecode selects in units of
// --block-size tokens (its selection unit; the engine's --block-size).
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
#include "attention/tp_assign.h"
#include "attention/tp_rows.h"
#include "core/json_io.h"
#include "cuda/common/common.h"
#include "cuda/common/nccl_comm.h"
#include "cuda/runner/gpu_runner.h"
#include "bench_env.h"
#include "cupti_trace.h"
#include "model/checkpoint.h"
#include "runtime/engine.h"

namespace {

using namespace lychee;

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  for (long long x : bench::parse_numbers(s)) v.push_back(int(x));
  return v;
}

// The decode spec of a policy name for the model (the same compilers the engine uses);
// retrieval heads: layer 0 and a seeded draw.
struct BenchPolicy {
  DecodeSpec spec;
  int n_retrieval = 0;  // retrieval KV heads of LycheeDecode / DuoAttention
  int window = 0;       // DuoAttention: sink + recent
};

BenchPolicy make_policy(const std::string& name, const ModelConfig& c, int budget, int n_retrieval, int block_size) {
  BenchPolicy p{bench::bench_policy(name, c, budget, n_retrieval, block_size)};
  if (name == "lychee" || name == "duo") p.n_retrieval = bench::bench_roles(c, n_retrieval).n_retrieval();
  if (name == "duo") p.window = budget;
  return p;
}

// Tokens of K/V (and Quest's metadata bytes) the policy's kernels read per step and sequence, as
// run: per-query-head selections (TidalDecode, Quest) read their sets once per query head.
// Under tensor parallelism, the part of one rank holding `rank_retrieval` of the retrieval heads
// (LycheeDecode, DuoAttention) and 1/n_gpus of every other policy's heads, which read alike.
std::pair<double, double> policy_reads(const std::string& name, const BenchPolicy& p, const ModelConfig& c,
                                       double n, int budget, int n_gpus = 1, int rank_retrieval = -1) {
  const double L = c.n_layers, KV = c.n_kv_heads, G = c.group_size(), B = std::min<double>(budget, n);
  if (name == "lychee" || name == "duo") {
    const double r = rank_retrieval >= 0 ? rank_retrieval : p.n_retrieval;
    return {r * n + (L * KV / n_gpus - r) * (name == "duo" ? std::min<double>(p.window, n) : B), 0.0};
  }
  if (n_gpus > 1) {
    const auto [tokens, meta] = policy_reads(name, p, c, n, budget);
    return {tokens / n_gpus, meta / n_gpus};
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

// The trace summary per step: device busy/idle, host waits, the largest kernels; with several
// GPUs, the same per GPU.
void print_trace_device(const nlohmann::json& t, const std::string& label) {
  std::printf("       %s: span %.0f us, busy %.0f us, idle %.0f us (%.1f gaps > 5 us), %.0f device ops\n", label.c_str(),
              t["span_us_per_step"].get<double>(), t["device_busy_us_per_step"].get<double>(),
              t["device_idle_us_per_step"].get<double>(), t["idle_gaps_over_5us_per_step"].get<double>(),
              t["device_activities_per_step"].get<double>());
  // Own time (PDL waits inside included) and exposed time (the share of the step's span).
  std::printf("         %8s    %8s   %5s\n", "own us", "exposed", "calls");
  int shown = 0;
  for (const auto& k : t["device"]) {
    if (++shown > 12) break;
    std::printf("         %8.1f us %8.1f us x%5.1f  %.90s\n", k["us_per_step"].get<double>(),
                k.value("exposed_us_per_step", 0.0), k["calls_per_step"].get<double>(),
                k["name"].get<std::string>().c_str());
  }
}

void print_trace(const nlohmann::json& t) {
  std::printf("       trace per step, host waits:");
  for (const auto& s : t["host_syncs"])
    std::printf(" %s x%.1f %.0f us;", s["name"].get<std::string>().c_str(), s["calls_per_step"].get<double>(),
                s["us_per_step"].get<double>());
  std::printf("\n");
  if (!t.contains("per_device")) return print_trace_device(t, "trace per step");
  for (const auto& d : t["per_device"])
    print_trace_device(d, "trace per step, GPU " + std::to_string(d["cuda_device"].get<int>()));
}

struct Options {
  std::string contexts = "16384,32768,65536,131072", batches = "1,4", json_path, model, shape = "llama3-8b";
  std::string policies = "full,lychee,tidal,quest,duo", weights = "bf16", fp8_selector_qkv = "bf16";
  std::string tensor_parallel = "1", tp_rule = "permutation", tp_lm_head = "split", kv_dtypes = "bf16";
  std::string prefill, prefill_pass = "2048";
  int steps = 32, budget = 4096, n_retrieval = 32, block_size = 64, reps = 3;
  bool graphs = true, trace = false, sync_steps = false, profile_attention = false;
};

// How the weights are split: over which GPUs, which KV heads each holds, and (per rank) the
// retrieval heads of LycheeDecode's roles it holds.
struct Split {
  int n_gpus = 1;
  std::vector<std::vector<int>> kv_heads;  // [rank]
  std::vector<int> retrieval;              // [rank]
  TpBalance balance;
  TpAssignment assignment;
  HeadRoles roles;
};

Split make_split(const Options& opt, const ModelConfig& c, int n_gpus) {
  Split s;
  s.n_gpus = n_gpus;
  const HeadRoles roles = bench::bench_roles(c, opt.n_retrieval);
  const TpAssignment a = tp_assign(c, roles, n_gpus, opt.tp_rule == "contiguous" ? TpRule::kContiguous : TpRule::kPermutation);
  s.kv_heads = tp_rank_heads(a);
  s.balance = tp_balance(a, roles);
  s.assignment = a;
  s.roles = roles;
  for (int g = 0; g < n_gpus; ++g) {
    int r = 0;
    for (int l = 0; l < c.n_layers; ++l)
      for (int h : s.kv_heads[size_t(g)]) r += roles.is_retrieval(l, h) ? 1 : 0;
    s.retrieval.push_back(r);
  }
  return s;
}

// The attention balance of LycheeDecode's roles at this batch under the runner's rule (every row
// the same assignment) and under mirrored rows, in KV tokens read per layer and GPU,
// with the attention weights each GPU would then hold (tp_rows.h); printed and put in the row.
nlohmann::json rows_model(const Split& split, const ModelConfig& c, int batch, double context, int budget) {
  nlohmann::json j;
  for (TpRowRule rule : {TpRowRule::kSame, TpRowRule::kMirrored}) {
    const TpRowAssignment a = tp_assign_rows(split.assignment, split.roles, batch, rule);
    const TpWorkBalance w = tp_work_balance(a, split.roles, int64_t(context), budget);
    const double attn_weights_gb = 2.0 * c.n_layers * c.d_model * (2.0 * c.q_dim() + 2.0 * c.kv_dim()) / 1e9;
    const int held = *std::max_element(w.groups_held.begin(), w.groups_held.end());
    j[tp_row_rule_name(rule)] = {{"worst_layer_max_over_mean", w.worst}, {"worst_layer", w.worst_layer},
                                 {"sum_max_over_sum_mean", w.sum_max / w.sum_mean}, {"shifts", a.shift},
                                 {"attention_weight_gb_per_gpu", attn_weights_gb * held / split.n_gpus}};
    std::printf("       attention balance model, %s rows: worst layer %.3f x the mean, layers' slowest sum %.3f x "
                "the mean; attention weights %.2f GB per GPU\n",
                tp_row_rule_name(rule), w.worst, w.sum_max / w.sum_mean, attn_weights_gb * held / split.n_gpus);
  }
  return j;
}

// Full attention's TPOT with bf16 weights per (batch, context): what the other formats' rows are
// compared with (speedup_vs_full_bf16).
using FullBf16 = std::map<std::pair<int, int>, double>;

// A command line bench_e2e does not take (exit status 2, as before it had a type).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

KvCacheDtype parse_kv_dtype(const std::string& name) {
  if (name == "bf16") return KvCacheDtype::kBf16;
  if (name == "fp8") return KvCacheDtype::kFp8;
  throw UsageError("--kv-cache-dtype: unknown type '" + name + "' (bf16, fp8)");
}

GpuWeightFormat parse_weights(const std::string& name) {
  if (name == "bf16") return GpuWeightFormat::kBf16;
  if (name == "fp8") return GpuWeightFormat::kFp8;
  throw UsageError("--weights: unknown format '" + name + "' (bf16, fp8)");
}

// Every policy of one (weights, batch, context) on one runner; a row per policy.
void run_policies(const Options& opt, cuda::GpuRunner& r, const cuda::ShardedWeights& ws, const Split& split,
                  const ModelConfig& c, const std::string& weights, const std::string& kv_dtype, int batch, int ctx,
                  double bw, FullBf16& full_bf16, nlohmann::json& rows) {
  const double kv_token_head_bytes = double(kv_bytes_per_token_head(parse_kv_dtype(kv_dtype), c.head_dim));
  double full_ms = 0.0;
  for (const std::string& name : bench::parse_names(opt.policies)) {
    const BenchPolicy pol = make_policy(name, c, opt.budget, opt.n_retrieval, opt.block_size);
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
      const cuda::TpStats tp0 = r.tp_stats();
      const auto t0 = std::chrono::steady_clock::now();
      run_steps(opt.steps);
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / opt.steps;
      const uint64_t stalls = r.host_stalls() - stalls0;
      const cuda::TpStats tp1 = r.tp_stats();
      const double mean_ctx = ctx + 4 + opt.steps / 2.0;
      // The slowest GPU's bytes: its weights (rank 0 alone reads the LM head) and its heads' KV.
      double bytes = 0, kv_total = 0;
      uint64_t weight_total = 0;
      for (int g = 0; g < split.n_gpus; ++g) {
        const auto [tokens_read, meta_bytes] =
            policy_reads(name, pol, c, mean_ctx, opt.budget, split.n_gpus, split.n_gpus > 1 ? split.retrieval[size_t(g)] : -1);
        const double kv = double(batch) * (tokens_read * kv_token_head_bytes * 2.0 + meta_bytes);
        uint64_t wb = cuda::weight_bytes_per_step(*ws[size_t(g)], batch);
        const uint64_t lm_head = uint64_t(c.vocab_size) * uint64_t(c.d_model) * 2;
        if (split.n_gpus > 1 && opt.tp_lm_head == "split") {  // each rank its V / N rows
          wb = wb - lm_head + uint64_t(tp_vocab_rows(c.vocab_size, split.n_gpus, g).count) * uint64_t(c.d_model) * 2;
        } else if (g > 0) {
          wb -= lm_head;  // rank 0 alone computes the LM head
        }
        bytes = std::max(bytes, double(wb) + kv);
        kv_total += kv;
        weight_total += wb;
      }
      const double bound_ms = bytes / (bw * 1e9) * 1e3;
      if (name == "full") full_ms = ms;
      if (name == "full" && weights == "bf16" && kv_dtype == "bf16" && split.n_gpus == 1) full_bf16[{batch, ctx}] = ms;
      std::printf("%3d %6d %8d %8s %4s %10.3f %10.3f %9.1f%% %8.1f %8.2fx\n", split.n_gpus, batch, ctx, name.c_str(),
                  kv_dtype.c_str(), ms, bound_ms, 100.0 * bound_ms / ms, batch * 1e3 / ms, full_ms > 0 ? full_ms / ms : 0.0);
      std::fflush(stdout);
      nlohmann::json row = {{"batch", batch}, {"context", ctx}, {"policy", name}, {"weights", weights},
                            {"kv_cache_dtype", kv_dtype},
                            {"tensor_parallel", split.n_gpus}, {"tpot_ms", ms}, {"bound_ms", bound_ms},
                            {"weight_bytes", weight_total}, {"kv_bytes", kv_total},
                            {"bound_bytes_slowest_gpu", bytes},
                            {"tokens_per_s", batch * 1e3 / ms}, {"cuda_graphs", opt.graphs},
                            {"speedup_vs_full", full_ms > 0 ? full_ms / ms : 0.0},
                            {"host_stalls", stalls}, {"pipelined", !opt.sync_steps}};
      if (const auto it = full_bf16.find({batch, ctx}); it != full_bf16.end()) row["speedup_vs_full_bf16"] = it->second / ms;
      static std::map<std::string, double> one_gpu;  // TPOT on one GPU per (weights, policy, batch, context)
      const std::string key =
          weights + "/" + kv_dtype + "/" + name + "/" + std::to_string(batch) + "/" + std::to_string(ctx);
      if (split.n_gpus == 1) one_gpu[key] = ms;
      else if (const auto it = one_gpu.find(key); it != one_gpu.end()) {
        row["tpot_over_one_gpu"] = ms / it->second;
        std::printf("       %d GPUs / 1 GPU, same policy: %.3f\n", split.n_gpus, ms / it->second);
      }
      if (split.n_gpus > 1) {
        row["tp_rule"] = opt.tp_rule;
        row["tp_lm_head"] = opt.tp_lm_head;
        row["lm_gathers_per_step"] = double(tp1.lm_gathers - tp0.lm_gathers) / opt.steps;
        row["tp_kv_heads"] = split.kv_heads;
        row["tp_retrieval_heads_per_gpu"] = split.retrieval;
        row["all_reduces_per_step"] = double(tp1.all_reduces - tp0.all_reduces) / opt.steps;
        row["all_reduce_payload_bytes_per_step"] = double(tp1.payload_bytes - tp0.payload_bytes) / opt.steps;
        row["all_reduce_wire_bytes_per_step"] = (tp1.wire_bytes - tp0.wire_bytes) / opt.steps;
        row["selection_bytes_between_gpus_per_step"] = 0;
        if (name == "lychee" && batch >= 2) row["tp_rows_model"] = rows_model(split, c, batch, mean_ctx, opt.budget);
      }
      if (opt.profile_attention) {
        // Median of 5 eager steps per (GPU, layer); the straggler against the mean per layer.
        std::vector<std::vector<std::vector<float>>> runs;
        for (int i = 0; i < 5; ++i) runs.push_back(r.profile_decode(ptrs, tokens));
        std::vector<std::vector<float>> med(runs[0].size(), std::vector<float>(size_t(c.n_layers)));
        double worst = 1.0, sum_max = 0, sum_mean = 0;
        int worst_layer = 0;
        for (size_t g = 0; g < med.size(); ++g)
          for (int l = 0; l < c.n_layers; ++l) {
            std::vector<float> v;
            for (const auto& run : runs) v.push_back(run[g][size_t(l)]);
            std::sort(v.begin(), v.end());
            med[g][size_t(l)] = v[v.size() / 2];
          }
        for (int l = 0; l < c.n_layers; ++l) {
          double mx = 0, mean = 0;
          for (const auto& gl : med) {
            mx = std::max(mx, double(gl[size_t(l)]));
            mean += gl[size_t(l)] / double(med.size());
          }
          sum_max += mx;
          sum_mean += mean;
          if (mean > 0 && mx / mean > worst) worst = mx / mean, worst_layer = l;
        }
        row["attention_ms"] = med;
        row["attention_worst_layer_max_over_mean"] = worst;
        row["attention_worst_layer"] = worst_layer;
        row["attention_sum_max_ms"] = sum_max;
        row["attention_sum_mean_ms"] = sum_mean;
        std::printf("       attention per layer (eager, median of 5): slowest GPU / mean worst %.3f (layer %d); "
                    "sum over layers: slowest %.3f ms, mean %.3f ms\n", worst, worst_layer, sum_max, sum_mean);
      }
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
      rows.push_back({{"batch", batch}, {"context", ctx}, {"policy", name}, {"weights", weights},
                      {"kv_cache_dtype", kv_dtype}, {"skipped", e.what()}});
    }
    for (auto& s : seqs) r.release(s);
  }
}

// One (weights, KV dtype, batch, context): a runner, every policy on it.
void run_one(const Options& opt, const cuda::ShardedWeights& ws, const Split& split, const ModelConfig& c,
             const std::string& weights, const std::string& kv_dtype, int batch, int ctx, double bw,
             FullBf16& full_bf16, nlohmann::json& rows) {
  const KvCacheDtype kvd = parse_kv_dtype(kv_dtype);
  // Per GPU: its KV heads' share of the cache.
  const double kv_gib = double(batch) * (ctx + opt.steps + 128) * 2.0 * c.n_layers * c.n_kv_heads *
                        double(kv_bytes_per_token_head(kvd, c.head_dim)) / double(1u << 30) / split.n_gpus;
  size_t least_free = SIZE_MAX;
  for (int g = 0; g < split.n_gpus; ++g) {
    size_t free_b = 0, total_b = 0;
    LY_CUDA_CHECK(cudaSetDevice(g));
    LY_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    least_free = std::min(least_free, free_b);
  }
  LY_CUDA_CHECK(cudaSetDevice(0));
  if (kv_gib * double(1u << 30) > double(least_free) - 3e9) {
    std::printf("%3d %6d %8d   skipped: the KV cache needs %.1f GiB per GPU, %.1f GiB free\n", split.n_gpus, batch,
                ctx, kv_gib, double(least_free) / (1u << 30));
    rows.push_back({{"batch", batch}, {"context", ctx}, {"weights", weights}, {"kv_cache_dtype", kv_dtype},
                    {"tensor_parallel", split.n_gpus}, {"skipped", "KV cache does not fit"}, {"kv_gib_per_gpu", kv_gib}});
    return;
  }
  cuda::RunnerOptions o;
  o.max_batch = batch;
  o.max_context = ctx + opt.steps + 128;
  o.kv_memory_gib = kv_gib + 0.01;
  o.cuda_graphs = opt.graphs;
  o.tp_split_lm_head = opt.tp_lm_head == "split";
  o.kv_cache_dtype = kvd;
  cuda::GpuRunner r(ws, o);
  r.fill_kv_random(99);
  run_policies(opt, r, ws, split, c, weights, kv_dtype, batch, ctx, bw, full_bf16, rows);
}

// Every batch and context with weights w (of format `weights`), each KV dtype in turn: a runner each.
void run_weights(const Options& opt, const cuda::ShardedWeights& ws, const Split& split, const ModelConfig& c,
                 const std::string& weights, double bw, FullBf16& full_bf16, nlohmann::json& rows) {
  for (int batch : parse_list(opt.batches))
    for (int ctx : parse_list(opt.contexts))
      for (const std::string& kv_dtype : bench::parse_names(opt.kv_dtypes))
        run_one(opt, ws, split, c, weights, kv_dtype, batch, ctx, bw, full_bf16, rows);
}

// --prefill: the time to the first token of one prompt per (pass size, length), one GPU, Full.
void run_prefill(const Options& opt, const cuda::ShardedWeights& ws, const ModelConfig& c, const std::string& weights,
                 nlohmann::json& rows) {
  // FLOPs of one prompt: the linear products (2 per weight element and token: Q/K/V/O, gate/up/down;
  // the LM head for the last token only) and causal attention (QK^T and PV, 2 x 2 x d per pair).
  const double linear =
      double(c.n_layers) * (double(c.d_model) * (2.0 * c.q_dim() + 2.0 * c.kv_dim()) + 3.0 * c.d_model * double(c.d_ff));
  // Info lines: what the prefill chose (e.g. LYCHEE_PREFILL_AUTOTUNE's plan per graph) on stderr.
  bench::show_info_logs();
  std::printf("%8s %8s %10s %10s %10s %10s\n", "prompt", "pass", "TTFT ms", "tok/s", "TFLOP/s", "min ms");
  for (int pass : parse_list(opt.prefill_pass))
    for (int len : parse_list(opt.prefill)) {
      cuda::RunnerOptions o;
      o.max_batch = 1;
      o.max_context = len + 64;
      o.max_prefill_tokens = pass;
      o.kv_memory_gib = double(len + 192) * 2.0 * c.n_layers * c.n_kv_heads *
                            double(kv_bytes_per_token_head(KvCacheDtype::kBf16, c.head_dim)) / double(1u << 30) +
                        0.01;
      o.cuda_graphs = opt.graphs;
      nlohmann::json row = {{"mode", "prefill"}, {"prompt_tokens", len}, {"pass_tokens", pass}, {"weights", weights},
                            {"policy", "full"}, {"batch", 1}};
      try {
        cuda::GpuRunner r(ws, o);
        // What the runner took (its lab knobs LYCHEE_PREFILL_TOKENS / LYCHEE_PREFILL_POW2 override).
        row["pass_tokens"] = r.options().max_prefill_tokens;
        row["pow2_tail"] = r.options().prefill_pow2_tail;
        row["attn_pow2_tail"] = r.options().prefill_attn_pow2_tail;
        std::mt19937 rng(7);
        std::uniform_int_distribution<int32_t> tok(0, c.vocab_size - 1);
        std::vector<int32_t> prompt(static_cast<size_t>(len));
        for (auto& t : prompt) t = tok(rng);
        std::vector<int32_t> out(1);
        auto one = [&] {
          cuda::GpuSeq s;
          const auto t0 = std::chrono::steady_clock::now();
          r.prefill(s, prompt);
          r.greedy(1, out);  // waits for the token on the host: the prompt's last pass is done
          const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          r.release(s);
          return ms;
        };
        one();  // warm-up: the pass shapes' plans and heuristics
        std::vector<double> ms;
        for (int i = 0; i < opt.reps; ++i) ms.push_back(one());
        std::sort(ms.begin(), ms.end());
        const double med = ms[ms.size() / 2];
        const double L = len;
        const double flops = 2.0 * linear * L + 2.0 * c.d_model * double(c.vocab_size) +
                             4.0 * c.head_dim * double(c.n_heads) * c.n_layers * (L * (L + 1) / 2);
        std::printf("%8d %8d %10.1f %10.0f %10.1f %10.1f\n", len, pass, med, L * 1e3 / med, flops / (med * 1e-3) / 1e12,
                    ms.front());
        std::fflush(stdout);
        row["ttft_ms"] = med;
        row["ttft_ms_all"] = ms;
        row["prompt_tok_s"] = L * 1e3 / med;
        row["flops"] = flops;
        row["tflops"] = flops / (med * 1e-3) / 1e12;
        if (opt.trace) {
          bench::CuptiTrace t;
          t.start();
          one();
          t.stop();
          row["trace"] = t.summary(1);
          print_trace(row["trace"]);
        }
      } catch (const std::exception& e) {
        std::printf("%8d %8d   skipped: %s\n", len, pass, e.what());
        row["skipped"] = e.what();
      }
      rows.push_back(row);
    }
}

// The issue's comparison: each policy with non-bf16 weights against Full with bf16 weights.
void print_speedups(const nlohmann::json& rows) {
  for (const auto& row : rows)
    if (row.contains("speedup_vs_full_bf16") && (row["weights"] != "bf16" || row["kv_cache_dtype"] != "bf16"))
      std::printf("%s with %s weights, %s KV vs full with bf16 weights and KV: batch %d, context %d: %.2fx\n",
                  row["policy"].get<std::string>().c_str(), row["weights"].get<std::string>().c_str(),
                  row["kv_cache_dtype"].get<std::string>().c_str(), row["batch"].get<int>(), row["context"].get<int>(),
                  row["speedup_vs_full_bf16"].get<double>());
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
    else if (a == "--shape") o.shape = next();
    else if (a == "--no-graphs") o.graphs = false;
    else if (a == "--trace") o.trace = true;
    else if (a == "--sync") o.sync_steps = true;
    else if (a == "--policies") o.policies = next();
    else if (a == "--budget") o.budget = std::stoi(next());
    else if (a == "--block-size") o.block_size = std::stoi(next());
    else if (a == "--retrieval") o.n_retrieval = std::stoi(next());
    else if (a == "--weights") o.weights = next();
    else if (a == "--fp8-selector-qkv") o.fp8_selector_qkv = next();
    else if (a == "--tensor-parallel") o.tensor_parallel = next();
    else if (a == "--tp-rule") o.tp_rule = next();
    else if (a == "--tp-lm-head") o.tp_lm_head = next();
    else if (a == "--profile-attention") o.profile_attention = true;
    else if (a == "--kv-cache-dtype") o.kv_dtypes = next();
    else if (a == "--prefill") o.prefill = next();
    else if (a == "--prefill-pass") o.prefill_pass = next();
    else if (a == "--reps") o.reps = std::stoi(next());
    else throw UsageError("unknown argument " + a);
  }
  if (o.tp_lm_head != "rank0" && o.tp_lm_head != "split")
    throw UsageError("--tp-lm-head: split or rank0, got '" + o.tp_lm_head + "'");
  if (o.tp_rule != "permutation" && o.tp_rule != "contiguous")
    throw UsageError("--tp-rule: permutation or contiguous, got '" + o.tp_rule + "'");
  for (int n : parse_list(o.tensor_parallel))
    if (n < 1) throw UsageError("--tensor-parallel: GPU counts must be >= 1");
  if (o.block_size < 1 || o.block_size > o.budget)
    throw UsageError("--block-size: a unit of 1.." + std::to_string(o.budget) + " tokens (the budget), got " +
                     std::to_string(o.block_size));
  if (o.fp8_selector_qkv != "bf16" && o.fp8_selector_qkv != "fp8")
    throw UsageError("--fp8-selector-qkv: bf16 or fp8, got '" + o.fp8_selector_qkv + "'");
  if (bench::parse_names(o.weights).empty()) throw UsageError("--weights: expected bf16, fp8 or both (bf16,fp8)");
  for (const std::string& name : bench::parse_names(o.weights)) parse_weights(name);  // reject before loading anything
  if (bench::parse_names(o.kv_dtypes).empty()) throw UsageError("--kv-cache-dtype: expected bf16, fp8 or both (bf16,fp8)");
  for (const std::string& name : bench::parse_names(o.kv_dtypes)) parse_kv_dtype(name);
  if (!o.prefill.empty()) {
    for (int n : parse_list(o.prefill))
      if (n < 1) throw UsageError("--prefill: prompt lengths must be >= 1 token");
    for (int n : parse_list(o.prefill_pass))
      if (n < 1 || n > 65536) throw UsageError("--prefill-pass: 1 to 65536 tokens per pass");
    if (parse_list(o.prefill).empty() || parse_list(o.prefill_pass).empty())
      throw UsageError("--prefill / --prefill-pass: expected comma-separated token counts");
    if (o.reps < 1) throw UsageError("--reps: expected >= 1");
    if (parse_list(o.tensor_parallel) != std::vector<int>{1}) throw UsageError("--prefill: one GPU (--tensor-parallel 1)");
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options opt = parse_args(argc, argv);
  std::optional<Checkpoint> ck;
  if (!opt.model.empty()) ck.emplace(Checkpoint::open(opt.model));
  const ModelConfig c = ck ? ck->config() : model_shape(opt.shape);
  const double bw = cuda::device_copy_bandwidth_gbps();
  const auto& dev = cuda::device_info();
  nlohmann::json rows = nlohmann::json::array(), weight_bytes = nlohmann::json::object(),
                 fp8_kept = nlohmann::json::object();
  FullBf16 full_bf16;
  for (const std::string& weights : bench::parse_names(opt.weights)) {
    const GpuWeightFormat format = parse_weights(weights);
    // One format's weights at a time (the 8B shape's bf16 weights are 16 GB).
    Fp8Keep keep;
    if (format == GpuWeightFormat::kFp8 && opt.fp8_selector_qkv == "bf16") {
      std::vector<DecodeSpec> specs;
      for (const std::string& name : bench::parse_names(opt.policies))
        specs.push_back(make_policy(name, c, opt.budget, opt.n_retrieval, opt.block_size).spec);
      keep = fp8_keep_for(specs);
    }
    fp8_kept[weights] = keep.qkv_layers;
    for (int n_gpus : parse_list(opt.tensor_parallel)) {
      const Split split = make_split(opt, c, n_gpus);
      cuda::ShardedWeights ws;
      if (n_gpus == 1) {
        ws.push_back(ck ? cuda::upload_weights(*ck, format, keep) : cuda::random_weights(c, 1234, format, keep));
      } else {
        cuda::TpPlan plan;
        for (int g = 0; g < n_gpus; ++g) plan.devices.push_back(g);
        plan.kv_heads = split.kv_heads;
        ws = cuda::shard_weights(ck ? &*ck : nullptr, c, 1234, format, keep, plan);
      }
      size_t total = 0;
      for (const auto& w : ws) total += cuda::weight_bytes(*w);
      weight_bytes[weights] = total;
      std::printf("%s, %d SMs; copy bandwidth %.0f GB/s; model %s (%.2f GB of %s weights", dev.name, dev.sm_count, bw,
                  c.name.c_str(), double(total) / 1e9, weights.c_str());
      if (n_gpus > 1) {
        std::printf(" over %d GPUs, %s split; retrieval heads per GPU", n_gpus, opt.tp_rule.c_str());
        for (int r : split.retrieval) std::printf(" %d", r);
        std::printf("; straggler's dense heads per step %d, bound %d", split.balance.sum_max, split.balance.sum_bound);
      }
      if (!opt.prefill.empty()) {  // one GPU (parse_args)
        std::printf(")\n");
        run_prefill(opt, ws, c, weights, rows);
        continue;
      }
      std::printf(")\n%3s %6s %8s %8s %4s %10s %10s %10s %8s %9s\n", "tp", "batch", "context", "policy", "kv",
                  "TPOT ms", "bound ms", "% bound", "tok/s", "vs full");
      run_weights(opt, ws, split, c, weights, bw, full_bf16, rows);
    }
  }
  print_speedups(rows);
  if (!opt.json_path.empty()) {
    int driver = 0;
    cudaDriverGetVersion(&driver);
    std::string command;
    for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
    const std::vector<std::string> formats = bench::parse_names(opt.weights);
    nlohmann::json j = {{"gpu", dev.name}, {"driver", driver}, {"copy_gbps", bw}, {"model", c.name},
                        {"weight_bytes", weight_bytes[formats.front()]}, {"weight_bytes_by_format", weight_bytes},
                        {"fp8_selector_qkv", opt.fp8_selector_qkv}, {"bf16_qkv_layers_by_format", fp8_kept},
                        {"weights", formats}, {"kv_cache_dtypes", bench::parse_names(opt.kv_dtypes)}, {"steps", opt.steps}, {"budget", opt.budget}, {"block_size", opt.block_size},
                        {"retrieval_kv_heads", opt.n_retrieval}, {"command", command},
                        {"tensor_parallel", parse_list(opt.tensor_parallel)}, {"nccl", cuda::nccl_version()},
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
