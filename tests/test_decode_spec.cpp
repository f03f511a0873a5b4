// The one description of a policy (attention/decode_spec.h): what each compiler writes, the
// validation of malformed specs, and the selection-count rule against select_units. Pure host
// code: runs everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "attention/decode_spec.h"
#include "attention/policies.h"
#include "core/error.h"
#include "spec_test_util.h"
#include "test_util.h"

namespace lychee {
namespace {

ModelConfig shape(int n_layers = 6, int n_heads = 8, int n_kv_heads = 2, int head_dim = 64) {
  return test::model_shape(n_layers, n_heads, n_kv_heads, head_dim);
}
using test::roles_of;

const HeadSpec kDense{ReadKind::kDense, ScoreKind::kNone};
const HeadSpec kGroup{ReadKind::kDense, ScoreKind::kGroupMean};
const HeadSpec kSet{ReadKind::kSet, ScoreKind::kNone};

TEST(DecodeSpec, FullReadsEverythingWithOnePattern) {
  const DecodeSpec s = full_spec(shape());
  EXPECT_FALSE(s.sparse());
  ASSERT_EQ(s.patterns.size(), 1u);
  for (int l = 0; l < 6; ++l) EXPECT_EQ(s.layer(l), std::vector<HeadSpec>(2, kDense)) << l;
  EXPECT_EQ(s.metadata_bytes(3, 1000), 0u);
}

TEST(DecodeSpec, LycheeRetrievalHeadsScoreSparseHeadsReadTheirIndexAndTheLastLayerDoesNotScore) {
  const ModelConfig c = shape(4);
  SelectParams sel;
  sel.budget = 256;
  sel.sink = 4;
  const DecodeSpec s = lychee_spec(c, roles_of(c, {{1, 1}, {1, 0}, {0, 0}, {0, 1}}), 16, sel);
  EXPECT_TRUE(s.sparse());
  EXPECT_EQ(s.name, "lychee");
  EXPECT_EQ(s.unit_option, "--block-size");
  EXPECT_EQ(s.scope, SetScope::kKvHead);
  EXPECT_EQ(s.unit, 16);
  EXPECT_EQ(s.select.budget, 256);
  EXPECT_EQ(s.select.sink, 4);
  EXPECT_FLOAT_EQ(s.prob_scale, 1.0f / 8.0f);
  EXPECT_EQ(s.layer(0), (std::vector<HeadSpec>{kGroup, kGroup}));
  EXPECT_EQ(s.layer(1), (std::vector<HeadSpec>{kGroup, kSet}));
  EXPECT_EQ(s.layer(2), (std::vector<HeadSpec>{kSet, kSet}));
  EXPECT_EQ(s.layer(3), (std::vector<HeadSpec>{kSet, kDense}));  // the last layer's sets are never read
  EXPECT_EQ(s.patterns.size(), 5u);  // the dense pattern 0 plus four distinct layers
}

TEST(DecodeSpec, EqualLayersShareAPattern) {
  const ModelConfig c = shape(5);
  const DecodeSpec s = lychee_spec(c, head_roles_from_layers(c, {0}), 64, SelectParams{});
  // Layer 0 scores, layers 1..4 all read sets: two patterns beside the dense one.
  EXPECT_EQ(s.patterns.size(), 3u);
  for (int l = 2; l < 5; ++l) EXPECT_EQ(s.layer_pattern[size_t(l)], s.layer_pattern[1]);
}

TEST(DecodeSpec, TidalDenseLayersSelectionLayersThenSets) {
  const ModelConfig c = shape(8);
  const DecodeSpec s = tidal_spec(c, 128, {1, 3, 5}, 2);  // layer 1 is dense: its selection is ignored
  const HeadSpec per_q{ReadKind::kDense, ScoreKind::kPerQuery};
  EXPECT_EQ(s.scope, SetScope::kQueryHead);
  EXPECT_EQ(s.unit, 1);
  EXPECT_EQ(s.select.budget, 128);
  for (int l : {0, 1, 2}) EXPECT_EQ(s.layer(l), std::vector<HeadSpec>(2, kDense)) << l;  // 2: before any selection
  for (int l : {3, 5}) EXPECT_EQ(s.layer(l), std::vector<HeadSpec>(2, per_q)) << l;
  for (int l : {4, 6, 7}) EXPECT_EQ(s.layer(l), std::vector<HeadSpec>(2, kSet)) << l;
}

TEST(DecodeSpec, QuestRanksPagesBeforeTheAttentionAndCountsItsMetadata) {
  const ModelConfig c = shape(4, 8, 2, 64);
  const DecodeSpec s = quest_spec(c, 512, 16, 2);
  const HeadSpec bound{ReadKind::kSet, ScoreKind::kPageBound};
  EXPECT_EQ(s.scope, SetScope::kQueryHead);
  EXPECT_EQ(s.unit, 16);
  EXPECT_EQ(s.unit_option, "--quest-page");
  EXPECT_EQ(s.layer(1), std::vector<HeadSpec>(2, kDense));
  EXPECT_EQ(s.layer(2), std::vector<HeadSpec>(2, bound));
  EXPECT_TRUE(s.has(ScoreKind::kPageBound));
  EXPECT_EQ(s.metadata_bytes(1, 100), 0u);
  EXPECT_EQ(s.metadata_bytes(2, 100), 2u * 7 * 2 * 64 * 2);  // 2 KV heads x 7 pages x min+max x d x bf16
}

TEST(DecodeSpec, DuoStreamingHeadsReadTheirWindow) {
  const ModelConfig c = shape(2);
  const DecodeSpec s = duo_spec(c, roles_of(c, {{1, 1}, {0, 1}}), 8, 24);
  EXPECT_EQ(s.window_sink, 8);
  EXPECT_EQ(s.window_recent, 24);
  EXPECT_EQ(s.layer(0), std::vector<HeadSpec>(2, kDense));
  EXPECT_EQ(s.layer(1), (std::vector<HeadSpec>{{ReadKind::kWindow, ScoreKind::kNone}, kDense}));
}

TEST(DecodeSpec, CompilingIsAPureFunctionOfTheOptions) {
  const ModelConfig c = shape(6);
  for (PolicyKind k : {PolicyKind::kFull, PolicyKind::kLychee, PolicyKind::kTidal, PolicyKind::kQuest,
                       PolicyKind::kDuo}) {
    PolicyOptions o;
    o.kind = k;
    o.roles = head_roles_from_layers(c, {0, 3});
    const DecodeSpec a = compile_policy(o, c), b = compile_policy(o, c);
    EXPECT_EQ(a.patterns, b.patterns) << policy_kind_name(k);
    EXPECT_EQ(a.layer_pattern, b.layer_pattern) << policy_kind_name(k);
    EXPECT_EQ(a.name, policy_kind_name(k));
  }
}

TEST(DecodeSpec, MalformedSpecsAreRejectedNamingWhatIsWrong) {
  const ModelConfig c = shape(3);
  DecodeSpecBuilder b(c, "probe");
  b.set_layer(1, {HeadSpec{ReadKind::kSet, ScoreKind::kGroupMean}, kDense});
  test::expect_error([&] { b.finish(); }, ErrorCode::kInvalidArgument, "probe", "does not read densely");

  DecodeSpecBuilder q(c, "probe");
  q.set_layer(1, {HeadSpec{ReadKind::kDense, ScoreKind::kPerQuery}, kDense});  // per-query scores, KV-head sets
  test::expect_error([&] { q.finish(); }, ErrorCode::kInvalidArgument, "per-query-head sets");

  DecodeSpecBuilder p(c, "probe");
  p.spec().scope = SetScope::kQueryHead;
  p.set_layer(2, {HeadSpec{ReadKind::kDense, ScoreKind::kPageBound}, kDense});
  test::expect_error([&] { p.finish(); }, ErrorCode::kInvalidArgument, "ranks pages");

  const DecodeSpec ok = full_spec(c);
  test::expect_error([&] { ok.validate(shape(4)); }, ErrorCode::kInvalidArgument, "3 layers", "the model has 4");
  test::expect_error([&] { DecodeSpecBuilder(c, "probe").set_layer(3, std::vector<HeadSpec>(2)); },
                     ErrorCode::kInvalidArgument, "layer 3");
  test::expect_error([&] { lychee_spec(c, head_roles_from_layers(c, {0}), 0, SelectParams{}); },
                     ErrorCode::kInvalidArgument, "--block-size", "got 0");
}

// selected_units is the count select_units keeps for top-k and ratio (with overlapping forced
// units), and all units (an upper bound) for top-p and threshold.
TEST(DecodeSpec, SelectedUnitsIsSelectUnitsCount) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> len(1, 700), small(0, 80), budget(1, 300);
  std::normal_distribution<float> nd;
  int checked = 0;
  for (int unit : {1, 16, 64}) {
    for (int i = 0; i < 200; ++i) {
      SelectParams p;
      p.strategy = i % 2 == 0 ? SelectStrategy::kTopK : SelectStrategy::kRatio;
      p.budget = budget(rng);
      p.value = 0.01 + 0.9 * double(i % 10) / 10.0;
      p.sink = small(rng);
      p.recent = small(rng);
      const int n = len(rng), n_units = (n + unit - 1) / unit;
      std::vector<float> scores(static_cast<size_t>(n_units));
      for (float& s : scores) s = nd(rng);
      const auto kept = select_units(scores, unit, n, p, 1.0f);
      ASSERT_EQ(selected_units(p, unit, n), int(kept.size()))
          << "unit " << unit << " n " << n << " budget " << p.budget << " sink " << p.sink << " recent " << p.recent;
      p.strategy = i % 2 == 0 ? SelectStrategy::kTopP : SelectStrategy::kThreshold;
      p.value = 0.5;
      EXPECT_EQ(selected_units(p, unit, n), n_units);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 600);
}

}  // namespace
}  // namespace lychee
