#!/usr/bin/env python3
"""Accuracy against KV bytes read, per policy (issue 14's "accuracy vs bytes read" figure), from a
`lychee eval --json` results file, drawn with matplotlib: one panel per context length; x = bytes
read per decode step over what full attention reads (log scale), y = mean accuracy over tasks
(each task weighs the same, as eval's "Average" table); one colour per policy, its budgets joined
by a line; full attention at x = 1. A dashed grey line marks 1/8 of the bytes.
It also reads the table of a sweep (scripts/sweep_table.py --json): one series per (policy, run),
e.g. "lychee N10" and "lychee N10_b64" (block 64: dashed), with the 95% intervals as bars.

    python3 scripts/plot_accuracy_bytes.py docs/results/gpu/hybrid/eval_gpu.json \
        -o docs/results/paper_figures/accuracy_bytes_gpu.svg
    python3 scripts/plot_accuracy_bytes.py docs/results/sweep_gpu/grid_table.json \
        -o docs/results/sweep_gpu/accuracy_bytes.svg
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_common import POLICY_COLORS, plt, save  # noqa: E402

# Series of a sweep table beyond the policy kinds: by the run's head count (block 64 runs dashed).
RUN_COLORS = ["#d62728", "#ff7f0e", "#8c564b", "#e377c2"]
DUO_COLORS = ["#9467bd", "#17becf", "#1f77b4", "#bcbd22"]
X_LO = 1 / 64


def series_styles(names):
    """{series name: (colour, dashed)}: a policy kind keeps its colour; a sweep table's "policy run"
    gets one colour per run's roles (its name without the _b<unit> suffix), block-unit runs dashed."""
    runs = sorted({n.partition(" ")[2].split("_b")[0] for n in names if " " in n})
    styles = {}
    for n in names:
        if n in POLICY_COLORS:
            styles[n] = (POLICY_COLORS[n], False)
            continue
        policy, _, run = n.partition(" ")
        i = runs.index(run.split("_b")[0]) % len(RUN_COLORS) if " " in n else 0
        styles[n] = ((DUO_COLORS if policy == "duo" else RUN_COLORS)[i], "_b" in run)
    return styles


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


def figure(data, caption=""):
    """One panel per length; each series a line with its points (clipped at x = 1/64), with 95%
    interval bars where the data has them."""
    lengths = sorted(data)
    if not lengths:
        raise SystemExit("plot_accuracy_bytes: no (policy, length) has both an accuracy and a KV ratio")
    styles = series_styles({k for sr in data.values() for k in sr})
    fig, axes = plt.subplots(1, len(lengths), figsize=(4.6 * len(lengths), 3.9), squeeze=False, sharey=True)
    for ax, length in zip(axes[0], lengths):
        ax.set_title(f"{length} tokens")
        ax.set_xscale("log")
        ax.set_xlim(X_LO / 1.25, 1.25)
        ax.set_ylim(-2, 102)
        ax.set_xticks([1 / 64, 1 / 16, 1 / 4, 1], ["1/64", "1/16", "1/4", "1"])
        ax.minorticks_off()
        ax.set_xlabel("KV bytes read / full attention's (log)")
        ax.axvline(1 / 8, color="#999999", linestyle="--", linewidth=1)
        ax.text(1 / 8 * 1.05, 97, "1/8", fontsize=8, color="#777777", va="top")
        for name, pts in sorted(data[length].items()):
            color, dashed = styles[name]
            pts = sorted(pts)
            xs = [max(p[0], X_LO) for p in pts]
            ys = [100 * p[1] for p in pts]
            ax.plot(xs, ys, marker="o", markersize=4, color=color, linestyle="--" if dashed else "-",
                    linewidth=1.5, label=name + (" (dashed)" if dashed else ""))
            if any(len(p) > 3 for p in pts):  # 95% intervals, clipped to [0, 100]
                lo = [y - max(0.0, 100 * (p[1] - p[3])) for y, p in zip(ys, pts)]
                hi = [min(100.0, 100 * (p[1] + p[3])) - y for y, p in zip(ys, pts)]
                ax.errorbar(xs, ys, yerr=[lo, hi], fmt="none", ecolor=color, elinewidth=1, capsize=0)
    axes[0][0].set_ylabel("mean accuracy (%)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    seen = dict(zip(labels, handles))
    for ax in axes[0][1:]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    fig.legend(list(seen.values()), list(seen.keys()), loc="lower center", ncol=min(len(seen), 6), fontsize=9,
               frameon=False, bbox_to_anchor=(0.5, -0.02 - 0.045 * ((len(seen) - 1) // 6)))
    if caption:
        fig.text(0.01, -0.08 - 0.045 * ((len(seen) - 1) // 6), caption[:160], fontsize=8, color="#555555")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="lychee eval --json output, or a sweep table (scripts/sweep_table.py --json)")
    ap.add_argument("-o", "--out", required=True, help="the figure, .svg or .png")
    args = ap.parse_args()
    r = json.load(open(args.results))
    data = points_table(r) if "rows" in r else points(r)
    caption = (r.get("run", {}).get("command", "") if "rows" not in r
               else f"sweep table of {r.get('folder', '')} (scripts/sweep_table.py)")
    save(figure(data, caption), args.out)


if __name__ == "__main__":
    main()
