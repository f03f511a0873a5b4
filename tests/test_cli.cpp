// The lychee binary end to end: good runs exit 0, bad input exits non-zero with one clear
// message on stderr, never a crash.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "test_util.h"
#include "tiny_checkpoint.h"

namespace lychee {
namespace {

using test::RunResult;
using test::run_cli;

// Text besides whitespace: what a generation printed.
bool has_text(const std::string& s) { return s.find_first_not_of(" \t\r\n") != std::string::npos; }

void expect_error(const RunResult& r, const std::string& message) {
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("lychee: error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
}

TEST(Cli, GeneratesFromAHuggingFaceDirectory) {
  const RunResult r = run_cli("generate -m " + test::golden_dir() + "/models/qwen3_tied_bf16 -p 'The quick' -n 4");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has_text(r.output)) << "no text generated";
}

// GGUF files (tests/golden/gguf): a Q4_K_M-style Qwen3 mix, Mistral written as llama, and a
// Qwen3 chat through the GGUF's own chat template.
TEST(Cli, GeneratesFromGgufFiles) {
  for (const char* file : {"qwen3_q4_k_m", "mistral_f32", "qwen2_q8_0"}) {
    const RunResult r = run_cli("generate -m " + test::golden_dir() + "/gguf/" + file + ".gguf -p 'The quick' -n 4");
    EXPECT_EQ(r.status, 0) << file << ": " << r.output;
    EXPECT_TRUE(has_text(r.output)) << file << ": no text generated";
  }
  const RunResult r = run_cli("chat -m " + test::golden_dir() + "/gguf/qwen3_bf16.gguf -p 'hello' -n 3");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has_text(r.output)) << "no reply";
}

TEST(Cli, ChatsWithATinyModel) {
  const RunResult r = run_cli("chat -m " + test::golden_dir() + "/models/qwen2_untied_f16 -p 'hello' -n 3");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has_text(r.output)) << "no reply";
}

// lychee bench takes the policy flags of generate; the KV bytes it reports are what the policy's
// steps read: all of them under full attention; under LycheeDecode (the default model, whose
// stand-in roles leave most heads sparse) a budget of 16 of a 64-token context reads less.
TEST(Cli, BenchTakesThePolicyFlags) {
  const std::string opts = " --prompt-tokens 64 --gen-tokens 4 --repeats 1 --device cpu ";
  const RunResult full = run_cli("bench -m " + test::golden_dir() + "/models/llama_tied_f32" + opts);
  EXPECT_EQ(full.status, 0) << full.output;
  EXPECT_NE(full.output.find("policy         full:"), std::string::npos) << full.output;
  EXPECT_NE(full.output.find("100.0% of full attention"), std::string::npos) << full.output;
  const RunResult bad = run_cli("bench" + opts + "--policy nonsense");  // refused by the option parser
  EXPECT_NE(bad.status, 0) << bad.output;
  EXPECT_NE(bad.output.find("--policy: nonsense not in"), std::string::npos) << bad.output;
  LY_REQUIRE_DEFAULT_MODEL(path);
  // No forced tokens: LycheeDecode's default 64 sink + 256 recent would cover this whole context.
  const RunResult lychee = run_cli("bench" + opts + "--policy lychee --budget 16 --block-size 16 --sink 0 --recent 0");
  EXPECT_EQ(lychee.status, 0) << lychee.output;
  EXPECT_NE(lychee.output.find("policy         lychee"), std::string::npos) << lychee.output;
  EXPECT_EQ(lychee.output.find("100.0% of full attention"), std::string::npos) << lychee.output;
}

// lychee heads overlap: the paper's Figure 1 measurement, its table on stdout and the JSON.
TEST(Cli, HeadsOverlapPrintsAndWritesTheMatrix) {
  const std::string json = test::temp_dir("cli_overlap") + "/overlap.json";
  const RunResult r = run_cli("heads overlap -m " + test::golden_dir() +
                              "/models/llama_tied_f32 --raw --prompt 'one two three four five six' -k 2 --json " + json);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("top-2 overlap of same-index heads in adjacent layers"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("layers  0-1"), std::string::npos) << r.output;
  const nlohmann::json j = test::read_json(json);
  ASSERT_EQ(j["cases"].size(), 1u);
  EXPECT_EQ(j["cases"][0]["k"], 2);
  EXPECT_FALSE(j["cases"][0]["overlap"].empty());
  const RunResult bad = run_cli("heads overlap -m " + test::golden_dir() + "/models/llama_tied_f32 --raw --prompt 'one' -k 9");
  expect_error(bad, "fewer than k = 9");
}

TEST(Cli, MissingModel) {
  expect_error(run_cli("generate -m /nonexistent/model -p hi"), "/nonexistent/model: no such file or directory");
}

TEST(Cli, CorruptCheckpoints) {
  const std::string dir = test::temp_dir("cli_bad");
  test::write_tiny_hf(dir + "/missing", test::tiny_llama_config_json(), {.drop = "model.layers.0.self_attn.v_proj.weight"});
  expect_error(run_cli("generate -m " + dir + "/missing -p hi"), "missing tensor 'model.layers.0.self_attn.v_proj.weight'");

  auto bytes = test::tiny_llama_gguf().build();
  bytes.resize(bytes.size() / 2);
  test::write_bytes(dir + "/cut.gguf", bytes);
  expect_error(run_cli("generate -m " + dir + "/cut.gguf -p hi"), "cut.gguf: ");

  test::write_bytes(dir + "/junk.gguf", {'G', 'G', 'U', 'F', 9, 0, 0, 0});
  expect_error(run_cli("inspect -m " + dir + "/junk.gguf"), "GGUF version 9 is not supported");
}

// Usage errors exit with CLI11's code for the kind of error (CLI::ExitCodes: 105 a value that
// fails validation, 106 a required argument missing, 109 an unexpected argument), or 1 where
// lychee checks the value itself; a crash (128 + signal) or any other code fails. The message
// names the option.
TEST(Cli, BadOptionsAreRejected) {
  RunResult r = run_cli("generate --temp -1 -p hi");
  EXPECT_TRUE(r.status == 105 || r.status == 1) << "status " << r.status << ": " << r.output;
  EXPECT_NE(r.output.find("--temp"), std::string::npos) << r.output;
  r = run_cli("generate --no-such-flag");
  EXPECT_EQ(r.status, 109) << r.output;
  EXPECT_NE(r.output.find("--no-such-flag"), std::string::npos) << r.output;
  r = run_cli("");
  EXPECT_EQ(r.status, 106) << r.output;
  EXPECT_NE(r.output.find("subcommand is required"), std::string::npos) << r.output;
}

TEST(Cli, PromptLongerThanTheContextIsACapacityError) {
  const RunResult r = run_cli("generate -m " + test::golden_dir() + "/models/llama_tied_f32 --ctx 4 -n 8 -p 'one two three four five six'");
  expect_error(r, "more than the context of 4 tokens");
  // A prompt that fits --ctx but leaves no room for the new tokens.
  const RunResult room = run_cli("generate -m " + test::golden_dir() + "/models/llama_tied_f32 --ctx 8 -n 8 -p 'one two'");
  expect_error(room, "cache slots");
}

// Over the model's own context (no --ctx): refused before any prefill (which would take minutes on
// the CPU), naming both lengths.
TEST(Cli, PromptLongerThanTheModelContextFailsBeforePrefill) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  const std::string file = test::temp_dir("cli_long") + "/prompt.txt";
  std::string words;
  for (int i = 0; i < 9000; ++i) words += "word ";
  test::write_bytes(file, std::vector<uint8_t>(words.begin(), words.end()));
  const auto start = std::chrono::steady_clock::now();
  const RunResult r = run_cli("generate --device cpu --prompt-file " + file + " -n 4");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  expect_error(r, "the prompt has 9001 tokens, more than the context of 8192 tokens");
  EXPECT_LT(seconds, 20.0) << "the check must come before the prefill";
}

TEST(Cli, DefaultModelAnswersAQuestion) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  const RunResult r = run_cli("chat -p 'What is the capital of France? Answer in one sentence.' -n 24");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("Paris"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace lychee
