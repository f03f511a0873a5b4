// Quest (baselines.md §2) as a DecodeSpec: channel-wise min/max keys per page of `page` tokens,
// kept as tokens arrive; in every layer from dense_layers on, each query head ranks the pages by
// the upper bound sum_i max(q_i M_i, q_i m_i) and reads its top pages within the token budget
// (the last page always).
#include "attention/policies.h"
#include "core/error.h"

namespace lychee {

DecodeSpec quest_spec(const ModelConfig& c, int budget, int page, int dense_layers) {
  LY_CHECK(budget >= 1, ErrorCode::kInvalidArgument, "--budget: must be a positive integer, got {}", budget);
  LY_CHECK(page >= 1, ErrorCode::kInvalidArgument, "--quest-page: must be a positive integer, got {}", page);
  DecodeSpecBuilder b(c, "quest");
  DecodeSpec& s = b.spec();
  s.unit_option = "--quest-page";
  s.scope = SetScope::kQueryHead;
  s.unit = page;
  s.select.budget = budget;
  for (int l = std::max(0, dense_layers); l < c.n_layers; ++l)
    b.set_layer(l, std::vector<HeadSpec>(size_t(c.n_kv_heads), {ReadKind::kSet, ScoreKind::kPageBound}));
  return b.finish();
}

}  // namespace lychee
