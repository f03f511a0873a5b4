#!/usr/bin/env python3
"""Head-specialisation dynamics of head-role training (the paper's Figure 4 on our model), from the
gate_history.json files `lychee train-heads` writes, as one SVG without third-party packages:

  - one panel per run: E[z] of every gated head over the training steps (red: the heads that end
    as retrieval heads, grey: sparse heads);
  - for each HardKuma run, the Kumaraswamy densities of two heads (the gated head with the highest
    final E[z] and the one with the lowest) at the snapshots nearest steps 0, 100, 200, 500, 1000.

    python3 scripts/plot_gate_dynamics.py runs/hardkuma/gate_history.json runs/direct/gate_history.json \
        -o docs/results/paper_figures/gate_dynamics.svg
"""
import argparse
import json
import math
from xml.sax.saxutils import escape

W, H, PAD = 420, 260, 48
STEPS_SHOWN = (0, 100, 200, 500, 1000)
SHADES = ["#fdd0a2", "#fdae6b", "#fd8d3c", "#e6550d", "#a63603"]


def kuma_pdf(x, a, b):
    """Density of the Kumaraswamy(a, b) variable on (0, 1)."""
    return a * b * x ** (a - 1) * (1 - x ** a) ** (b - 1)


def polyline(points, color, width=1.0, opacity=1.0):
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return f'<polyline fill="none" stroke="{color}" stroke-width="{width}" stroke-opacity="{opacity}" points="{pts}"/>'


def axes(x0, y0, title, xlabel, ylabel, xticks, yticks):
    """Frame, ticks and labels of a panel whose plot area is [x0, x0 + W] x [y0, y0 + H]; ticks are
    (position in px from the left / bottom, label)."""
    out = [f'<rect x="{x0}" y="{y0}" width="{W}" height="{H}" fill="none" stroke="#000"/>',
           f'<text x="{x0 + W / 2}" y="{y0 - 10}" text-anchor="middle" font-size="13">{escape(title)}</text>',
           f'<text x="{x0 + W / 2}" y="{y0 + H + 34}" text-anchor="middle" font-size="11">{escape(xlabel)}</text>',
           f'<text x="{x0 - 36}" y="{y0 + H / 2}" text-anchor="middle" font-size="11" '
           f'transform="rotate(-90 {x0 - 36} {y0 + H / 2})">{escape(ylabel)}</text>']
    for px, label in xticks:
        out.append(f'<line x1="{x0 + px}" y1="{y0 + H}" x2="{x0 + px}" y2="{y0 + H + 4}" stroke="#000"/>')
        out.append(f'<text x="{x0 + px}" y="{y0 + H + 16}" text-anchor="middle" font-size="10">{label}</text>')
    for py, label in yticks:
        out.append(f'<line x1="{x0 - 4}" y1="{y0 + H - py}" x2="{x0}" y2="{y0 + H - py}" stroke="#000"/>')
        out.append(f'<text x="{x0 - 6}" y="{y0 + H - py + 3}" text-anchor="end" font-size="10">{label}</text>')
    return out


def gated_heads(h):
    """Indices (into the [n_layers * n_kv_heads] layout) of the gated heads: layers >= 1."""
    return range(h["n_kv_heads"], h["n_layers"] * h["n_kv_heads"])


def ez_panel(h, x0, y0):
    steps, ez, roles = h["steps"], h["expected_z"], h["roles"]
    last = max(steps[-1], 1)
    sx = lambda s: x0 + W * s / last
    sy = lambda v: y0 + H * (1 - v)
    out = axes(x0, y0, f'{h["gate"]}: E[z] per head ({h["model"]})', "training step", "E[z]",
               [(W * s / last, s) for s in range(0, last + 1, max(1, last // 5))],
               [(H * v, f"{v:g}") for v in (0, 0.25, 0.5, 0.75, 1)])
    for i in sorted(gated_heads(h), key=lambda i: roles[i]):  # retrieval heads drawn last, on top
        color, width = ("#d62728", 1.2) if roles[i] else ("#7f7f7f", 0.6)
        out.append(polyline([(sx(s), sy(v[i])) for s, v in zip(steps, ez)], color, width, 0.8))
    out.append(f'<text x="{x0 + 6}" y="{y0 + 14}" font-size="10" fill="#d62728">retrieval at the end: '
               f'{sum(roles[i] for i in gated_heads(h))} heads</text>')
    return out


def density_panel(h, head, x0, y0):
    """Kumaraswamy densities of one head at the snapshots nearest STEPS_SHOWN."""
    n_gates = (h["n_layers"] - 1) * h["n_kv_heads"]
    g = head - h["n_kv_heads"]
    layer, kv = divmod(head, h["n_kv_heads"])
    ymax = 6.0
    xs = [0.005 + 0.99 * i / 200 for i in range(201)]
    out = axes(x0, y0, f"Kumaraswamy density, layer {layer} KV head {kv} (final E[z] {h['expected_z'][-1][head]:.2f})",
               "x (z = clamp(p + (q - p) x, 0, 1))", "density",
               [(W * v, f"{v:g}") for v in (0, 0.25, 0.5, 0.75, 1)], [(H * v / ymax, f"{v:g}") for v in range(0, 7)])
    picked = []
    for target in STEPS_SHOWN:
        if target > h["steps"][-1]:
            break
        k = min(range(len(h["steps"])), key=lambda k: abs(h["steps"][k] - target))
        if k not in picked:
            picked.append(k)
    for n, k in enumerate(picked):
        a, b = math.exp(h["params"][k][g]), math.exp(h["params"][k][g + n_gates])
        pts = [(x0 + W * x, y0 + H * (1 - min(kuma_pdf(x, a, b), ymax) / ymax)) for x in xs]
        out.append(polyline(pts, SHADES[n % len(SHADES)], 1.6))
        out.append(f'<text x="{x0 + W - 6}" y="{y0 + 14 + 13 * n}" text-anchor="end" font-size="10" '
                   f'fill="{SHADES[n % len(SHADES)]}">step {h["steps"][k]}: a {a:.2f}, b {b:.2f}</text>')
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("histories", nargs="+", help="gate_history.json files")
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args()
    runs = [json.load(open(p)) for p in args.histories]
    rows = []
    for h in runs:
        row = [("ez", h, None)]
        if h["gate"] == "hardkuma":
            final = h["expected_z"][-1]
            heads = sorted(gated_heads(h), key=lambda i: final[i])
            row += [("density", h, heads[-1]), ("density", h, heads[0])]
        rows.append(row)
    cols = max(len(r) for r in rows)
    cw, rh = W + PAD * 2, H + PAD * 2
    body = []
    for r, row in enumerate(rows):
        for c, (kind, h, head) in enumerate(row):
            x0, y0 = PAD + c * cw, PAD + r * rh
            body += ez_panel(h, x0, y0) if kind == "ez" else density_panel(h, head, x0, y0)
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{cols * cw + PAD}" height="{len(rows) * rh + PAD}" '
           f'font-family="sans-serif"><rect width="100%" height="100%" fill="#fff"/>' + "".join(body) + "</svg>\n")
    open(args.out, "w").write(svg)


if __name__ == "__main__":
    main()
