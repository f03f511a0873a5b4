// LycheeDecode (paper §3.1, Algorithm 1; method-reference-code.md §6.11) as a DecodeSpec: per
// decode step and layer, sparse KV heads read the set last written at their KV-head index by a
// retrieval head of an earlier layer; retrieval heads read everything, score every token with the
// raw logit of the GQA group's mean query (q̄·k, no scale, no softmax; a block scores its max),
// and write their new selection after the layer's sparse heads have planned. Layer 0 is all
// retrieval.
#include <cmath>

#include "attention/policies.h"
#include "core/error.h"

namespace lychee {

DecodeSpec lychee_spec(const ModelConfig& c, const HeadRoles& roles, int block_size, const SelectParams& select) {
  roles.validate(c, "head roles");
  LY_CHECK(block_size >= 1, ErrorCode::kInvalidArgument, "--block-size: must be a positive integer, got {}",
           block_size);
  DecodeSpecBuilder b(c, "lychee");
  DecodeSpec& s = b.spec();
  s.unit_option = "--block-size";
  s.scope = SetScope::kKvHead;
  s.unit = block_size;
  s.select = select;
  s.prob_scale = 1.0f / std::sqrt(float(c.head_dim));
  for (int l = 0; l < c.n_layers; ++l) {
    const bool last = l + 1 == c.n_layers;  // no later layer reads the last layer's sets
    std::vector<HeadSpec> pattern(size_t(c.n_kv_heads));
    for (int h = 0; h < c.n_kv_heads; ++h) {
      if (l == 0 || roles.is_retrieval(l, h))
        pattern[size_t(h)] = {ReadKind::kDense, last ? ScoreKind::kNone : ScoreKind::kGroupMean};
      else
        pattern[size_t(h)] = {ReadKind::kSet, ScoreKind::kNone};
    }
    b.set_layer(l, pattern);
  }
  return b.finish();
}

}  // namespace lychee
