#include <cstdio>

#include <fmt/format.h>

#include "app.h"
#include "core/log.h"

namespace lychee::app {

void ModelArgs::add(CLI::App& cmd) {
  cmd.add_option("-m,--model", model, "Hugging Face model directory or GGUF file (default: SmolLM2-135M-Instruct)");
  cmd.add_option("--device", device, "cpu, cuda, or auto (the GPU when there is one)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd.add_option("--kv-memory", kv_memory_gib, "GPU KV-cache pool in GiB (default: sized from the context)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--max-context", max_context, "GPU: longest sequence the KV pool serves (default: the model's)")
      ->check(CLI::NonNegativeNumber);
}

namespace {

// Why the GPU's hybrid-head kernel cannot run these policy options, or "" when it can.
std::string gpu_unsupported(const PolicyArgs& p, int page_size) {
  auto fits = [&](int unit) { return unit >= 16 && unit <= page_size && page_size % unit == 0 && (unit & (unit - 1)) == 0; };
  if (p.block_size != 1 && !fits(p.block_size)) return fmt::format("--block-size {}", p.block_size);
  if (!fits(p.quest_page)) return fmt::format("quest page {}", p.quest_page);
  return "";
}

}  // namespace

EngineOptions ModelArgs::engine_options(const PolicyArgs* policy) const {
  EngineOptions o;
  o.model_path = model;
  o.device = device;
  if (policy != nullptr && device == "auto") {
    const std::string why = gpu_unsupported(*policy, o.page_size);
    if (!why.empty()) {
      LY_LOG_INFO("{} has no GPU form (the hybrid-head kernel reads blocks of 16 to {} tokens): using --device cpu",
                  why, o.page_size);
      o.device = "cpu";
    }
  }
  o.kv_memory_gib = kv_memory_gib;
  o.max_context = max_context;
  return o;
}

void SamplingArgs::add(CLI::App& cmd) {
  cmd.add_option("-n,--max-tokens", max_tokens, "Most tokens to generate")->check(CLI::NonNegativeNumber);
  cmd.add_option("--temp", temperature, "Sampling temperature (0 = greedy)")->check(CLI::NonNegativeNumber);
  cmd.add_option("--top-k", top_k, "Keep the k most likely tokens (0 = off)")->check(CLI::NonNegativeNumber);
  cmd.add_option("--top-p", top_p, "Keep the smallest set with this probability (1 = off)")->check(CLI::Range(0.0, 1.0));
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
  cmd.add_option("--budget", budget, "Tokens a sparse head reads (lychee top-k, tidal, quest)")->check(CLI::PositiveNumber);
  cmd.add_option("--block-size", block_size, "LycheeDecode selection unit in tokens (1 = token mode)")->check(CLI::PositiveNumber);
  cmd.add_option("--select", select, "LycheeDecode selection: topk, topp, threshold, ratio")
      ->check(CLI::IsMember({"topk", "topp", "threshold", "ratio"}));
  cmd.add_option("--select-value", select_value, "p for topp, probability for threshold, fraction for ratio");
  cmd.add_option("--sink", sink, "LycheeDecode: first tokens always kept")->check(CLI::NonNegativeNumber);
  cmd.add_option("--recent", recent, "LycheeDecode: last tokens always kept")->check(CLI::NonNegativeNumber);
  cmd.add_option("--heads", heads, "Head-role file (lychee, duo); default: the TidalDecode-matched stand-in")->check(CLI::ExistingFile);
  cmd.add_option("--tidal-layers", tidal_layers, "TidalDecode selection layers (default 2 and round(13/32 L))")->delimiter(',');
  cmd.add_option("--quest-page", quest_page, "Quest page size in tokens")->check(CLI::PositiveNumber);
  cmd.add_option("--duo-sink", duo_sink, "DuoAttention streaming heads: sink tokens")->check(CLI::NonNegativeNumber);
  cmd.add_option("--duo-recent", duo_recent, "DuoAttention streaming heads: recent tokens")->check(CLI::PositiveNumber);
  cmd.add_option("--correct-every", correct_every, "Cache correction: dense re-prefill every N decoded tokens (0 = off)")
      ->check(CLI::NonNegativeNumber);
}

PolicyOptions PolicyArgs::options(const ModelConfig& c, PolicyKind kind) const {
  PolicyOptions o;
  o.kind = kind;
  o.block_size = block_size;
  o.select.strategy = parse_select_strategy(select);
  o.select.budget = budget;
  o.select.value = select_value;
  o.select.sink = sink;
  o.select.recent = recent;
  if (!heads.empty() && (kind == PolicyKind::kLychee || kind == PolicyKind::kDuo)) {
    o.roles = load_head_roles(heads, c);
    if (o.roles->model.contains("name") && o.roles->model["name"] != c.name)
      LY_LOG_INFO("{}: written for '{}', used with '{}' (same shape)", heads,
                  o.roles->model["name"].get<std::string>(), c.name);
  }
  o.tidal_layers = tidal_layers;
  o.quest_page = quest_page;
  o.duo_sink = duo_sink;
  o.duo_recent = duo_recent;
  o.validate(c);
  return o;
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
