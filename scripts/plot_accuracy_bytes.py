#!/usr/bin/env python3
"""Accuracy against KV bytes read, per policy (issue 14's "accuracy vs bytes read" figure), from a
`lychee eval --json` results file, as an SVG without third-party packages: one panel per context
length; x = bytes read per decode step over what full attention reads (log scale), y = mean
accuracy over tasks (each task weighs the same, as eval's "Average" table); one colour per policy,
its budgets joined by a line; full attention at x = 1. A dashed grey line marks 1/8 of the bytes.
It also reads the table of a sweep (scripts/sweep_table.py --json): one series per (policy, run),
e.g. "lychee N10" and "lychee N10_b64" (block 64: dashed), with the 95% intervals as bars.

    python3 scripts/plot_accuracy_bytes.py docs/results/gpu/hybrid/eval_gpu.json \
        -o docs/results/paper_figures/accuracy_bytes_gpu.svg
    python3 scripts/plot_accuracy_bytes.py docs/results/sweep_gpu/grid_table.json \
        -o docs/results/sweep_gpu/accuracy_bytes.svg
"""
import argparse
import json
import math
from xml.sax.saxutils import escape

COLORS = {"full": "#555555", "lychee": "#d62728", "tidal": "#1f77b4", "quest": "#2ca02c", "duo": "#9467bd"}
# Series of a sweep table beyond the policy kinds: by the run's head count (block 64 runs dashed).
RUN_COLORS = ["#d62728", "#ff7f0e", "#8c564b", "#e377c2"]
DUO_COLORS = ["#9467bd", "#17becf", "#1f77b4", "#bcbd22"]


def series_styles(names):
    """{series name: (colour, dashed)}: a policy kind keeps its colour; a sweep table's "policy run"
    gets one colour per run's roles (its name without the _b<unit> suffix), block-unit runs dashed."""
    runs = sorted({n.partition(" ")[2].split("_b")[0] for n in names if " " in n})
    styles = {}
    for n in names:
        if n in COLORS:
            styles[n] = (COLORS[n], False)
            continue
        policy, _, run = n.partition(" ")
        i = runs.index(run.split("_b")[0]) % len(RUN_COLORS) if " " in n else 0
        styles[n] = ((DUO_COLORS if policy == "duo" else RUN_COLORS)[i], "_b" in run)
    return styles


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


def points_table(table):
    """The same shape from a sweep table: series "policy run" (run "base" is full attention), with
    the 95% interval as a fourth item."""
    out = {}
    for row in table["rows"]:
        kind = row["policy"].split()[0]
        name = kind if row["run"] == "base" else f"{kind} {row['run']}"
        out.setdefault(row["length"], {}).setdefault(name, []).append(
            (row["kv_bytes_ratio"], row["accuracy"], f"{row['run']}: {row['policy']}", row["ci95"]))
    return out


def panel(length, series, styles, x0, y0):
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
        color, dashed = styles[kind]
        pts = sorted(pts)
        if len(pts) > 1:
            path = " ".join(f"{sx(p[0]):.1f},{sy(p[1]):.1f}" for p in pts)
            dash = ' stroke-dasharray="6,4"' if dashed else ""
            out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5"{dash} points="{path}"/>')
        for p in pts:
            r, a, label = p[:3]
            if len(p) > 3:  # 95% interval
                out.append(f'<line x1="{sx(r):.1f}" y1="{sy(max(0.0, a - p[3])):.1f}" x2="{sx(r):.1f}" '
                           f'y2="{sy(min(1.0, a + p[3])):.1f}" stroke="{color}" stroke-width="1"/>')
            out.append(f'<circle cx="{sx(r):.1f}" cy="{sy(a):.1f}" r="3.5" fill="{color}"><title>{escape(label)}: '
                       f'{100 * a:.1f}% at {r:.3f}</title></circle>')
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="lychee eval --json output")
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args()
    r = json.load(open(args.results))
    data = points_table(r) if "rows" in r else points(r)
    styles = series_styles({k for sr in data.values() for k in sr})
    lengths = sorted(data)
    body = []
    for i, length in enumerate(lengths):
        body += panel(length, data[length], styles, PAD + i * (W + PAD), PAD)
    kinds = sorted({k for s in data.values() for k in s})
    width = PAD + len(lengths) * (W + PAD)
    lx, ly = PAD, PAD + H + 52
    for k in kinds:
        step = 80 if " " not in k else 170
        if lx + step > width:  # the legend wraps
            lx, ly = PAD, ly + 18
        color, dashed = styles[k]
        body.append(f'<circle cx="{lx}" cy="{ly}" r="4" fill="{color}"/>'
                    f'<text x="{lx + 8}" y="{ly + 4}" font-size="11">{escape(k + (" (dashed)" if dashed else ""))}</text>')
        lx += step
    run = r.get("run", {})
    caption = run.get("command", "") if "rows" not in r else f"sweep table of {r.get('folder', '')} (scripts/sweep_table.py)"
    body.append(f'<text x="{PAD}" y="{ly + 24}" font-size="10" fill="#555">{escape(caption)[:160]}</text>')
    height = ly + 38
    open(args.out, "w").write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                              f'font-family="sans-serif"><rect width="100%" height="100%" fill="#fff"/>'
                              + "".join(body) + "</svg>\n")


if __name__ == "__main__":
    main()
