// SVG figures of head-role training: how P(retrieval) of every (layer, KV head) moved over the
// steps, and the final expected gate values with the chosen retrieval heads marked.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lychee::train {

struct HeatmapData {
  std::string title;
  int n_layers = 0;
  int n_kv_heads = 0;
  // Snapshots of the per-head value (E[z]) at the given steps; each [n_layers * n_kv_heads].
  std::vector<int> steps;
  std::vector<std::vector<double>> snapshots;
  // The final value per head and the role decision ([n_layers * n_kv_heads], 1 = retrieval).
  std::vector<double> final_value;
  std::vector<uint8_t> roles;
  std::string value_label = "E[z]";
};

// Two panels: left, one row per (layer, KV head) and one column per snapshot; right, the final
// values as a layer × KV-head grid with retrieval heads outlined. Values are clamped to [0, 1].
std::string head_role_heatmap_svg(const HeatmapData& data);

}  // namespace lychee::train
