// lychee eval: retrieval accuracy of each attention policy at equal KV bytes read.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>

#include <fmt/format.h>

#include "core/json_io.h"
#include "app.h"
#include "core/error.h"
#include "eval/runner.h"

namespace lychee::app {

namespace {

struct EvalArgs {
  ModelArgs model;
  PolicyArgs policy;
  std::vector<std::string> tasks = {"passkey", "niah_single", "niah_multikey", "niah_multivalue",
                                    "niah_multiquery", "vt", "cwe", "fwe"};
  std::vector<int> lengths = {1024};
  std::vector<double> depths = {0.1, 0.5, 0.9};
  std::vector<std::string> policies = {"full", "lychee", "tidal", "quest", "duo"};
  std::vector<int> budgets = {256};
  int samples = 1;
  uint64_t seed = 0;
  std::string haystack = "essays";
  bool coverage = false;
  std::string json_path, markdown_path;
  std::string command;
};

// Full attention once; every sparse policy once per budget. DuoAttention's streaming heads get
// the same number of tokens: a sink of min(64, budget/4) and the rest recent.
std::vector<PolicyOptions> expand_policies(const EvalArgs& a, const ModelConfig& c) {
  std::vector<PolicyOptions> out;
  for (const std::string& name : a.policies) {
    const PolicyKind kind = parse_policy_kind(name);
    if (kind == PolicyKind::kFull) {
      out.push_back(a.policy.options(c, kind));
      continue;
    }
    for (int budget : a.budgets) {
      PolicyArgs pa = a.policy;
      pa.budget = budget;
      PolicyOptions o = pa.options(c, kind);
      if (kind == PolicyKind::kDuo) {
        o.duo_sink = std::min(64, budget / 4);
        o.duo_recent = budget - o.duo_sink;
      }
      out.push_back(o);
    }
  }
  return out;
}

void run(const EvalArgs& a) {
  Engine engine(a.model.engine_options(&a.policy, a.policies));
  EvalConfig cfg;
  for (const std::string& t : a.tasks) cfg.tasks.push_back(parse_task_name(t));
  cfg.lengths = a.lengths;
  cfg.depths = a.depths;
  cfg.samples = a.samples;
  cfg.seed = a.seed;
  cfg.synthetic_haystack = a.haystack == "synthetic";
  cfg.correct_every = a.policy.correct_every;
  cfg.speculate = parse_speculate(a.policy.speculate);
  cfg.coverage = a.coverage;
  cfg.policies = expand_policies(a, engine.config());
  const auto records = run_eval(engine, cfg, [](const std::string& line) {
    std::fprintf(stderr, "%s\n", line.c_str());
  });
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  const nlohmann::json info = {{"command", a.command}, {"model", engine.config().name},
                               {"device", engine.device()}, {"date", date}, {"haystack", a.haystack},
                               {"kv_cache_dtype", kv_cache_dtype_name(engine.kv_cache_dtype())},
                               {"kv_bytes_note", engine.kv_cache_dtype() == KvCacheDtype::kFp8
                                                     ? "K and V bytes as FP8 pages hold them (1 byte per element and a "
                                                       "4-byte scale per token and KV head), summed over decode steps"
                                                     : "K and V bytes at 2 bytes per element (bf16 cache), summed over "
                                                       "decode steps"}};
  const std::string md = records_to_markdown(records);
  std::printf("%s", md.c_str());
  if (!a.json_path.empty()) write_json_file(a.json_path, records_to_json(records, info));
  if (!a.markdown_path.empty()) std::ofstream(a.markdown_path) << md;
}

}  // namespace

void register_eval(CLI::App& app) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* cmd = app.add_subcommand("eval", "Retrieval accuracy of attention policies at equal KV bytes read");
  const char* g = "Evaluation";
  cmd->add_option("--tasks", args->tasks, "Tasks (RULER-style; docs/cli.md lists them)")->delimiter(',')->group(g);
  cmd->add_option("--lengths", args->lengths, "Context lengths in tokens")->delimiter(',')->group(g);
  cmd->add_option("--depths", args->depths, "Needle depths in [0, 1]")->delimiter(',')->group(g);
  cmd->add_option("--policies", args->policies, "Policies to compare")->delimiter(',')->group(g);
  cmd->add_option("--budgets", args->budgets, "Token budgets for the sparse policies")->delimiter(',')->group(g);
  cmd->add_option("--samples", args->samples, "Samples per (task, length, depth)")->check(positive_int())->group(g);
  cmd->add_option("-s,--seed", args->seed, "Seed of the task generators")->group(g);
  cmd->add_option("--haystack", args->haystack, "essays (Paul Graham) or synthetic")
      ->check(CLI::IsMember({"essays", "synthetic"}))->group(g);
  cmd->add_flag("--coverage", args->coverage, "Also measure the attention mass each policy's tokens hold (CPU)")->group(g);
  cmd->add_option("--json", args->json_path, "Write every record and the aggregates as JSON")->group(g);
  cmd->add_option("--markdown", args->markdown_path, "Write the tables as Markdown")->group(g);
  args->model.add(*cmd);
  args->policy.add(*cmd, /*policy_option=*/false);
  args->policy.add_speculate(*cmd);
  cmd->callback([args, cmd] {
    args->command = command_line("eval", *cmd);
    run(*args);
  });
}

}  // namespace lychee::app
