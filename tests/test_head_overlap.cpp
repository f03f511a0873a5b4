// The paper's Figure 1 measurement (eval/head_overlap): top-k sets of the answer token per head,
// and the overlap of same-index heads in adjacent layers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "eval/head_overlap.h"
#include "runtime/engine.h"
#include "test_util.h"

namespace lychee {
namespace {

Engine tiny_engine() {
  EngineOptions o;
  o.model_path = test::golden_dir() + "/models/llama_tied_f32";
  o.device = "cpu";
  return Engine(o);
}

TEST(HeadOverlap, SetsAndOverlapsHaveTheirShapes) {
  Engine e = tiny_engine();
  const ModelConfig& c = e.config();
  const HeadOverlap r = head_topk_overlap(e, "the quick brown fox jumps over the lazy dog again and again", 3, false);
  ASSERT_EQ(int(r.topk.size()), c.n_layers);
  ASSERT_EQ(r.overlap.size(), size_t(c.n_layers - 1) * size_t(c.n_heads));
  for (const auto& layer : r.topk) {
    ASSERT_EQ(int(layer.size()), c.n_heads);
    for (const auto& set : layer) {
      ASSERT_EQ(set.size(), 3u);
      for (int32_t t : set) EXPECT_TRUE(t >= 0 && t < r.context) << t;
      EXPECT_EQ(std::count(set.begin(), set.end(), set[0]), 1);  // distinct positions
    }
  }
  for (float v : r.overlap) {
    EXPECT_GE(v, 0.0f);
    EXPECT_LE(v, 1.0f);
    EXPECT_FLOAT_EQ(v * 3.0f, std::round(v * 3.0f));  // a share of k = 3
  }
  EXPECT_GE(r.answer_token, 0);
}

// With k equal to the whole context every head's set is every position: overlap 1 everywhere.
// With k = 1 each overlap is 0 or 1 and says whether the two heads' best tokens are the same.
TEST(HeadOverlap, WholeContextOverlapsFullyAndTopOneIsAnIdentity) {
  Engine e = tiny_engine();
  const std::string p = "one two three four five six";
  const HeadOverlap one = head_topk_overlap(e, p, 1, false);
  const HeadOverlap all = head_topk_overlap(e, p, one.context, false);
  for (float v : all.overlap) EXPECT_EQ(v, 1.0f);
  for (int l = 0; l + 1 < one.n_layers; ++l)
    for (int h = 0; h < one.n_heads; ++h)
      EXPECT_EQ(one.at(l, h), one.topk[size_t(l)][size_t(h)][0] == one.topk[size_t(l + 1)][size_t(h)][0] ? 1.0f : 0.0f);
  // The best token of each head is the first of its larger set.
  for (int l = 0; l < one.n_layers; ++l)
    for (int h = 0; h < one.n_heads; ++h)
      EXPECT_EQ(one.topk[size_t(l)][size_t(h)][0], all.topk[size_t(l)][size_t(h)][0]);
  test::expect_error([&] { head_topk_overlap(e, "one two", 50, false); }, ErrorCode::kInvalidArgument,
                     "fewer than k = 50");
  test::expect_error([&] { head_topk_overlap(e, p, 0, false); }, ErrorCode::kInvalidArgument, "k must be >= 1");
}

TEST(HeadOverlap, ThePaperPromptsAreItsFive) {
  const auto& p = paper_overlap_prompts();
  ASSERT_EQ(p.size(), 5u);
  for (const std::string& s : p) EXPECT_EQ(s.rfind("Please directly output the final answer", 0), 0u) << s;
  EXPECT_NE(p[0].find("squares, circles, and triangles"), std::string::npos);
  EXPECT_NE(p[4].find("If two days ago was Monday"), std::string::npos);
}

}  // namespace
}  // namespace lychee

namespace lychee {
namespace {

// Quest against the exact pages: a budget covering every page makes both choose all of them
// (recall 1, mass ratio 1); dense layers are not measured; a one-page budget keeps the last page
// in both (recall 1 too); CUDA engines and bad arguments are refused.
TEST(QuestCheck, CoveringBudgetsAgreeAndDenseLayersAreSkipped) {
  Engine e = tiny_engine();
  const ModelConfig& c = e.config();
  std::vector<int32_t> ids(40);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 13 + 1) % size_t(c.vocab_size));
  const QuestCheck all = quest_against_exact(e, ids, 4, 64, 1);
  ASSERT_EQ(int(all.recall.size()), c.n_layers);
  EXPECT_EQ(all.recall[0], 0.0);  // dense
  for (int l = 1; l < c.n_layers; ++l) {
    EXPECT_DOUBLE_EQ(all.recall[size_t(l)], 1.0) << l;
    EXPECT_NEAR(all.mass[size_t(l)], 1.0, 1e-12) << l;
  }
  const QuestCheck one = quest_against_exact(e, ids, 4, 4, 0);
  for (int l = 0; l < c.n_layers; ++l) EXPECT_DOUBLE_EQ(one.recall[size_t(l)], 1.0) << l;
  const QuestCheck some = quest_against_exact(e, ids, 4, 16, 0);
  for (int l = 0; l < c.n_layers; ++l) {
    EXPECT_GE(some.recall[size_t(l)], 0.25);  // the last page at least
    EXPECT_LE(some.recall[size_t(l)], 1.0);
    EXPECT_GT(some.mass[size_t(l)], 0.0);
  }
  test::expect_error([&] { quest_against_exact(e, ids, 16, 8, 0); }, ErrorCode::kInvalidArgument, "budget 8");
}

}  // namespace
}  // namespace lychee
