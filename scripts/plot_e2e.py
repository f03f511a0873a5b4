#!/usr/bin/env python3
"""Plots time per output token against context for every policy of a bench_e2e results file
(and Hugging Face transformers sdpa from hf_decode.py's file, if given), one panel per batch,
drawn with matplotlib (log-log axes); like the paper's latency figure.

    python3 scripts/plot_e2e.py docs/results/gpu/hybrid/e2e.json docs/results/gpu/hybrid/hf_decode.json \
        -o docs/results/gpu/hybrid/e2e_latency.svg
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402
from plot_common import POLICY_COLORS, plt, save  # noqa: E402


def series(e2e, hf=None):
    """{(batch, policy): [(context, tpot ms), ...]} of the rows that have a TPOT; transformers'
    rows under the policy "hf sdpa"."""
    out = {}
    for r in e2e["rows"]:
        if r.get("tpot_ms") is not None:
            out.setdefault((r["batch"], r["policy"]), []).append((r["context"], r["tpot_ms"]))
    for r in (hf or {}).get("rows", []):
        if r.get("tpot_ms") is not None:
            out.setdefault((r["batch"], "hf sdpa"), []).append((r["context"], r["tpot_ms"]))
    if not out:
        raise SystemExit("plot_e2e: no row has a tpot_ms")
    return {k: sorted(v) for k, v in out.items()}


def figure(data, title):
    batches = sorted({b for b, _ in data})
    contexts = sorted({c for pts in data.values() for c, _ in pts})
    fig, axes = plt.subplots(1, len(batches), figsize=(5.2 * len(batches), 4.0), squeeze=False)
    for ax, b in zip(axes[0], batches):
        for (bb, policy), pts in sorted(data.items()):
            if bb != b:
                continue
            ax.plot([c for c, _ in pts], [ms for _, ms in pts], marker="o", markersize=4, linewidth=2,
                    color=POLICY_COLORS.get(policy, "#000000"), label=policy)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(contexts, [f"{c // 1024}K" for c in contexts])
        ax.minorticks_off()
        ax.set_title(f"batch {b}")
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("time per output token (ms, log)")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.legend(fontsize=9)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("e2e", help="bench_e2e --json output")
    ap.add_argument("hf", nargs="?", help="scripts/bench/hf_decode.py --json output")
    ap.add_argument("-o", "--out", required=True, help="the figure, .svg or .png")
    a = ap.parse_args()
    e2e = json.load(open(a.e2e))
    data = series(e2e, json.load(open(a.hf)) if a.hf else None)
    title = f"Time per output token, Llama-3-8B shape, {e2e.get('gpu', '?')} (commit {e2e.get('commit', '?')})"
    save(figure(data, title), a.out)


if __name__ == "__main__":
    main()
