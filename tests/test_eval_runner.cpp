// The eval runner end to end: every policy that reads everything reproduces full attention's
// outputs, sparse budgets read fewer bytes, and the CLI writes its reports.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "eval/coverage.h"
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

// read_mass on a hand-computed case: scores 0, ln 2, ln 3, 0 (scale 1) give probabilities
// 1/7, 2/7, 3/7, 1/7.
TEST(EvalCoverage, ReadMassIsTheSoftmaxMassOfTheTokensRead) {
  const float ln2 = std::log(2.0f), ln3 = std::log(3.0f);
  const std::vector<float> q = {1.0f, 0.0f};
  const std::vector<float> k = {0.0f, 5.0f, ln2, -1.0f, ln3, 2.0f, 0.0f, 0.0f};  // [4, 2]
  HeadRead dense;
  EXPECT_EQ(read_mass(q.data(), k.data(), 2, 4, dense, 1.0f).covered, 1.0);
  HeadRead two{false, {0, 1}};
  const HeadMass m = read_mass(q.data(), k.data(), 2, 4, two, 1.0f);
  EXPECT_NEAR(m.covered, 3.0 / 7.0, 1e-6);
  EXPECT_NEAR(m.best, 5.0 / 7.0, 1e-6);  // tokens 2 and 1
  HeadRead all{false, {0, 1, 2, 3}};
  EXPECT_NEAR(read_mass(q.data(), k.data(), 2, 4, all, 1.0f).covered, 1.0, 1e-12);
  // The needle at tokens 1 and 2 (5/7 of the mass); the read set {0, 1} holds token 1 (2/7).
  const std::vector<int32_t> needle = {1, 2};
  const HeadMass n = read_mass(q.data(), k.data(), 2, 4, two, 1.0f, needle);
  EXPECT_NEAR(n.needle_full, 5.0 / 7.0, 1e-6);
  EXPECT_NEAR(n.needle_read, 2.0 / 7.0, 1e-6);
  EXPECT_NEAR(n.covered, 3.0 / 7.0, 1e-6);
  const HeadMass d = read_mass(q.data(), k.data(), 2, 4, dense, 1.0f, needle);
  EXPECT_NEAR(d.needle_read, 5.0 / 7.0, 1e-6);
  EXPECT_EQ(d.needle_read, d.needle_full);
}

// With --coverage every policy's record carries the mass it read: full attention and policies
// whose budget covers the context read all of it, small budgets less, never more than the best
// selection of as many tokens; the decisions (outputs) are the same as without the probe.
TEST(EvalRunner, CoverageMeasuresTheMassEachPolicyReads) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  Engine engine(EngineOptions{path, "cpu"});
  EvalConfig cfg = tiny_config(engine.config(), 16);
  cfg.tasks = {TaskKind::kPasskey};
  const auto plain = run_eval(engine, cfg);
  cfg.coverage = true;
  const auto probed = run_eval(engine, cfg);
  ASSERT_EQ(probed.size(), plain.size());
  for (size_t i = 0; i < probed.size(); ++i) {
    const EvalRecord& r = probed[i];
    EXPECT_EQ(r.output, plain[i].output) << r.policy_label;
    EXPECT_LT(plain[i].coverage, 0.0) << "not measured without --coverage";
    ASSERT_GT(r.decode_steps, 0);
    ASSERT_EQ(r.coverage_by_layer.size(), size_t(engine.config().n_layers)) << r.policy_label;
    EXPECT_LE(r.coverage, r.coverage_best + 1e-9) << r.policy_label;
    ASSERT_GE(r.needle_recall, 0.0) << r.policy_label << ": passkey has a needle";
    EXPECT_LE(r.needle_recall, 1.0 + 1e-12);
    if (r.policy == "full") {
      EXPECT_DOUBLE_EQ(r.coverage, 1.0);
      EXPECT_DOUBLE_EQ(r.needle_recall, 1.0);
    } else {
      EXPECT_LT(r.coverage, 0.999) << r.policy_label << " reads 16 of ~300 tokens per head";
      EXPECT_GT(r.coverage, 0.0) << r.policy_label;
    }
  }
  const nlohmann::json j = records_to_json(probed, nlohmann::json::object());
  const auto back = records_from_json(j);
  EXPECT_EQ(back[1].coverage, probed[1].coverage);
  EXPECT_EQ(back[1].coverage_by_layer, probed[1].coverage_by_layer);
  EXPECT_EQ(back[1].needle_recall, probed[1].needle_recall);
  EXPECT_EQ(j["summary"]["coverage"].size(), probed.size());
  EXPECT_NE(records_to_markdown(probed).find("Attention mass read"), std::string::npos);
  cfg.policies = tiny_config(engine.config(), 4096).policies;  // budgets past the context read everything
  for (const EvalRecord& r : run_eval(engine, cfg)) {
    EXPECT_NEAR(r.coverage, 1.0, 1e-9) << r.policy_label;
    EXPECT_NEAR(r.needle_recall, 1.0, 1e-9) << r.policy_label;
  }
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
