// Shared pieces of the lychee CLI subcommands.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "attention/policies.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/policy_settings.h"

namespace lychee::app {

// Help groups, in the order subcommands list them (docs/cli.md describes each option at length).
inline constexpr const char* kGroupInput = "Input and output";
inline constexpr const char* kGroupModel = "Model";
inline constexpr const char* kGroupSampling = "Sampling";
inline constexpr const char* kGroupPolicy = "Attention policy";
inline constexpr const char* kGroupGpu = "GPU";
inline constexpr const char* kGroupServer = "Server";

struct ModelArgs {
  std::string model;          // -m: HF directory or GGUF file; "" = the default model
  std::string device = "auto";
  double kv_memory_gib = 0.0;
  std::string kv_cache_dtype = "bf16";  // --kv-cache-dtype: bf16 (auto) or fp8 (fp8_e4m3); core/kv_dtype.h
  int max_context = 0;        // -c/--ctx-size: the context in tokens; 0 = each command's default
  int n_gpu_layers = -1;      // -ngl: llama.cpp's option; -1 = not given (see engine_options)
  std::string cpu_weights = "native";  // CPU: native (quantised blocks, default), f32 (the reference), fp8 or bf16
  std::string weights = "bf16";     // GPU linear matrices: bf16 (default) or fp8 (e4m3, a scale per output channel)
  std::string fp8_selector_qkv = "bf16";  // FP8 weights: Q/K/V of the selecting layers bf16 (f32 on the CPU) or fp8
  int tensor_parallel = 1;    // GPUs the model is split over (KV heads and MLP; docs/scaling.md)
  // ctx_help: what -c means for this command (generate's KV capacity, perplexity's window, ...).
  void add(CLI::App& cmd, const std::string& ctx_help = "Longest sequence in tokens (0 = the model's context)");
  // `policy` with the policies `kinds` (default: its --policy) that will run: with --device auto
  // a policy the GPU has no form of (e.g. a LycheeDecode block that does not divide the KV page)
  // runs on the CPU.
  EngineOptions engine_options(const struct PolicyArgs* policy = nullptr, std::vector<std::string> kinds = {}) const;
};

struct SamplingArgs {
  int max_tokens = 128;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  const CLI::Option* seed_option = nullptr;  // -s/--seed; not given = a random seed per run
  void add(CLI::App& cmd);
  // The seed is --seed's, else drawn at random (std::random_device) for this run: what --stats
  // prints (options.sampling.seed) so the run can be repeated.
  GenerateOptions generate_options(const Engine& engine) const;
};

// The attention-policy options shared by generate, chat, eval and serve: the flags of
// PolicySettings (runtime/policy_settings.h, which maps them to PolicyOptions).
struct PolicyArgs : PolicySettings {
  void add(CLI::App& cmd, bool policy_option = true);
  // --speculate (generate, chat): the commands that decode through generate().
  void add_speculate(CLI::App& cmd);
  // The generation options' policy part: correct_every and speculate.
  void apply(GenerateOptions& o) const;
};

// Option checks whose errors read as a person writes numbers, e.g. "--budget: must be a
// positive integer, got 0" (CLI11 prefixes the option name).
CLI::Validator positive_int();
CLI::Validator non_negative_int();
CLI::Validator positive_real();
CLI::Validator non_negative_real();
CLI::Validator real_between(double lo, double hi);  // inclusive

// The names --cpu-weights (and perplexity's --base-cpu-weights) and --weights (--base-weights) admit.
inline const std::vector<std::string> kCpuWeightNames = weight_format_names();
inline const std::vector<std::string> kGpuWeightNames = gpu_weight_format_names();
// The formats behind those names (model/checkpoint.h's weight_format_from_name); the options'
// checks admit only them.
WeightFormat parse_cpu_weights(const std::string& name);
// --kv-cache-dtype's names (vLLM's: bf16, fp8, and their aliases auto and fp8_e4m3).
inline const std::vector<std::string> kKvCacheDtypeNames = {"bf16", "fp8", "auto", "fp8_e4m3"};
// Error(kInvalidArgument) naming `option` for a name outside kKvCacheDtypeNames.
KvCacheDtype parse_kv_cache_dtype(const std::string& name, const std::string& option = "--kv-cache-dtype");
GpuWeightFormat parse_gpu_weights(const std::string& name);

// A second, hidden name for an option that was renamed: `old_name` (e.g. "--ctx") sets `target`
// like `new_name` (e.g. "-c/--ctx-size") does, and its use is warned about once parsing is done
// (warn_deprecated_options).
template <typename T>
CLI::Option* add_deprecated_alias(CLI::App& cmd, const std::string& old_name, T& target, const std::string& new_name);
// Warns (log level warn) about every deprecated alias given on this command line; main() calls it.
void warn_deprecated_options();

// "lychee NAME" and every option given to cmd with its values: what results files record as the
// command that made them.
std::string command_line(const std::string& name, const CLI::App& cmd);

// Prints what decode steps read from the KV cache to stderr, in bytes of the GPU's pages of `dtype`.
void print_kv_stats(const KvReadStats& stats, const ModelConfig& c, KvCacheDtype dtype);
// Speculative decoding's counts (--stats), when it ran.
void print_speculation_stats(const GenerateResult& r);

// Streams generated tokens to stdout as UTF-8 text.
TokenCallback print_tokens(const Tokenizer& tokenizer);

void register_generate(CLI::App& app);
void register_chat(CLI::App& app);
void register_bench(CLI::App& app);
void register_inspect(CLI::App& app);
void register_eval(CLI::App& app);
void register_train(CLI::App& app);
void register_serve(CLI::App& app);
void register_perplexity(CLI::App& app);
void register_version(CLI::App& app);  // version and fetch-default

// The deprecated aliases of this run, for warn_deprecated_options.
struct DeprecatedAlias {
  const CLI::Option* option;
  std::string old_name, new_name;
};
std::vector<DeprecatedAlias>& deprecated_aliases();

template <typename T>
CLI::Option* add_deprecated_alias(CLI::App& cmd, const std::string& old_name, T& target, const std::string& new_name) {
  CLI::Option* o = cmd.add_option(old_name, target, "Deprecated: use " + new_name)->group("");  // "" = not in --help
  deprecated_aliases().push_back({o, old_name, new_name});
  return o;
}

}  // namespace lychee::app
