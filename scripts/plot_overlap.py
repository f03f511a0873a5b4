#!/usr/bin/env python3
"""Heatmaps of `lychee heads overlap --json` (the paper's Figure 1 on our model): per case, the
top-k overlap of each head with the same-index head of the next layer, layers down, heads across,
as one SVG without third-party packages.

    build/bin/lychee heads overlap --json docs/results/paper_figures/topk_overlap.json
    python3 scripts/plot_overlap.py docs/results/paper_figures/topk_overlap.json -o docs/results/paper_figures/topk_overlap.svg
"""
import argparse
import html
import json


def colour(v):
    """0 -> white, 1 -> dark red."""
    r = 255 - int(v * (255 - 165))
    g = 255 - int(v * 255)
    b = 255 - int(v * 255)
    return f"rgb({r},{g},{b})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    d = json.load(open(a.json))
    cases = d["cases"]
    cell, pad, top = 14, 40, 70
    n_layers, n_heads = cases[0]["n_layers"], cases[0]["n_heads"]
    panel_w = pad + n_heads * cell + 20
    h = top + (n_layers - 1) * cell + 40
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{panel_w * len(cases) + 20}" height="{h}" '
           'font-family="sans-serif" font-size="10">',
           f'<text x="10" y="16" font-size="13">Top-{d["k"]} overlap of same-index heads in adjacent layers, '
           f'{html.escape(d["model"])} (white 0, dark red 1)</text>']
    for i, c in enumerate(cases):
        x0 = 10 + i * panel_w
        mean = sum(c["overlap"]) / len(c["overlap"])
        svg.append(f'<text x="{x0}" y="36">case {i + 1}: answer "{html.escape(c["answer"].strip())}", '
                   f'mean {mean:.2f}</text>')
        svg.append(f'<text x="{x0}" y="52" fill="#555">heads 0..{n_heads - 1} across; layer l vs l+1 down</text>')
        for l in range(n_layers - 1):
            y = top + l * cell
            if l % 5 == 0:
                svg.append(f'<text x="{x0}" y="{y + 10}">{l}</text>')
            for hh in range(n_heads):
                v = c["overlap"][l * n_heads + hh]
                svg.append(f'<rect x="{x0 + pad + hh * cell}" y="{y}" width="{cell - 1}" height="{cell - 1}" '
                           f'fill="{colour(v)}"><title>layers {l}-{l + 1}, head {hh}: {v:.1f}</title></rect>')
    svg.append("</svg>")
    with open(a.out, "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
