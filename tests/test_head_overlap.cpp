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
