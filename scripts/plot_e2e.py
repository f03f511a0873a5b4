#!/usr/bin/env python3
"""Plots time per output token against context for every policy of a bench_e2e results file
(and Hugging Face transformers sdpa from hf_decode.py's file, if given), one panel per batch, as
an SVG without third-party packages; like the paper's latency figure.

    python3 scripts/plot_e2e.py docs/results/gpu/hybrid/e2e.json docs/results/gpu/hybrid/hf_decode.json \
        -o docs/results/gpu/hybrid/e2e_latency.svg
"""
import argparse
import json
import math

COLORS = {"full": "#555555", "lychee": "#d62728", "tidal": "#1f77b4", "quest": "#2ca02c", "duo": "#9467bd",
          "hf sdpa": "#ff7f0e"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("e2e")
    ap.add_argument("hf", nargs="?")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    e2e = json.load(open(a.e2e))
    series = {}  # (batch, policy) -> [(context, ms)]
    for r in e2e["rows"]:
        if "tpot_ms" in r:
            series.setdefault((r["batch"], r["policy"]), []).append((r["context"], r["tpot_ms"]))
    if a.hf:
        for r in json.load(open(a.hf))["rows"]:
            if "tpot_ms" in r:
                series.setdefault((r["batch"], "hf sdpa"), []).append((r["context"], r["tpot_ms"]))
    batches = sorted({b for b, _ in series})
    contexts = sorted({c for pts in series.values() for c, _ in pts})
    w, h, pad = 420, 300, 55
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w * len(batches)}" height="{h + 40}" '
           'font-family="sans-serif" font-size="11">']
    svg.append(f'<text x="10" y="16" font-size="13">Time per output token, Llama-3-8B shape, {e2e["gpu"]} '
               f'(commit {e2e.get("commit", "?")}); log scale</text>')
    for i, b in enumerate(batches):
        x0 = i * w
        ys = [ms for (bb, _), pts in series.items() if bb == b for _, ms in pts]
        lo, hi = math.log10(min(ys) * 0.8), math.log10(max(ys) * 1.2)
        px = lambda c: x0 + pad + (contexts.index(c)) * (w - 2 * pad) / max(1, len(contexts) - 1)
        py = lambda ms: 30 + (h - pad) * (1 - (math.log10(ms) - lo) / (hi - lo))
        svg.append(f'<rect x="{x0 + pad}" y="30" width="{w - 2 * pad}" height="{h - pad}" fill="none" stroke="#999"/>')
        svg.append(f'<text x="{x0 + w / 2 - 20}" y="{h + 32}">batch {b}: context</text>')
        for c in contexts:
            svg.append(f'<text x="{px(c) - 12}" y="{h - pad + 45}">{c // 1024}K</text>')
        for t in [1, 2, 5, 10, 20, 50, 100, 200]:
            if lo <= math.log10(t) <= hi:
                svg.append(f'<text x="{x0 + 8}" y="{py(t) + 4}">{t} ms</text>')
                svg.append(f'<line x1="{x0 + pad}" x2="{x0 + w - pad}" y1="{py(t)}" y2="{py(t)}" stroke="#eee"/>')
        row = 0
        for (bb, pol), pts in sorted(series.items()):
            if bb != b:
                continue
            pts.sort()
            color = COLORS.get(pol, "#000")
            path = " ".join(f"{px(c):.1f},{py(ms):.1f}" for c, ms in pts)
            svg.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
            for c, ms in pts:
                svg.append(f'<circle cx="{px(c):.1f}" cy="{py(ms):.1f}" r="3" fill="{color}"/>')
            svg.append(f'<text x="{x0 + w - pad + 4}" y="{40 + 14 * row}" fill="{color}">{pol}</text>')
            row += 1
    svg.append("</svg>")
    open(a.out, "w").write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
