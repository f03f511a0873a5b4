// Shared pieces of the lychee CLI subcommands.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "runtime/engine.h"
#include "runtime/generate.h"

namespace lychee::app {

struct ModelArgs {
  std::string model;          // -m: HF directory or GGUF file; "" = default model
  std::string device = "cpu";
  void add(CLI::App& cmd);
  EngineOptions engine_options() const;
};

struct SamplingArgs {
  int max_tokens = 128;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  void add(CLI::App& cmd);
  GenerateOptions generate_options(const Engine& engine) const;
};

// Streams generated tokens to stdout as UTF-8 text.
TokenCallback print_tokens(const Tokenizer& tokenizer);

void register_generate(CLI::App& app);
void register_chat(CLI::App& app);
void register_bench(CLI::App& app);
void register_inspect(CLI::App& app);

}  // namespace lychee::app
