#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "app.h"
#include "core/log.h"
#include "runtime/threads.h"

namespace lychee::app {

void ModelArgs::add(CLI::App& cmd) {
  cmd.add_option("-m,--model", model, "Hugging Face model directory or GGUF file (default: SmolLM2-135M-Instruct)");
  cmd.add_option("--device", device, "cpu, cuda, or auto (the GPU when there is one)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd.add_option("--kv-memory", kv_memory_gib, "GPU KV-cache pool in GiB (default: sized from the context)")
      ->check(non_negative_real());
  cmd.add_option("--max-context", max_context, "GPU: longest sequence the KV pool serves (default: the model's)")
      ->check(non_negative_int());
  cmd.add_option("--tensor-parallel", tensor_parallel,
                 "GPUs to split the model over (devices 0..N-1; attention by KV heads, with each GPU holding the same "
                 "number of LycheeDecode retrieval heads per layer as far as the counts allow; the MLP by columns; "
                 "NCCL all-reduces; --kv-memory is then per GPU). N must divide the model's KV heads (docs/scaling.md)")
      ->check(positive_int());
  cmd.add_option("--threads", threads, "CPU compute threads for OpenMP and BLAS (default: the cores this process may use)")
      ->check(positive_int());
  cmd.add_option("--cpu-weights", cpu_weights,
                 "CPU weights: native (default) keeps a GGUF file's quantised matrices in their blocks (int8 "
                 "activations at decode, dequantised sgemm for long prompt chunks; costs in docs/results/cpu_default.md; "
                 "a safetensors file is f32 either way); f32 expands every weight to f32 (the reference); fp8 is f32 with the linear matrices rounded through FP8 e4m3 "
                 "per output channel (what FP8 weights give, for measuring their quality); bf16 is f32 with every matrix "
                 "rounded to bf16 (what the GPU's bf16 weights give)")
      ->check(CLI::IsMember(kCpuWeightNames));
  cmd.add_option("--weights", weights,
                 "GPU linear weights: bf16 (default) or fp8 = e4m3 with one scale per output channel, 1 byte per "
                 "weight (see ARCHITECTURE.md, FP8 weights); GPU only: on the CPU use --cpu-weights fp8")
      ->check(CLI::IsMember(kGpuWeightNames));
  cmd.add_option("--fp8-selector-qkv", fp8_selector_qkv,
                 "With FP8 weights (--weights fp8, --cpu-weights fp8): bf16 (default) keeps the Q/K/V projections of "
                 "the layers whose heads choose the tokens other heads read (LycheeDecode's retrieval heads, "
                 "TidalDecode's selection layers) unrounded, which keeps LycheeDecode's accuracy for ~3% more weight "
                 "bytes on the 8B shape; fp8 rounds them too")
      ->check(CLI::IsMember({"bf16", "fp8"}));
}

WeightFormat parse_cpu_weights(const std::string& name) {
  return weight_format_from_name(name).value_or(WeightFormat::kF32);
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
  set_compute_threads(threads);
  EngineOptions o;
  o.model_path = model;
  o.device = device;
  o.cpu_weights = parse_cpu_weights(cpu_weights);
  o.gpu_weights = parse_gpu_weights(weights);
  o.fp8_keep_selectors = fp8_selector_qkv == "bf16";
  o.kv_memory_gib = kv_memory_gib;
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
CLI::Validator number_check(const std::string& what, bool integer, double lo, bool lo_open, double hi) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(text.c_str(), &end);
        const bool parsed = end != text.c_str() && *end == '\0' && errno == 0 && std::isfinite(v);
        const bool ok = parsed && (!integer || v == std::floor(v)) && (lo_open ? v > lo : v >= lo) && v <= hi;
        return ok ? std::string() : fmt::format("must be {}, got {}", what, text);
      },
      what);
}

}  // namespace

CLI::Validator positive_int() { return number_check("a positive integer", true, 0, true, 2147483647.0); }
CLI::Validator non_negative_int() { return number_check("a non-negative integer", true, 0, false, 2147483647.0); }
CLI::Validator positive_real() { return number_check("a positive number", false, 0, true, HUGE_VAL); }
CLI::Validator non_negative_real() { return number_check("a number >= 0", false, 0, false, HUGE_VAL); }
CLI::Validator real_between(double lo, double hi) {
  return number_check(fmt::format("a number from {} to {}", lo, hi), false, lo, false, hi);
}

void SamplingArgs::add(CLI::App& cmd) {
  cmd.add_option("-n,--max-tokens", max_tokens, "Most tokens to generate")->check(non_negative_int());
  cmd.add_option("--temp", temperature, "Sampling temperature (0 = greedy)")->check(non_negative_real());
  cmd.add_option("--top-k", top_k, "Keep the k most likely tokens (0 = off)")->check(non_negative_int());
  cmd.add_option("--top-p", top_p, "Keep the smallest set with this probability (1 = off)")->check(real_between(0.0, 1.0));
  cmd.add_option("--seed", seed, "Random seed for sampling");
}

GenerateOptions SamplingArgs::generate_options(const Engine& engine) const {
  GenerateOptions o;
  o.max_new_tokens = max_tokens;
  o.sampling = SamplingParams{temperature, top_k, top_p, seed};
  o.sampling.validate();
  o.stop_ids = engine.tokenizer().stop_ids();
  return o;
}

void PolicyArgs::add(CLI::App& cmd, bool policy_option) {
  if (policy_option)
    cmd.add_option("--policy", policy, "Decode attention: full, lychee, tidal, quest, duo")
        ->check(CLI::IsMember({"full", "lychee", "tidal", "quest", "duo"}));
  cmd.add_option("--budget", budget, "Tokens a sparse head reads (lychee top-k, tidal, quest)")->check(positive_int());
  cmd.add_option("--block-size", block_size, "LycheeDecode selection unit in tokens (1 = token mode)")->check(positive_int());
  cmd.add_option("--select", select, "LycheeDecode selection: topk, topp, threshold, ratio")
      ->check(CLI::IsMember({"topk", "topp", "threshold", "ratio"}));
  cmd.add_option("--select-value", select_value, "p for topp, probability for threshold, fraction for ratio");
  cmd.add_option("--sink", sink, "First tokens every selection keeps (default: LycheeDecode 64, TidalDecode/Quest 0)")
      ->check(non_negative_int());
  cmd.add_option("--recent", recent, "Last tokens every selection keeps (default: LycheeDecode 256, TidalDecode/Quest 0)")
      ->check(non_negative_int());
  cmd.add_option("--heads", heads, "Head-role file (lychee, duo); default: the TidalDecode-matched stand-in")->check(CLI::ExistingFile);
  cmd.add_option("--tidal-layers", tidal_layers, "TidalDecode selection layers (default 2 and round(13/32 L))")->delimiter(',');
  cmd.add_option("--quest-page", quest_page, "Quest page size in tokens")->check(positive_int());
  cmd.add_option("--duo-sink", duo_sink, "DuoAttention streaming heads: sink tokens")->check(non_negative_int());
  cmd.add_option("--duo-recent", duo_recent, "DuoAttention streaming heads: recent tokens")->check(positive_int());
  cmd.add_option("--correct-every", correct_every, "Cache correction: dense re-prefill every N decoded tokens (0 = off)")
      ->check(non_negative_int());
}

void print_kv_stats(const KvReadStats& s, const ModelConfig& c) {
  if (s.decode_steps == 0) return;
  const double per_step = double(s.kv_bytes(c.head_dim)) / double(s.decode_steps);
  const double dense = double(s.dense_kv_bytes(c.head_dim)) / double(s.decode_steps);
  std::fprintf(stderr, "[KV read per decode step: %.2f MB (%.1f%% of full attention's %.2f MB, bf16 cache)]\n",
               per_step / 1e6, 100.0 * per_step / dense, dense / 1e6);
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
