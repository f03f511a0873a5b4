#!/usr/bin/env python3
"""Heatmaps of `lychee heads overlap --json` (the paper's Figure 1 on our model), drawn with
matplotlib: per case, the top-k overlap of each head with the same-index head of the next layer,
layers down, heads across, white 0 to dark red 1.

    build/bin/lychee heads overlap --json docs/results/paper_figures/topk_overlap.json
    python3 scripts/plot_overlap.py docs/results/paper_figures/topk_overlap.json -o docs/results/paper_figures/topk_overlap.svg
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from matplotlib.colors import LinearSegmentedColormap  # noqa: E402
from plot_common import plt, save  # noqa: E402

CMAP = LinearSegmentedColormap.from_list("overlap", ["#ffffff", "#a50000"])


def matrix(case):
    """[n_layers - 1][n_heads] overlaps of layer l's head h with layer l + 1's, from the flat list;
    a list of another length is an error naming the case."""
    n_layers, n_heads, flat = case["n_layers"], case["n_heads"], case["overlap"]
    if len(flat) != (n_layers - 1) * n_heads:
        raise SystemExit(f"plot_overlap: case {case.get('answer', '?')!r}: {len(flat)} overlaps, expected "
                         f"(n_layers - 1) x n_heads = {(n_layers - 1) * n_heads}")
    return [flat[l * n_heads:(l + 1) * n_heads] for l in range(n_layers - 1)]


def figure(d):
    cases = d["cases"]
    if not cases:
        raise SystemExit("plot_overlap: the file has no cases")
    fig, axes = plt.subplots(1, len(cases), figsize=(2.3 * len(cases) + 1.0, 6.4), squeeze=False, sharey=True)
    image = None
    for i, (ax, c) in enumerate(zip(axes[0], cases)):
        m = matrix(c)
        mean = sum(c["overlap"]) / len(c["overlap"])
        image = ax.imshow(m, cmap=CMAP, vmin=0, vmax=1, aspect="auto", interpolation="nearest")
        ax.set_title(f'case {i + 1}: "{c["answer"].strip()}"\nmean {mean:.2f}', fontsize=9)
        ax.set_xlabel("head")
        ax.set_xticks(range(0, c["n_heads"], 2))
        ax.grid(False)
    axes[0][0].set_ylabel("layer l vs l + 1")
    fig.suptitle(f'Top-{d["k"]} overlap of same-index heads in adjacent layers, {d["model"]}', fontsize=11)
    fig.tight_layout(rect=(0, 0, 0.93, 1))
    cax = fig.add_axes((0.94, 0.15, 0.015, 0.7))
    fig.colorbar(image, cax=cax, label="overlap")
    return fig


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", help="lychee heads overlap --json output")
    ap.add_argument("-o", "--out", required=True, help="the figure, .svg or .png")
    a = ap.parse_args()
    save(figure(json.load(open(a.json))), a.out)


if __name__ == "__main__":
    main()
