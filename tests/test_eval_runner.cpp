// The eval runner end to end: every policy that reads everything reproduces full attention's
// outputs, sparse budgets read fewer bytes, and the CLI writes its reports.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "eval/runner.h"
#include "test_util.h"

namespace lychee {
namespace {

EvalConfig tiny_config(const ModelConfig& c, int budget) {
  EvalConfig cfg;
  cfg.tasks = {TaskKind::kPasskey, TaskKind::kNiahSingle};
  cfg.lengths = {256};
  cfg.depths = {0.3};
  cfg.synthetic_haystack = true;
  PolicyOptions full, lychee, tidal, quest, duo;
  lychee.kind = PolicyKind::kLychee;
  lychee.block_size = 16;
  lychee.roles = head_roles_from_layers(c, {0});
  tidal.kind = PolicyKind::kTidal;
  quest.kind = PolicyKind::kQuest;
  duo.kind = PolicyKind::kDuo;
  duo.roles = head_roles_from_layers(c, {0});
  duo.duo_sink = 4;
  duo.duo_recent = budget;
  for (PolicyOptions* o : {&lychee, &tidal, &quest}) o->select.budget = budget;
  cfg.policies = {full, lychee, tidal, quest, duo};
  return cfg;
}

TEST(EvalRunner, PoliciesReadingEverythingReproduceFullAttention) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  Engine engine(EngineOptions{path, "cpu"});
  const auto records = run_eval(engine, tiny_config(engine.config(), 4096));
  ASSERT_EQ(records.size(), 2u * 5u);
  for (size_t i = 0; i < records.size(); ++i) {
    const EvalRecord& full = records[i / 5 * 5];
    EXPECT_EQ(records[i].output, full.output) << records[i].policy_label;
    EXPECT_EQ(records[i].score, full.score);
    EXPECT_EQ(records[i].decode_steps, full.decode_steps);
    EXPECT_GE(records[i].kv_bytes_read, full.kv_bytes_dense) << records[i].policy_label;
  }
  EXPECT_EQ(records[0].kv_bytes_read, records[0].kv_bytes_dense);
  EXPECT_GT(records[0].decode_steps, 0);
}

TEST(EvalRunner, SmallBudgetsReadLess) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  Engine engine(EngineOptions{path, "cpu"});
  const auto records = run_eval(engine, tiny_config(engine.config(), 16));
  ASSERT_EQ(records.size(), 2u * 5u);
  int n_checked = 0;
  for (const EvalRecord& r : records) {
    if (r.policy == "full" || r.decode_steps == 0) continue;
    EXPECT_LT(r.kv_bytes_read, r.kv_bytes_dense) << r.policy_label;
    ++n_checked;
  }
  EXPECT_EQ(n_checked, 2 * 4) << "every sparse policy of both tasks decodes at least one step";
}

TEST(EvalRunner, CliWritesJsonAndMarkdown) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  const std::string dir = std::filesystem::temp_directory_path() / "lychee_eval_cli";
  std::filesystem::create_directories(dir);
  const test::RunResult r = test::run_cli("eval --tasks passkey --lengths 256 --depths 0.5 "
                                          "--haystack synthetic --budgets 16,32 --block-size 8 --json " +
                                          dir + "/r.json --markdown " + dir + "/r.md");
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json j = test::read_json(dir + "/r.json");
  EXPECT_EQ(j["records"].size(), 1u + 4u * 2u);
  EXPECT_NE(read_text_file(dir + "/r.md").find("lychee topk 16 block 8"), std::string::npos);
  const test::RunResult bad = test::run_cli("eval --tasks nope");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.output.find("nope"), std::string::npos) << bad.output;
}

// The default model at a short length: full attention finds the pass key, and every policy runs.
TEST(EvalRunner, DefaultModelFindsThePassKey) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  Engine engine(EngineOptions{path, "cpu"});
  EvalConfig cfg;
  cfg.tasks = {TaskKind::kPasskey};
  cfg.lengths = {256};
  cfg.depths = {0.5};
  cfg.synthetic_haystack = true;
  PolicyOptions full, lychee;
  lychee.kind = PolicyKind::kLychee;
  lychee.select.budget = 128;
  lychee.block_size = 16;
  lychee.roles = default_head_roles(engine.config());
  cfg.policies = {full, lychee};
  const auto records = run_eval(engine, cfg);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].score, 1.0) << records[0].output;
  EXPECT_LT(records[1].kv_bytes_read, records[1].kv_bytes_dense);
}

}  // namespace
}  // namespace lychee
