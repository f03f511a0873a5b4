#include <cstdio>

#include "app.h"

namespace lychee::app {

void ModelArgs::add(CLI::App& cmd) {
  cmd.add_option("-m,--model", model, "Hugging Face model directory or GGUF file (default: SmolLM2-135M-Instruct)");
  cmd.add_option("--device", device, "Device to run on")->check(CLI::IsMember({"cpu"}));
}

EngineOptions ModelArgs::engine_options() const { return EngineOptions{model, device}; }

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
