#include "train/heatmap.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"

namespace lychee::train {

namespace {

// A sequential colour scale from near-white (0) through amber to deep red (1).
std::string colour(double v) {
  v = std::clamp(std::isfinite(v) ? v : 0.0, 0.0, 1.0);
  struct Stop { double at, r, g, b; };
  static constexpr Stop kStops[] = {
      {0.0, 247, 247, 240}, {0.35, 253, 204, 120}, {0.7, 232, 98, 44}, {1.0, 127, 18, 30}};
  for (size_t i = 1; i < std::size(kStops); ++i) {
    if (v <= kStops[i].at) {
      const Stop& a = kStops[i - 1];
      const Stop& b = kStops[i];
      const double t = (v - a.at) / (b.at - a.at);
      return fmt::format("#{:02x}{:02x}{:02x}", int(std::lround(a.r + t * (b.r - a.r))),
                         int(std::lround(a.g + t * (b.g - a.g))), int(std::lround(a.b + t * (b.b - a.b))));
    }
  }
  return "#7f121e";
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

void check_heatmap_data(const HeatmapData& d, size_t n_heads) {
  LY_CHECK(d.n_layers > 0 && d.n_kv_heads > 0, ErrorCode::kInvalidArgument,
           "heatmap: empty shape {}x{}", d.n_layers, d.n_kv_heads);
  LY_CHECK(d.steps.size() == d.snapshots.size(), ErrorCode::kInvalidArgument,
           "heatmap: {} steps but {} snapshots", d.steps.size(), d.snapshots.size());
  for (const auto& s : d.snapshots)
    LY_CHECK(s.size() == n_heads, ErrorCode::kInvalidArgument, "heatmap: a snapshot has {} values, expected {}",
             s.size(), n_heads);
  LY_CHECK(d.final_value.size() == n_heads && d.roles.size() == n_heads, ErrorCode::kInvalidArgument,
           "heatmap: final values/roles have {}/{} entries, expected {}", d.final_value.size(), d.roles.size(),
           n_heads);
}

// Positions in px. Left panel: rows of (layer, head), at most ~640 px tall; columns of snapshots.
// Right panel: a layer x KV-head grid.
struct Layout {
  double row_h, col_w, left_x, top_y, left_w, left_h;
  double cell, right_x, right_w, right_h;
  double width, height;
  int layer_tick;  // label every layer_tick-th layer: about 10 labels
};

Layout heatmap_layout(const HeatmapData& d, size_t n_heads) {
  Layout g;
  g.row_h = std::clamp(640.0 / double(n_heads), 2.0, 12.0);
  const size_t n_cols = std::max<size_t>(d.snapshots.size(), 1);
  g.col_w = std::clamp(480.0 / double(n_cols), 2.0, 24.0);
  g.left_x = 70;
  g.top_y = 60;
  g.left_w = g.col_w * double(n_cols);
  g.left_h = g.row_h * double(n_heads);
  g.cell = std::clamp(640.0 / double(d.n_layers), 6.0, 22.0);
  g.right_x = g.left_x + g.left_w + 90;
  g.right_w = g.cell * d.n_kv_heads;
  g.right_h = g.cell * d.n_layers;
  g.width = g.right_x + g.right_w + 120;
  g.height = g.top_y + std::max(g.left_h, g.right_h) + 70;
  g.layer_tick = std::max(1, d.n_layers / 10);
  return g;
}

// Left: trajectories, one row per (layer, KV head) and one column per snapshot.
void trajectory_panel(std::string& svg, const HeatmapData& d, size_t n_heads, const Layout& g) {
  svg += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\">{} per (layer, KV head) over training steps</text>\n",
                     g.left_x, g.top_y - 12, escape(d.value_label));
  for (size_t c = 0; c < d.snapshots.size(); ++c)
    for (size_t r = 0; r < n_heads; ++r)
      svg += fmt::format("<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"{}\"/>\n",
                         g.left_x + g.col_w * double(c), g.top_y + g.row_h * double(r), g.col_w + 0.05,
                         g.row_h + 0.05, colour(d.snapshots[c][r]));
  for (int l = 0; l < d.n_layers; l += g.layer_tick) {
    const double y = g.top_y + g.row_h * double(size_t(l) * size_t(d.n_kv_heads));
    svg += fmt::format("<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.2f}\" y2=\"{:.2f}\" stroke=\"#444\"/>\n",
                       g.left_x - 4, g.left_x, y, y);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.2f}\" text-anchor=\"end\" dominant-baseline=\"middle\">L{}</text>\n",
                       g.left_x - 6, y + g.row_h * d.n_kv_heads / 2.0, l);
  }
  svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" stroke=\"#444\"/>\n",
                     g.left_x, g.top_y, g.left_w, g.left_h);
  if (!d.steps.empty()) {
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">step {}</text>\n", g.left_x, g.top_y + g.left_h + 16,
                       d.steps.front());
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">step {}</text>\n", g.left_x + g.left_w,
                       g.top_y + g.left_h + 16, d.steps.back());
  }
}

// Right: final values, retrieval heads outlined.
void final_panel(std::string& svg, const HeatmapData& d, const Layout& g) {
  svg += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\">final {} (outlined: retrieval)</text>\n", g.right_x,
                     g.top_y - 12, escape(d.value_label));
  for (int l = 0; l < d.n_layers; ++l)
    for (int h = 0; h < d.n_kv_heads; ++h) {
      const size_t i = size_t(l) * size_t(d.n_kv_heads) + size_t(h);
      const double x = g.right_x + g.cell * h, y = g.top_y + g.cell * l;
      svg += fmt::format("<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"{}\" stroke=\"{}\" "
                         "stroke-width=\"{}\"><title>layer {} head {}: {:.3f}</title></rect>\n",
                         x, y, g.cell, g.cell, colour(d.final_value[i]), d.roles[i] ? "#111" : "#ddd",
                         d.roles[i] ? 2 : 0.5, l, h, d.final_value[i]);
    }
  for (int l = 0; l < d.n_layers; l += g.layer_tick)
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.2f}\" text-anchor=\"end\" dominant-baseline=\"middle\">L{}</text>\n",
                       g.right_x - 6, g.top_y + g.cell * (l + 0.5), l);
  for (int h = 0; h < d.n_kv_heads; ++h)
    svg += fmt::format("<text x=\"{:.2f}\" y=\"{:.1f}\" text-anchor=\"middle\">h{}</text>\n",
                       g.right_x + g.cell * (h + 0.5), g.top_y + g.right_h + 14, h);
}

void colour_bar(std::string& svg, const Layout& g) {
  const double bar_x = g.right_x + g.right_w + 40, bar_h = std::min(200.0, std::max(g.left_h, g.right_h));
  for (int i = 0; i < 50; ++i)
    svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.2f}\" width=\"14\" height=\"{:.2f}\" fill=\"{}\"/>\n", bar_x,
                       g.top_y + bar_h * (1.0 - (i + 1) / 50.0), bar_h / 50.0 + 0.05, colour((i + 0.5) / 50.0));
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">1</text>\n<text x=\"{:.1f}\" y=\"{:.1f}\">0</text>\n",
                     bar_x + 18, g.top_y + 8, bar_x + 18, g.top_y + bar_h);
}

}  // namespace

std::string head_role_heatmap_svg(const HeatmapData& d) {
  const size_t n_heads = size_t(d.n_layers) * size_t(d.n_kv_heads);
  check_heatmap_data(d, n_heads);
  const Layout g = heatmap_layout(d, n_heads);
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
      "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{:.0f}\" y=\"22\" font-size=\"15\">{}</text>\n",
      g.width, g.height, g.left_x, escape(d.title));
  trajectory_panel(svg, d, n_heads, g);
  final_panel(svg, d, g);
  colour_bar(svg, g);
  svg += "</svg>\n";
  return svg;
}

}  // namespace lychee::train
