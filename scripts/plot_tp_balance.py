#!/usr/bin/env python3
"""Per-layer attention time per GPU under tensor parallelism, from a `bench_e2e
--tensor-parallel 2 --profile-attention --json` results file: a summary (stdout, markdown) of the
slowest GPU over the mean per layer, split by whether the layer's retrieval-head count is even
(a balanced split exists) or odd (one GPU must hold one more dense head), and a figure (matplotlib)
with one group of bars per layer, one bar per GPU. The per-layer counts come from the seeded role
draw bench_e2e used, as `lychee heads tp` prints it.

    python3 scripts/plot_tp_balance.py docs/results/gpu/tp_h200x2/call5_bc3f05a/e2e_tp_b8.json \
        --lychee build/bin/lychee --retrieval 32 -o docs/results/gpu/tp_h200x2/balance_b8_128k.svg
"""
import argparse
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_common import plt, save  # noqa: E402

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]


def retrieval_counts(lychee, n_retrieval, gpus):
    """{layer: retrieval heads} of bench_e2e's seeded draw (layers without any are absent)."""
    out = subprocess.run([lychee, "heads", "tp", "--shape", "llama3-8b", "--random", str(n_retrieval),
                          "--gpus", str(gpus)], check=True, capture_output=True, text=True).stdout
    return {int(l): int(r) for l, r in re.findall(r"L(\d+)\(r(\d+)\)", out)}


def balance(t):
    """Per layer: the slowest GPU's attention time over the mean of the GPUs'; t = [gpu][layer] ms."""
    gpus, layers = len(t), len(t[0])
    return [max(t[g][l] for g in range(gpus)) / (sum(t[g][l] for g in range(gpus)) / gpus) for l in range(layers)]


def figure(t, counts, title):
    gpus, layers = len(t), len(t[0])
    fig, ax = plt.subplots(figsize=(12, 3.9))
    width = 0.8 / gpus
    for g in range(gpus):
        ax.bar([l + (g - (gpus - 1) / 2) * width for l in range(layers)], t[g], width,
               color=COLORS[g % len(COLORS)], label=f"GPU {g}")
    ax.set_xticks(range(layers), [str(counts.get(l, 0)) for l in range(layers)], fontsize=8)
    for l, label in enumerate(ax.get_xticklabels()):
        if counts.get(l, 0) % gpus:
            label.set_color("#d62728")
            label.set_fontweight("bold")
    ax.set_xlim(-0.6, layers - 0.4)
    ax.set_xlabel(f"layer 0..{layers - 1}: retrieval heads in the layer (red: not divisible by {gpus}, "
                  f"one GPU holds more)")
    ax.set_ylabel("ms (median of 5 eager steps)")
    ax.grid(axis="x", visible=False)
    ax.legend(loc="upper right", fontsize=9)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    ap.add_argument("--policy", default="lychee")
    ap.add_argument("--lychee", default="build/bin/lychee")
    ap.add_argument("--retrieval", type=int, default=32)
    ap.add_argument("-o", "--out", help="the figure, .svg or .png")
    a = ap.parse_args()
    j = json.load(open(a.json))
    rows = [r for r in j["rows"] if r.get("policy") == a.policy and r.get("attention_ms")
            and r.get("tensor_parallel", 1) > 1]
    if not rows:
        raise SystemExit(f"{a.json}: no tensor-parallel row of policy {a.policy} with attention_ms")
    row = rows[0]
    t = row["attention_ms"]  # [gpu][layer] ms
    gpus, layers = len(t), len(t[0])
    counts = retrieval_counts(a.lychee, a.retrieval, gpus)
    ratio = balance(t)
    even = [l for l in range(layers) if counts.get(l, 0) % gpus == 0]
    odd = [l for l in range(layers) if l not in even]
    print(f"{a.json}: {a.policy}, batch {row['batch']}, context {row['context']}, TP={gpus}, "
          f"commit {j.get('commit')}, {j.get('gpu')}")
    print("| layers | count | slowest GPU / mean per layer: worst | median |")
    print("|---|---:|---:|---:|")
    for name, ls in [(f"retrieval heads divisible by {gpus} (0 included)", even), ("not divisible", odd)]:
        if ls:
            v = sorted(ratio[l] for l in ls)
            print(f"| {name} | {len(ls)} | {v[-1]:.3f} | {v[len(v) // 2]:.3f} |")
    if a.out:
        title = (f"{a.policy}: attention per layer and GPU, batch {row['batch']}, {row['context'] // 1024}K, "
                 f"TP={gpus} ({j.get('gpu')}, commit {j.get('commit')})")
        save(figure(t, counts, title), a.out)


if __name__ == "__main__":
    main()
