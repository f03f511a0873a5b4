#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

#include <fmt/format.h>

#include "app.h"
#include "core/log.h"
#include "core/error.h"
#include "runtime/threads.h"

namespace lychee::app {

void ModelArgs::add(CLI::App& cmd, const std::string& ctx_help) {
  cmd.add_option("-m,--model", model, "Hugging Face model directory, GGUF file, or Hub id org/name[:QUANT] (local HF cache)")
      ->default_str("SmolLM2-135M-Instruct, from the models cache")->group(kGroupModel);
  cmd.add_option("--device", device, "cpu, cuda, or auto (the GPU when there is one)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))->group(kGroupModel);
  cmd.add_option("-c,--ctx-size", max_context, ctx_help)->check(non_negative_int())->group(kGroupModel);
  add_deprecated_alias(cmd, "--max-context", max_context, "-c/--ctx-size")->check(non_negative_int());
  cmd.add_option("--cpu-weights", cpu_weights, "CPU weights: native (GGUF blocks), f32 (reference), fp8, bf16")
      ->check(CLI::IsMember(kCpuWeightNames))->group(kGroupModel);
  cmd.add_option("--kv-memory", kv_memory_gib, "KV-cache pool in GiB (0 = sized from the context)")
      ->check(non_negative_real())->group(kGroupGpu);
  cmd.add_option("--kv-cache-dtype", kv_cache_dtype,
                 "KV cache: bf16, or fp8 (e4m3, a scale per token and head)")
      ->check(CLI::IsMember(kKvCacheDtypeNames))->group(kGroupModel);
  cmd.add_option("--weights", weights, "GPU linear weights: bf16 or fp8 (e4m3, a scale per row)")
      ->check(CLI::IsMember(kGpuWeightNames))->group(kGroupGpu);
  cmd.add_option("--fp8-selector-qkv", fp8_selector_qkv, "With FP8 weights: Q/K/V of the selecting layers bf16 or fp8")
      ->check(CLI::IsMember({"bf16", "fp8"}))->group(kGroupGpu);
  cmd.add_option("--tensor-parallel", tensor_parallel, "GPUs to split the model over (must divide the KV heads)")
      ->check(positive_int())->group(kGroupGpu);
  cmd.add_option("--n-gpu-layers", n_gpu_layers,
                 "Also -ngl (llama.cpp's): the whole model is on the GPU; 0 = --device cpu")
      ->default_str("not given")->check(non_negative_int())->group(kGroupGpu);
}

std::vector<DeprecatedAlias>& deprecated_aliases() {
  static std::vector<DeprecatedAlias> aliases;
  return aliases;
}

void warn_deprecated_options() {
  for (const DeprecatedAlias& a : deprecated_aliases())
    if (a.option->count() > 0) LY_LOG_WARN("{} is deprecated and will be removed: use {}", a.old_name, a.new_name);
}

WeightFormat parse_cpu_weights(const std::string& name) {
  return weight_format_from_name(name).value_or(WeightFormat::kF32);
}

KvCacheDtype parse_kv_cache_dtype(const std::string& name, const std::string& option) {
  const std::optional<KvCacheDtype> d = kv_cache_dtype_from_name(name);
  LY_CHECK(d.has_value(), ErrorCode::kInvalidArgument, "{}: must be bf16, fp8, auto (= bf16) or fp8_e4m3 (= fp8), got '{}'",
           option, name);
  return *d;
}

GpuWeightFormat parse_gpu_weights(const std::string& name) {
  return gpu_weight_format_from_name(name).value_or(GpuWeightFormat::kBf16);
}

std::string command_line(const std::string& name, const CLI::App& cmd) {
  std::string line = "lychee " + name;
  for (const auto& opt : cmd.get_options())
    for (const auto& r : opt->results()) line += fmt::format(" {} {}", opt->get_name(), r);
  return line;
}

EngineOptions ModelArgs::engine_options(const PolicyArgs* policy, std::vector<std::string> kinds) const {
  EngineOptions o;
  o.model_path = model;
  o.device = device;
  if (n_gpu_layers >= 0) {  // llama.cpp's layer offload count: lychee runs every layer on one device
    if (n_gpu_layers == 0) {
      LY_CHECK(device != "cuda", ErrorCode::kInvalidArgument,
               "-ngl 0 (no layers on the GPU) contradicts --device cuda");
      o.device = "cpu";
      LY_LOG_WARN("-ngl 0: lychee keeps the whole model on one device; running on the CPU (as --device cpu)");
    } else {
      LY_LOG_WARN("-ngl {}: lychee keeps the whole model on the GPU (when --device picks one); the layer count "
                  "has no other effect", n_gpu_layers);
    }
  }
  o.cpu_weights = parse_cpu_weights(cpu_weights);
  o.gpu_weights = parse_gpu_weights(weights);
  o.fp8_keep_selectors = fp8_selector_qkv == "bf16";
  o.kv_memory_gib = kv_memory_gib;
  o.kv_cache_dtype = parse_kv_cache_dtype(kv_cache_dtype);
  o.max_context = max_context;
  o.tensor_parallel = tensor_parallel;
  if (policy != nullptr) {
    if (kinds.empty()) kinds.push_back(policy->policy);
    o.policies = [args = *policy, kinds](const ModelConfig& c) {
      std::vector<DecodeSpec> specs;
      for (const std::string& k : kinds) specs.push_back(compile_policy(args.options(c, parse_policy_kind(k)), c));
      return specs;
    };
  }
  return o;
}

namespace {

// CLI11 hands validators the option's text; "" accepts it.
// `name` is what --help shows after the type (INT:NONNEGATIVE); `what` goes into the error.
CLI::Validator number_check(const std::string& what, const std::string& name, bool integer, double lo, bool lo_open,
                            double hi) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(text.c_str(), &end);
        const bool parsed = end != text.c_str() && *end == '\0' && errno == 0 && std::isfinite(v);
        const bool ok = parsed && (!integer || v == std::floor(v)) && (lo_open ? v > lo : v >= lo) && v <= hi;
        return ok ? std::string() : fmt::format("must be {}, got {}", what, text);
      },
      name);
}

}  // namespace

CLI::Validator positive_int() { return number_check("a positive integer", "POSITIVE", true, 0, true, 2147483647.0); }
CLI::Validator non_negative_int() { return number_check("a non-negative integer", "NONNEGATIVE", true, 0, false, 2147483647.0); }
CLI::Validator positive_real() { return number_check("a positive number", "POSITIVE", false, 0, true, HUGE_VAL); }
CLI::Validator non_negative_real() { return number_check("a number >= 0", "NONNEGATIVE", false, 0, false, HUGE_VAL); }
CLI::Validator real_between(double lo, double hi) {
  return number_check(fmt::format("a number from {} to {}", lo, hi), fmt::format("[{} - {}]", lo, hi), false, lo, false, hi);
}

void SamplingArgs::add(CLI::App& cmd) {
  cmd.add_option("-n,--max-tokens", max_tokens, "Most tokens to generate")->check(non_negative_int())->group(kGroupSampling);
  cmd.add_option("--temp", temperature, "Sampling temperature (0 = greedy)")->check(non_negative_real())->group(kGroupSampling);
  cmd.add_option("--top-k", top_k, "Keep the k most likely tokens (0 = off)")->check(non_negative_int())->group(kGroupSampling);
  cmd.add_option("--top-p", top_p, "Keep the smallest set with this probability (1 = off)")
      ->check(real_between(0.0, 1.0))->group(kGroupSampling);
  seed_option = cmd.add_option("-s,--seed", seed, "Sampling seed; --stats prints the one used")
                    ->default_str("random")->group(kGroupSampling);
}

GenerateOptions SamplingArgs::generate_options(const Engine& engine) const {
  GenerateOptions o;
  o.max_new_tokens = max_tokens;
  // Unseeded runs differ, as llama.cpp's and the server's do; 32 random bits, a seed one can retype.
  const uint64_t run_seed = seed_option != nullptr && seed_option->count() > 0 ? seed : uint64_t(std::random_device{}());
  o.sampling = SamplingParams{temperature, top_k, top_p, run_seed};
  o.sampling.validate();
  o.stop_ids = engine.tokenizer().stop_ids();
  return o;
}

void PolicyArgs::add(CLI::App& cmd, bool policy_option) {
  if (policy_option)
    cmd.add_option("--policy", policy, "Decode attention: full, lychee, tidal, quest, duo")
        ->check(CLI::IsMember({"full", "lychee", "tidal", "quest", "duo"}))->group(kGroupPolicy);
  cmd.add_option("--budget", budget, "Tokens a sparse head reads (lychee top-k, tidal, quest)")->check(positive_int())->group(kGroupPolicy);
  cmd.add_option("--block-size", block_size, "LycheeDecode selection unit in tokens (1 = token mode)")->check(positive_int())->group(kGroupPolicy);
  cmd.add_option("--select", select, "LycheeDecode selection: topk, topp, threshold, ratio")
      ->check(CLI::IsMember({"topk", "topp", "threshold", "ratio"}))->group(kGroupPolicy);
  cmd.add_option("--select-value", select_value, "p for topp, probability for threshold, fraction for ratio")->group(kGroupPolicy);
  cmd.add_option("--sink", sink, "First tokens every selection keeps")
      ->default_str("lychee 64, tidal/quest 0")->check(non_negative_int())->group(kGroupPolicy);
  cmd.add_option("--recent", recent, "Last tokens every selection keeps")
      ->default_str("lychee 256, tidal/quest 0")->check(non_negative_int())->group(kGroupPolicy);
  cmd.add_option("--heads", heads, "Head-role file (lychee, duo)")
      ->default_str("the layer stand-in")->check(CLI::ExistingFile)->group(kGroupPolicy);
  cmd.add_option("--tidal-layers", tidal_layers, "TidalDecode selection layers")
      ->default_str("2 and round(13/32 L)")->delimiter(',')->group(kGroupPolicy);
  cmd.add_option("--quest-page", quest_page, "Quest page size in tokens")->check(positive_int())->group(kGroupPolicy);
  cmd.add_option("--duo-sink", duo_sink, "DuoAttention streaming heads: sink tokens")->check(non_negative_int())->group(kGroupPolicy);
  cmd.add_option("--duo-recent", duo_recent, "DuoAttention streaming heads: recent tokens")->check(positive_int())->group(kGroupPolicy);
  cmd.add_option("--correct-every", correct_every, "Cache correction: dense re-prefill every N decoded tokens (0 = off)")
      ->check(non_negative_int())->group(kGroupPolicy);
}

void PolicyArgs::add_speculate(CLI::App& cmd) {
  cmd.add_option("--speculate", speculate,
                 "The policy drafts N tokens, Full verifies (Full's output); auto: N from the acceptance, plain where it loses")
      ->check([](const std::string& v) {
        try {
          parse_speculate(v);
        } catch (const Error& e) {
          return std::string(e.what());
        }
        return std::string();
      }, "off|N|auto")
      ->group(kGroupPolicy);
}

void PolicyArgs::apply(GenerateOptions& o) const {
  o.correct_every = correct_every;
  o.speculate = parse_speculate(speculate);
}

void print_speculation_stats(const GenerateResult& r) {
  const SpeculateStats& s = r.speculation;
  if (s.cycles == 0 && s.plain_steps == 0) return;
  std::fprintf(stderr, "[speculative: %llu cycles, %llu drafted, %llu accepted (acceptance %.1f%%), %llu plain steps; "
               "draft %.3f s, verify %.3f s, plain %.3f s]\n",
               (unsigned long long)s.cycles, (unsigned long long)s.drafted, (unsigned long long)s.accepted,
               100.0 * s.acceptance(), (unsigned long long)s.plain_steps, s.draft_seconds, s.verify_seconds,
               s.plain_seconds);
}

void print_kv_stats(const KvReadStats& s, const ModelConfig& c, KvCacheDtype dtype) {
  if (s.decode_steps == 0) return;
  const int64_t token_head_bytes = kv_bytes_per_token_head(dtype, c.head_dim);  // the GPU's pages
  const double per_step = double(s.kv_bytes_at(token_head_bytes)) / double(s.decode_steps);
  const double dense = double(s.dense_kv_bytes_at(token_head_bytes)) / double(s.decode_steps);
  std::fprintf(stderr, "[KV read per decode step: %.2f MB (%.1f%% of full attention's %.2f MB, %s cache)]\n",
               per_step / 1e6, 100.0 * per_step / dense, dense / 1e6, kv_cache_dtype_name(dtype));
}

TokenCallback print_tokens(const Tokenizer& tokenizer) {
  return [&tokenizer](int32_t token) {
    if (!tokenizer.is_special(token)) {
      const std::string piece = tokenizer.token_piece(token);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  };
}

}  // namespace lychee::app
