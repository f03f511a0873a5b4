#!/usr/bin/env python3
"""Accuracy against KV bytes read, per policy (issue 14's "accuracy vs bytes read" figure), from a
`lychee eval --json` results file, as an SVG without third-party packages: one panel per context
length; x = bytes read per decode step over what full attention reads (log scale), y = mean
accuracy over tasks (each task weighs the same, as eval's "Average" table); one colour per policy,
its budgets joined by a line; full attention at x = 1. A dashed grey line marks 1/8 of the bytes.

    python3 scripts/plot_accuracy_bytes.py docs/results/gpu/hybrid/eval_gpu.json \
        -o docs/results/paper_figures/accuracy_bytes_gpu.svg
"""
import argparse
import json
import math
from xml.sax.saxutils import escape

COLORS = {"full": "#555555", "lychee": "#d62728", "tidal": "#1f77b4", "quest": "#2ca02c", "duo": "#9467bd"}
W, H, PAD = 360, 260, 56
X_LO, X_HI = math.log10(1 / 64), 0.0


def points(results):
    """{length: {kind: [(ratio, accuracy, label), ...]}} from the summary's average and kv tables."""
    ratio = {(c["policy_label"], c["length"]): c["ratio"] for c in results["summary"]["kv"]}
    out = {}
    for c in results["summary"]["average"]:
        key = (c["policy_label"], c["length"])
        if key not in ratio or ratio[key] <= 0:
            continue
        kind = c["policy_label"].split()[0]
        out.setdefault(c["length"], {}).setdefault(kind, []).append((ratio[key], c["mean_score"], c["policy_label"]))
    return out


def panel(length, series, x0, y0):
    sx = lambda r: x0 + W * (math.log10(max(r, 10 ** X_LO)) - X_LO) / (X_HI - X_LO)
    sy = lambda a: y0 + H * (1 - a)
    out = [f'<rect x="{x0}" y="{y0}" width="{W}" height="{H}" fill="none" stroke="#000"/>',
           f'<text x="{x0 + W / 2}" y="{y0 - 10}" text-anchor="middle" font-size="13">{length} tokens</text>',
           f'<text x="{x0 + W / 2}" y="{y0 + H + 34}" text-anchor="middle" font-size="11">KV bytes read / full attention\'s (log)</text>',
           f'<text x="{x0 - 40}" y="{y0 + H / 2}" text-anchor="middle" font-size="11" '
           f'transform="rotate(-90 {x0 - 40} {y0 + H / 2})">mean accuracy (%)</text>']
    for frac, label in ((1 / 64, "1/64"), (1 / 16, "1/16"), (1 / 4, "1/4"), (1, "1")):
        out.append(f'<text x="{sx(frac)}" y="{y0 + H + 16}" text-anchor="middle" font-size="10">{label}</text>')
    out.append(f'<line x1="{sx(1 / 8)}" y1="{y0}" x2="{sx(1 / 8)}" y2="{y0 + H}" stroke="#999" stroke-dasharray="4,3"/>')
    out.append(f'<text x="{sx(1 / 8) + 3}" y="{y0 + 12}" font-size="9" fill="#777">1/8</text>')
    for a in range(0, 101, 20):
        out.append(f'<text x="{x0 - 6}" y="{sy(a / 100) + 3}" text-anchor="end" font-size="10">{a}</text>')
    for kind, pts in sorted(series.items()):
        color = COLORS.get(kind, "#000")
        pts = sorted(pts)
        if len(pts) > 1:
            path = " ".join(f"{sx(r):.1f},{sy(a):.1f}" for r, a, _ in pts)
            out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{path}"/>')
        for r, a, label in pts:
            out.append(f'<circle cx="{sx(r):.1f}" cy="{sy(a):.1f}" r="3.5" fill="{color}"><title>{escape(label)}: '
                       f'{100 * a:.1f}% at {r:.3f}</title></circle>')
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="lychee eval --json output")
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args()
    r = json.load(open(args.results))
    data = points(r)
    lengths = sorted(data)
    body = []
    for i, length in enumerate(lengths):
        body += panel(length, data[length], PAD + i * (W + PAD), PAD)
    kinds = sorted({k for s in data.values() for k in s})
    lx = PAD
    for k in kinds:
        body.append(f'<circle cx="{lx}" cy="{PAD + H + 52}" r="4" fill="{COLORS.get(k, "#000")}"/>'
                    f'<text x="{lx + 8}" y="{PAD + H + 56}" font-size="11">{escape(k)}</text>')
        lx += 80
    run = r.get("run", {})
    body.append(f'<text x="{PAD}" y="{PAD + H + 76}" font-size="10" fill="#555">{escape(run.get("command", ""))[:160]}</text>')
    width, height = PAD + len(lengths) * (W + PAD), PAD + H + 90
    open(args.out, "w").write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                              f'font-family="sans-serif"><rect width="100%" height="100%" fill="#fff"/>'
                              + "".join(body) + "</svg>\n")


if __name__ == "__main__":
    main()
