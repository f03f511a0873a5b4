#!/usr/bin/env python3
"""The performance/efficiency trade-off of LycheeDecode over budget x retrieval-head share (issue 14
item 3; the paper's ablation on Llama-3-8B), from two committed results:

  - accuracy on the default model: a sweep table (scripts/sweep_table.py --json, e.g.
    docs/results/sweep_gpu/grid_table.json), LycheeDecode's rows of each run (its retrieval-head
    share: --run NAME=SHARE, e.g. N10=0.144 with layer 0 counted) at budgets of length / d, as a
    percentage of full attention's accuracy at the same length, averaged over the lengths;
  - speed on the 8B shape: bench_e2e JSON files (`scripts/gpu/run_all.sh bench-tradeoff`), one per
    (retrieval KV heads, budget, context), LycheeDecode's TPOT against Full's in the same file.

Points are matched by shares: a budget of length / d on the default model with the speed at a
budget of context / d, and a retrieval share with the bench run whose --retrieval over 256 KV heads
is nearest. Draws a figure with matplotlib (x: speedup over Full, y: % of full attention's accuracy; one colour per
retrieval share, budgets joined by a line) and a Markdown table.

    python3 scripts/plot_tradeoff.py docs/results/sweep_gpu/grid_table.json OUT/bench-tradeoff/*.json \\
        --run N10=0.144 --run N22=0.278 --context 131072 -o docs/results/paper_figures/tradeoff.svg \\
        --markdown docs/results/paper_figures/tradeoff.md
"""
import argparse
import collections
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from matplotlib.ticker import FuncFormatter  # noqa: E402
from plot_common import plt, save  # noqa: E402

COLORS = ["#d62728", "#ff7f0e", "#2ca02c", "#1f77b4"]
KV_HEADS_8B = 256


def accuracy_by_share(table, runs):
    """{(run, d): mean over lengths of LycheeDecode's accuracy / full attention's} for each run's rows
    of block 16, d = length / budget."""
    full = {r["length"]: r["accuracy"] for r in table["rows"] if r["run"] == "base"}
    acc = collections.defaultdict(list)
    for r in table["rows"]:
        if r["run"] not in runs or not r["policy"].startswith("lychee topk"):
            continue
        m = re.match(r"lychee topk (\d+) block (\d+)", r["policy"])
        if not m or r["length"] not in full or full[r["length"]] <= 0:
            continue
        d = round(r["length"] / int(m.group(1)))
        acc[(r["run"], d)].append(r["accuracy"] / full[r["length"]])
    return {k: sum(v) / len(v) for k, v in acc.items()}


def speed_by_share(paths, context):
    """{(retrieval KV heads, d): LycheeDecode's speedup over Full} at `context`, d = context / budget."""
    out = {}
    for path in paths:
        j = json.load(open(path))
        budget, retrieval = j["budget"], j["retrieval_kv_heads"]
        rows = [r for r in j["rows"] if r["context"] == context and r["batch"] == 1]
        full = [r["tpot_ms"] for r in rows if r["policy"] == "full"]
        lychee = [r["tpot_ms"] for r in rows if r["policy"] == "lychee"]
        if not full or not lychee:
            continue
        out[(retrieval, round(context / budget))] = (full[0] / lychee[0], lychee[0], full[0], j.get("commit", "?"),
                                                      j.get("gpu", "?"))
    return out


def figure(points, runs, context):
    """x: speedup over Full, y: % of full attention's accuracy; one line per run (its retrieval
    share), each point labelled with its budget share 1/d."""
    fig, ax = plt.subplots(figsize=(7.2, 5.0))
    for i, (run, pts) in enumerate(sorted(points.items())):
        color = COLORS[i % len(COLORS)]
        pts = sorted(pts)
        ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], color=color, linewidth=1.5, marker="o",
                markersize=5, label=f"{run} ({100 * runs[run]:.0f}% retrieval)")
        for sp, ac, d, *_ in pts:
            ax.annotate(f"1/{d}", (sp, 100 * ac), textcoords="offset points", xytext=(5, 5), fontsize=8, color=color)
    xs = [p[0] for pts in points.values() for p in pts]
    ys = [p[1] for pts in points.values() for p in pts]
    ax.set_xlim(min(1.0, min(xs)) * 0.95, max(xs) * 1.05)
    ax.set_ylim(100 * min(0.5, min(ys) - 0.05), 105)
    ax.axhline(100, color="#999999", linestyle="--", linewidth=1)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_xlabel("TPOT speedup over Full")
    ax.set_ylabel("% of full attention's accuracy (mean over 2K-8K)")
    ax.set_title(f"LycheeDecode: accuracy (default model) against speed\n(Llama-3-8B shape, {context // 1024}K, batch 1)")
    ax.legend(loc="lower left", fontsize=9)
    fig.tight_layout()
    return fig


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("table", help="sweep table JSON (scripts/sweep_table.py --json)")
    ap.add_argument("bench", nargs="+", help="bench_e2e JSON files, one per (retrieval, budget)")
    ap.add_argument("--run", action="append", required=True, help="NAME=SHARE: a run of the table and its retrieval share")
    ap.add_argument("--context", type=int, default=131072, help="the bench context the speed is read at")
    ap.add_argument("-o", "--out", required=True, help="the figure, .svg or .png")
    ap.add_argument("--markdown")
    a = ap.parse_args()
    runs = {}
    for spec in a.run:
        name, _, share = spec.partition("=")
        if not share:
            sys.exit(f"plot_tradeoff: --run {spec}: expected NAME=SHARE")
        runs[name] = float(share)
    acc = accuracy_by_share(json.load(open(a.table)), runs)
    speed = speed_by_share(a.bench, a.context)
    if not speed:
        sys.exit(f"plot_tradeoff: no bench file has Full and LycheeDecode at context {a.context}, batch 1")
    bench_retrievals = sorted({r for r, _ in speed})
    points = collections.defaultdict(list)  # run -> [(speedup, accuracy, d, retrieval, tpot, full)]
    for (run, d), ac in sorted(acc.items()):
        retrieval = min(bench_retrievals, key=lambda r: abs(r / KV_HEADS_8B - runs[run]))
        if (retrieval, d) in speed:
            s = speed[(retrieval, d)]
            points[run].append((s[0], ac, d, retrieval, s[1], s[2]))
    if not points:
        sys.exit("plot_tradeoff: no (run, budget share) of the table has a bench file at the same shares")

    lines = ["| run (retrieval share) | budget share | bench retrieval KV heads | % of full accuracy | "
             "LycheeDecode TPOT ms | Full TPOT ms | speedup |", "|---|---:|---:|---:|---:|---:|---:|"]
    for run, pts in sorted(points.items()):
        for sp, ac, d, retrieval, tpot, full in sorted(pts):
            lines.append(f"| {run} ({100 * runs[run]:.1f}%) | 1/{d} | {retrieval} | {100 * ac:.1f} | {tpot:.3f} | "
                         f"{full:.3f} | {sp:.2f}x |")
    save(figure(points, runs, a.context), a.out)
    text = "\n".join(lines)
    print(text)
    if a.markdown:
        open(a.markdown, "w").write(text + "\n")


if __name__ == "__main__":
    main()
