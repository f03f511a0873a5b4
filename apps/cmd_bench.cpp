// lychee bench: prefill and decode throughput on this machine, beside the memory-bandwidth
// bound of a decode step (weight bytes + KV bytes read per token / measured read bandwidth),
// under any attention policy (the policy flags of generate; the KV bytes are what its decode
// steps actually read, as counted by the session).
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "core/json_io.h"
#include "app.h"
#include "core/error.h"
#include "core/timer.h"

namespace lychee::app {

namespace {

struct BenchArgs {
  ModelArgs model;
  PolicyArgs policy;
  int prompt_tokens = 512;
  int gen_tokens = 64;
  int repeats = 3;
  int batch = 1;
  std::string json_path;
  std::string random_weights;
};

void run_bench(const BenchArgs& a) {
  EngineOptions eo = a.model.engine_options(&a.policy);
  eo.random_shape = a.random_weights;
  Engine engine(eo);
  const ModelConfig& c = engine.config();
  const PolicyKind kind = parse_policy_kind(a.policy.policy);
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> pick(0, c.vocab_size - 1);
  std::vector<int32_t> prompt(size_t(a.prompt_tokens));
  for (auto& t : prompt) t = pick(rng);

  double best_prefill = 1e30, best_decode = 1e30;
  KvReadStats reads;
  std::string policy_name;
  for (int r = 0; r < a.repeats; ++r) {
    std::unique_ptr<Session> s = engine.new_session(a.prompt_tokens + a.gen_tokens);
    std::unique_ptr<AttentionPolicy> policy = make_policy(a.policy.options(c, kind), c);
    s->set_policy(policy.get());
    policy_name = policy != nullptr ? policy->name() : "full";
    GenerateOptions o;
    o.max_new_tokens = a.gen_tokens + 1;  // the first token comes from prefill
    o.correct_every = a.policy.correct_every;
    GenerateResult res = generate(*s, prompt, o);
    best_prefill = std::min(best_prefill, res.prefill_seconds);
    best_decode = std::min(best_decode, res.decode_seconds);
    reads = s->stats();
  }
  const double bw_gbps = engine.measure_bandwidth_gbps();
  const bool on_gpu = engine.device() == "cuda";
  const double prefill_tps = a.prompt_tokens / best_prefill;
  const double decode_tps = a.gen_tokens / best_decode;
  const double weight_bytes = double(engine.weight_bytes_per_token());
  // KV bytes read per decode step, as the last run's session counted them (f32 on the CPU, bf16 or
  // FP8 codes and scales on the GPU, --kv-cache-dtype; the policy's metadata and cache corrections
  // included).
  const int64_t token_head_bytes = engine.kv_bytes_per_token_head();
  const double steps = double(std::max<uint64_t>(reads.decode_steps, 1));
  const double kv_bytes = double(reads.kv_bytes_at(token_head_bytes)) / steps;
  const double dense_kv_bytes = double(reads.dense_kv_bytes_at(token_head_bytes)) / steps;
  const double bound_tps = bw_gbps * 1e9 / (weight_bytes + kv_bytes);

  std::printf("model          %s (%s, %.1f M params, %s)\n", c.name.c_str(), arch_name(c.arch),
              double(c.n_params()) / 1e6, engine.device().c_str());
  std::printf("prefill        %d tokens: %.1f tok/s (time to first token %.2f ms)\n", a.prompt_tokens,
              prefill_tps, best_prefill * 1e3);
  std::printf("decode         %d tokens after %d: %.2f tok/s (%.2f ms/token)\n", a.gen_tokens,
              a.prompt_tokens, decode_tps, 1e3 / decode_tps);
  std::printf("memory         %.1f GB/s (%s, measured)\n", bw_gbps,
              on_gpu ? "device-to-device copy, read + write" : "host streaming reads");
  std::printf("policy         %s: %.2f MB of KV read per step, %.1f%% of full attention's %.2f MB\n",
              policy_name.c_str(), kv_bytes / 1e6, 100.0 * kv_bytes / std::max(dense_kv_bytes, 1.0), dense_kv_bytes / 1e6);
  std::printf("decode bound   %.1f MB weights + %.1f MB KV per token -> %.2f tok/s; measured is %.0f%% of it\n",
              weight_bytes / 1e6, kv_bytes / 1e6, bound_tps, 100.0 * decode_tps / bound_tps);
  nlohmann::json batched;
  if (a.batch > 1) {
    std::unique_ptr<AttentionPolicy> policy = make_policy(a.policy.options(c, kind), c);
    const double secs = engine.time_batched_decode(a.batch, prompt, a.gen_tokens,
                                                   policy != nullptr ? &policy->spec() : nullptr);
    const double step_ms = secs / a.gen_tokens * 1e3;
    const double b_bytes = double(engine.weight_bytes_per_token()) + a.batch * kv_bytes;
    const double b_bound_ms = b_bytes / (bw_gbps * 1e9) * 1e3;
    std::printf("batch %-8d %d sequences of %d tokens: %.2f ms/step, %.1f tok/s; bound %.2f ms/step (%.0f%%)\n",
                a.batch, a.batch, a.prompt_tokens, step_ms, a.batch * 1e3 / step_ms, b_bound_ms,
                100.0 * b_bound_ms / step_ms);
    batched = {{"batch", a.batch}, {"step_ms", step_ms}, {"tok_s", a.batch * 1e3 / step_ms}, {"bound_ms", b_bound_ms}};
  }
  if (!a.json_path.empty()) {
    nlohmann::json j = {{"model", c.name}, {"device", engine.device()}, {"batched", batched},
                        {"kv_cache_dtype", kv_cache_dtype_name(engine.kv_cache_dtype())},
                        {"policy", policy_name}, {"dense_kv_bytes_per_token", dense_kv_bytes},
                        {"prompt_tokens", a.prompt_tokens}, {"gen_tokens", a.gen_tokens},
                        {"prefill_tok_s", prefill_tps}, {"decode_tok_s", decode_tps},
                        {"bandwidth_gbps", bw_gbps}, {"ttft_ms", best_prefill * 1e3},
                        {"weight_bytes_per_token", weight_bytes},
                        {"kv_bytes_per_token", kv_bytes}, {"decode_bound_tok_s", bound_tps}};
    write_json_file(a.json_path, j, 2);
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure prefill and decode speed against the bandwidth bound");
  const char* g = "Benchmark";
  cmd->add_option("--prompt-tokens", args->prompt_tokens, "Prompt length")->check(positive_int())->group(g);
  cmd->add_option("--gen-tokens", args->gen_tokens, "Tokens to decode")->check(positive_int())->group(g);
  cmd->add_option("--repeats", args->repeats, "Runs (the best is reported)")->check(positive_int())->group(g);
  cmd->add_option("--batch", args->batch, "Also time batched decode of this many sequences (GPU)")
      ->check(positive_int())->group(g);
  cmd->add_option("--json", args->json_path, "Also write the results as JSON to this file")->group(g);
  cmd->add_option("--random-weights", args->random_weights, "GPU only: a model of this shape with random weights")
      ->check(CLI::IsMember(model_shape_names()))->group(kGroupGpu);
  args->model.add(*cmd);
  args->policy.add(*cmd);
  cmd->callback([args] { run_bench(*args); });
}

}  // namespace lychee::app
