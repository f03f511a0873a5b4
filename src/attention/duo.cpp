// DuoAttention (baselines.md §3) as a DecodeSpec: retrieval heads read every token, streaming
// heads the first `sink` and the last `recent` tokens.
#include "attention/policies.h"
#include "core/error.h"

namespace lychee {

DecodeSpec duo_spec(const ModelConfig& c, const HeadRoles& roles, int sink, int recent) {
  roles.validate(c, "head roles");
  LY_CHECK(sink >= 0, ErrorCode::kInvalidArgument, "--duo-sink: must be a non-negative integer, got {}", sink);
  LY_CHECK(recent >= 1, ErrorCode::kInvalidArgument, "--duo-recent: must be a positive integer, got {}", recent);
  DecodeSpecBuilder b(c, "duo");
  DecodeSpec& s = b.spec();
  s.window_sink = sink;
  s.window_recent = recent;
  for (int l = 0; l < c.n_layers; ++l) {
    std::vector<HeadSpec> pattern(size_t(c.n_kv_heads));
    for (int h = 0; h < c.n_kv_heads; ++h)
      if (!roles.is_retrieval(l, h)) pattern[size_t(h)] = {ReadKind::kWindow, ScoreKind::kNone};
    b.set_layer(l, pattern);
  }
  return b.finish();
}

}  // namespace lychee
