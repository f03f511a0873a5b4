#!/usr/bin/env python3
"""Head-specialisation dynamics of head-role training (the paper's Figure 4 on our model), from the
gate_history.json files `lychee train-heads` writes, as one figure drawn with matplotlib:

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
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_common import plt, save  # noqa: E402

STEPS_SHOWN = (0, 100, 200, 500, 1000)
SHADES = ["#fdd0a2", "#fdae6b", "#fd8d3c", "#e6550d", "#a63603"]
DENSITY_MAX = 6.0


def kuma_pdf(x, a, b):
    """Density of the Kumaraswamy(a, b) variable on (0, 1)."""
    return a * b * x ** (a - 1) * (1 - x ** a) ** (b - 1)


def gated_heads(h):
    """Indices (into the [n_layers * n_kv_heads] layout) of the gated heads: layers >= 1."""
    return range(h["n_kv_heads"], h["n_layers"] * h["n_kv_heads"])


def ez_panel(ax, h):
    steps, ez, roles = h["steps"], h["expected_z"], h["roles"]
    for i in sorted(gated_heads(h), key=lambda i: roles[i]):  # retrieval heads drawn last, on top
        color, width = ("#d62728", 1.2) if roles[i] else ("#7f7f7f", 0.6)
        ax.plot(steps, [v[i] for v in ez], color=color, linewidth=width, alpha=0.8)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlim(0, max(steps[-1], 1))
    ax.set_title(f'{h["gate"]}: E[z] per head ({h["model"]})')
    ax.set_xlabel("training step")
    ax.set_ylabel("E[z]")
    n = sum(roles[i] for i in gated_heads(h))
    ax.text(0.02, 0.97, f"retrieval at the end: {n} heads", transform=ax.transAxes, va="top", fontsize=9,
            color="#d62728", bbox=dict(facecolor="white", edgecolor="none", alpha=0.85))


def snapshots(steps):
    """Indices of the snapshots nearest STEPS_SHOWN (those within the run), without repeats."""
    picked = []
    for target in STEPS_SHOWN:
        if target > steps[-1]:
            break
        k = min(range(len(steps)), key=lambda k: abs(steps[k] - target))
        if k not in picked:
            picked.append(k)
    return picked


def density_panel(ax, h, head):
    """Kumaraswamy densities of one head at the snapshots nearest STEPS_SHOWN."""
    n_gates = (h["n_layers"] - 1) * h["n_kv_heads"]
    g = head - h["n_kv_heads"]
    layer, kv = divmod(head, h["n_kv_heads"])
    xs = [0.005 + 0.99 * i / 200 for i in range(201)]
    for n, k in enumerate(snapshots(h["steps"])):
        a, b = math.exp(h["params"][k][g]), math.exp(h["params"][k][g + n_gates])
        ax.plot(xs, [min(kuma_pdf(x, a, b), DENSITY_MAX) for x in xs], color=SHADES[n % len(SHADES)], linewidth=1.6,
                label=f'step {h["steps"][k]}: a {a:.2f}, b {b:.2f}')
    ax.set_ylim(0, DENSITY_MAX)
    ax.set_xlim(0, 1)
    ax.set_title(f"Kumaraswamy density, layer {layer} KV head {kv} (final E[z] {h['expected_z'][-1][head]:.2f})",
                 fontsize=10)
    ax.set_xlabel("x (z = clamp(p + (q - p) x, 0, 1))")
    ax.set_ylabel("density")
    ax.legend(fontsize=8, loc="upper center")


def figure(runs):
    rows = []
    for h in runs:
        row = [("ez", h, None)]
        if h["gate"] == "hardkuma":
            final = h["expected_z"][-1]
            heads = sorted(gated_heads(h), key=lambda i: final[i])
            row += [("density", h, heads[-1]), ("density", h, heads[0])]
        rows.append(row)
    cols = max(len(r) for r in rows)
    fig, axes = plt.subplots(len(rows), cols, figsize=(5.6 * cols, 3.9 * len(rows)), squeeze=False)
    for r, row in enumerate(rows):
        for c in range(cols):
            if c >= len(row):
                axes[r][c].set_axis_off()
                continue
            kind, h, head = row[c]
            ez_panel(axes[r][c], h) if kind == "ez" else density_panel(axes[r][c], h, head)
    fig.tight_layout()
    return fig


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("histories", nargs="+", help="gate_history.json files")
    ap.add_argument("-o", "--out", required=True, help="the figure, .svg or .png")
    args = ap.parse_args()
    save(figure([json.load(open(p)) for p in args.histories]), args.out)


if __name__ == "__main__":
    main()
