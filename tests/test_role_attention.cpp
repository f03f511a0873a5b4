// eval/role_attention.h: the answer token's attention by LycheeDecode head role. With a budget
// that covers the context, a sparse head reads every token and its renormalised attention is full
// attention's; with a small one its mass sits on the tokens it read; a distractor that does not
// occur is refused.
#include <gtest/gtest.h>

#include <numeric>

#include "attention/policies.h"
#include "eval/role_attention.h"
#include "test_util.h"

namespace lychee {
namespace {

std::unique_ptr<AttentionPolicy> lychee_policy(const ModelConfig& c, int budget) {
  PolicyOptions o;
  o.kind = PolicyKind::kLychee;
  o.block_size = 16;
  o.select.budget = budget;
  o.roles = load_head_roles(std::string(LYCHEE_SOURCE_DIR) + "/docs/results/train/hardkuma/roles.json", c);
  return make_policy(o, c);
}

TEST(RoleAttention, SplitsTheAnswerTokensAttentionByRole) {
  LY_REQUIRE_DEFAULT_MODEL(path);
  Engine engine(EngineOptions{path, "cpu"});
  const auto covering = lychee_policy(engine.config(), 4096);
  const RoleAttention all = attention_by_role(engine, denoise_prompt(), denoise_distractor(), *covering);
  ASSERT_EQ(all.retrieval.size(), size_t(all.context));
  EXPECT_EQ(all.n_retrieval + all.n_sparse, engine.config().n_layers * engine.config().n_heads);
  EXPECT_GT(all.n_retrieval, 0);
  EXPECT_GT(all.n_sparse, 0);
  EXPECT_GE(all.distractor.size(), 15u);  // the sentence is ~18 tokens
  EXPECT_NEAR(all.sparse_distractor, all.full_distractor_sparse_heads, 1e-12) << "a covering set is full attention";
  const double ret_sum = std::accumulate(all.retrieval.begin(), all.retrieval.end(), 0.0);
  EXPECT_GT(ret_sum, 0.5);
  EXPECT_LE(ret_sum, 1.0 + 1e-9);  // the current token's own share is not on the context

  const auto small = lychee_policy(engine.config(), 16);
  const RoleAttention few = attention_by_role(engine, denoise_prompt(), denoise_distractor(), *small);
  EXPECT_EQ(few.answer_token, all.answer_token);
  const double sp_sum = std::accumulate(few.sparse.begin(), few.sparse.end(), 0.0);
  EXPECT_LE(sp_sum, 1.0 + 1e-9);
  const auto nonzero = std::count_if(few.sparse.begin(), few.sparse.end(), [](double v) { return v > 0.0; });
  EXPECT_LT(nonzero, few.context) << "16-token sets leave most of the context unread";

  test::expect_error([&] { attention_by_role(engine, denoise_prompt(), "not in the prompt", *small); },
                     ErrorCode::kInvalidArgument, {"does not occur in the prompt"});
}

}  // namespace
}  // namespace lychee
