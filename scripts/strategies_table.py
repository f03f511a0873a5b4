#!/usr/bin/env python3
"""The selection-strategy table (issue 14 item 1; the paper's appendix tables of performance and
sparsity per strategy) from the `lychee eval --json` files that scripts/eval_strategies_cpu.sh
writes into one folder: per policy label, the mean accuracy over tasks (each task weighs the same,
as eval's "Average" table) with a 95% interval over samples (normal approximation), the KV bytes
read per decode step over full attention's, and the sparse heads' sparsity derived from it: with
a share r of the KV heads retrieval heads (dense), bytes = r + (1 - r) (1 - sparsity).

    python3 scripts/strategies_table.py docs/results/strategies_cpu [--retrieval-share 0.144]
"""
import argparse
import glob
import json
import math
import os


def task_weighted_mean(tasks):
    """The mean over tasks of each task's mean ({task: [values]}, every task weighing the same) and
    the half-width of its 95% interval (normal approximation: each task's sample variance over its
    count, weighted 1/T^2). Shared by sweep_table.py and paired_strategies.py."""
    means = [sum(v) / len(v) for v in tasks.values()]
    var = sum((sum((x - m) ** 2 for x in v) / max(len(v) - 1, 1)) / len(v) for v, m in zip(tasks.values(), means))
    var /= len(means) ** 2
    return sum(means) / len(means), 1.96 * math.sqrt(var)


def rows(path):
    d = json.load(open(path))
    ratio = {(k["policy_label"], k["length"]): k["ratio"] for k in d["summary"]["kv"]}
    per = {}
    for r in d["records"]:
        per.setdefault((r["policy_label"], r["length"]), {}).setdefault(r["task"], []).append(r["score"])
    for (label, length), tasks in sorted(per.items()):
        acc, half = task_weighted_mean(tasks)
        n = sum(len(v) for v in tasks.values())
        yield label, length, acc, half, n, ratio.get((label, length))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("--retrieval-share", type=float, default=13 / 90,
                    help="share of KV heads that are retrieval heads (the committed roles: 13 of 90)")
    args = ap.parse_args()
    r = args.retrieval_share
    print("| policy | length | accuracy (%) | 95% interval | samples | KV bytes / full | sparse-head sparsity (%) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for path in sorted(glob.glob(os.path.join(args.folder, "eval_*.json"))):
        for label, length, acc, half, n, ratio in rows(path):
            lychee = label.startswith("lychee") and ratio is not None  # the formula is LycheeDecode's
            sparsity = f"{100 * (1 - (ratio - r) / (1 - r)):.1f}" if lychee else ""
            ratio_text = "" if ratio is None else f"{ratio:.3f}"
            print(f"| {label} | {length} | {100 * acc:.1f} | ±{100 * half:.1f} | {n} | {ratio_text} | {sparsity} |")


if __name__ == "__main__":
    main()
