// TidalDecode (baselines.md §1) as a DecodeSpec: layers [0, dense_layers) dense; selection layers
// dense plus a top-k per query head on q·k over the whole cache (the current token forced, inside
// the budget); every later layer reads the set of the latest selection layer. Selection layers
// below dense_layers are dense layers (their selection is ignored), and the layers between the
// dense ones and the first selection layer read densely (no set exists yet).
#include <algorithm>

#include "attention/policies.h"
#include "core/error.h"

namespace lychee {

DecodeSpec tidal_spec(const ModelConfig& c, int budget, const std::vector<int>& selection_layers, int dense_layers) {
  LY_CHECK(budget >= 1, ErrorCode::kInvalidArgument, "--budget: must be a positive integer, got {}", budget);
  for (int l : selection_layers)
    LY_CHECK(l >= 0 && l < c.n_layers, ErrorCode::kInvalidArgument,
             "--tidal-layers: selection layer {} is outside 0..{}", l, c.n_layers - 1);
  DecodeSpecBuilder b(c, "tidal");
  DecodeSpec& s = b.spec();
  s.scope = SetScope::kQueryHead;
  s.unit = 1;
  s.select.budget = budget;
  std::vector<int> layers;
  for (int l : selection_layers)
    if (l >= dense_layers) layers.push_back(l);
  std::sort(layers.begin(), layers.end());
  const int first = layers.empty() ? c.n_layers : layers[0];
  const size_t n_kv = size_t(c.n_kv_heads);
  for (int l = std::max(0, dense_layers); l < c.n_layers; ++l) {
    if (std::binary_search(layers.begin(), layers.end(), l))
      b.set_layer(l, std::vector<HeadSpec>(n_kv, {ReadKind::kDense, ScoreKind::kPerQuery}));
    else if (l > first)
      b.set_layer(l, std::vector<HeadSpec>(n_kv, {ReadKind::kSet, ScoreKind::kNone}));
  }
  return b.finish();
}

}  // namespace lychee
