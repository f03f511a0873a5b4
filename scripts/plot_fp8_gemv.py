#!/usr/bin/env python3
"""FP8 GEMV bandwidth against cuBLASLt, from a `bench_fp8_gemv --json` results file, drawn with
matplotlib: two panels side by side (n = 1 and n = 8 activation columns); in each, one group of
bars per layer shape and one bar per kernel; y = bytes that kernel reads over its time, as a
percent of the measured copy bandwidth (graph timing). A dashed line marks the file's
target_pct_copy, and the lychee bars carry their value. Rows without pct_copy are skipped.

    python3 scripts/plot_fp8_gemv.py docs/results/fp8_gpu/fp8_gemv.json \
        -o docs/results/fp8_gpu/fp8_gemv.svg
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_common import plt, save  # noqa: E402

SHAPES = ["qkv", "o", "gate_up", "down", "lm_head"]
KERNELS = [("lychee_fp8", "lychee FP8 GEMV", "#d62728"),
           ("cublaslt_bf16", "cuBLASLt bf16", "#1f77b4"),
           ("cublaslt_fp8", "cuBLASLt FP8", "#2ca02c")]
PANELS = [1, 8]
Y_MAX = 110.0


def table(rows):
    """{(n, shape, kernel): pct_copy} for the rows that have a number."""
    out = {}
    for r in rows:
        pct = r.get("pct_copy")
        if pct is None:
            continue
        out[(r.get("n"), r.get("shape"), r.get("kernel"))] = float(pct)
    return out


def figure(data, target, title, copy_gbs=None):
    if not data:
        raise SystemExit("plot_fp8_gemv: no row has a pct_copy")
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5.4 * len(PANELS), 3.8), sharey=True)
    width = 0.8 / len(KERNELS)
    for ax, n in zip(axes, PANELS):
        for j, (kernel, label, color) in enumerate(KERNELS):
            xs = [i + (j - (len(KERNELS) - 1) / 2) * width for i, s in enumerate(SHAPES) if (n, s, kernel) in data]
            ys = [min(data[(n, s, kernel)], Y_MAX) for s in SHAPES if (n, s, kernel) in data]
            bars = ax.bar(xs, ys, width, color=color, label=label)
            if kernel == "lychee_fp8":
                ax.bar_label(bars, fmt="%.0f", fontsize=8, padding=1)
        if target is not None:
            ax.axhline(float(target), color="#555555", linestyle="--", linewidth=1, zorder=3)
            ax.text(-0.45, float(target) + 1, f"target {float(target):g}%", ha="left", va="bottom",
                    fontsize=8, color="#555555")
        ax.set_xticks(range(len(SHAPES)), SHAPES)
        ax.set_ylim(0, Y_MAX)
        ax.set_title(f"n = {n}")
        ax.grid(axis="x", visible=False)
    axes[0].set_ylabel("% of copy bandwidth")
    handles, labels = axes[0].get_legend_handles_labels()
    if copy_gbs is not None:
        title = f"{title}; copy bandwidth {float(copy_gbs):.0f} GB/s"
    fig.legend(handles, labels, loc="lower center", ncol=len(KERNELS), frameon=False, bbox_to_anchor=(0.5, -0.03))
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="bench_fp8_gemv --json output")
    ap.add_argument("-o", "--out", required=True, help="the figure, .svg or .png")
    args = ap.parse_args()
    with open(args.results) as f:
        r = json.load(f)
    title = f'{r.get("gpu", "?")}, commit {r.get("commit", "?")}: bytes read / time vs copy bandwidth (graph timing)'
    save(figure(table(r.get("rows", [])), r.get("target_pct_copy"), title, r.get("copy_bandwidth_gbs")), args.out)


if __name__ == "__main__":
    main()
