#!/usr/bin/env python3
"""Plots a `lychee serve` load benchmark (the JSON list of runs written by scripts/bench/serve_load.py)
against concurrency, one colour per policy, drawn with matplotlib: output tokens/s, TTFT p50 (solid)
and p99 (dashed), and TPOT p50 and p99, three panels side by side (log2 x axis, log y for the
latencies).

    python3 scripts/plot_serve.py docs/results/gpu/serving/serve_smollm2.json \
        -o docs/results/gpu/serving/serve_smollm2.svg
    python3 scripts/plot_serve.py docs/results/gpu/serving/serve_8b.json \
        -o docs/results/gpu/serving/serve_8b.svg
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402
from plot_common import EXTRA_COLORS, POLICY_COLORS, plt, save  # noqa: E402

# (title, [(key, dashed)], log y)
PANELS = [("output tokens/s", [("output_tok_s", False)], False),
          ("TTFT, ms (p50 solid, p99 dashed)", [("ttft_ms_p50", False), ("ttft_ms_p99", True)], True),
          ("TPOT, ms (p50 solid, p99 dashed)", [("tpot_ms_p50", False), ("tpot_ms_p99", True)], True)]


def num(v):
    """A finite float, or None for a missing / non-numeric / NaN / infinite value."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def fmt(v, _=None):
    """Tick label: 0.5, 2, 50, 2k, 20k, 1.5k."""
    return f"{v / 1000:g}k" if v >= 1000 else f"{v:g}"


def series_name(run, counts):
    pol = str(run.get("policy", "?"))
    if counts[pol] > 1 and run.get("policy_args"):
        return f"{pol} {run['policy_args']}"
    return pol


def one_value(runs, key):
    vals = []
    for r in runs:
        v = r.get(key)
        if v is not None and str(v) not in vals:
            vals.append(str(v))
    return "/".join(vals) if vals else "?"


def load(runs, source="the file"):
    """(names in order, {name: colour}, {name: {key: [(concurrency, value), ...]}}) of the runs that
    have concurrency levels; non-numeric values are left out."""
    if isinstance(runs, dict):
        runs = [runs]
    runs = [r for r in runs if isinstance(r, dict) and r.get("levels")]
    if not runs:
        raise SystemExit(f"{source}: no run with concurrency levels (not a load-mode file?)")
    counts = {}
    for r in runs:
        counts[str(r.get("policy", "?"))] = counts.get(str(r.get("policy", "?")), 0) + 1
    names, colors, data = [], {}, {}
    extra = iter(EXTRA_COLORS * 4)
    for r in runs:
        name = series_name(r, counts)
        if name not in names:
            names.append(name)
            colors[name] = POLICY_COLORS.get(str(r.get("policy"))) or next(extra, "#000000")
        for lv in r["levels"]:
            c = num(lv.get("concurrency"))
            if c is None or c <= 0:
                continue
            for _, keys, _ in PANELS:
                for key, _ in keys:
                    v = num(lv.get(key))
                    if v is not None:
                        data.setdefault(name, {}).setdefault(key, []).append((c, v))
    if not any(data.values()):
        raise SystemExit(f"{source}: no measured values")
    return runs, names, colors, data


def figure(runs, names, colors, data):
    concs = sorted({c for d in data.values() for pts in d.values() for c, _ in pts})
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.4 * len(PANELS) + 1.6, 3.8))
    for ax, (title, keys, logy) in zip(axes, PANELS):
        ax.set_title(title)
        ax.set_xscale("log", base=2)
        ax.set_xticks(concs, [f"{c:g}" for c in concs])
        ax.minorticks_off()
        ax.set_xlabel("concurrency")
        drawn = False
        for name in names:
            for key, dashed in keys:
                pts = sorted(p for p in data.get(name, {}).get(key, []) if not logy or p[1] > 0)
                if not pts:
                    continue
                drawn = True
                ax.plot([c for c, _ in pts], [v for _, v in pts], color=colors[name], linewidth=2,
                        linestyle="--" if dashed else "-", marker="o", markersize=4,
                        markerfacecolor="white" if dashed else colors[name], label=f"{name} {key}")
        if not drawn:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", color="#999999")
        if logy:
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
            ax.yaxis.set_minor_formatter(NullFormatter())
        else:
            ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(FuncFormatter(fmt))
    handles = [Line2D([], [], color=colors[n], linewidth=2, marker="o", markersize=4, label=n) for n in names]
    handles += [Line2D([], [], color="#333333", linewidth=2, marker="o", markersize=4, label="p50"),
                Line2D([], [], color="#333333", linewidth=2, linestyle="--", marker="o", markersize=4,
                       markerfacecolor="white", label="p99")]
    fig.legend(handles=handles, loc="center right", frameon=False, fontsize=9)
    fig.suptitle(f"lychee serve, {one_value(runs, 'label')}: {one_value(runs, 'prompt_tokens')}-token prompts, "
                 f"{one_value(runs, 'output_tokens')} output tokens, {one_value(runs, 'gpu')} "
                 f"(commit {one_value(runs, 'commit')})", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1 - 1.5 / (4.4 * len(PANELS) + 1.6), 1))
    return fig


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("serve", help="JSON file written by scripts/bench/serve_load.py")
    ap.add_argument("-o", "--out", required=True, help="the figure, .svg or .png")
    a = ap.parse_args()
    save(figure(*load(json.load(open(a.serve)), a.serve)), a.out)


if __name__ == "__main__":
    main()
