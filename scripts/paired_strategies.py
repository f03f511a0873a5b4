#!/usr/bin/env python3
"""Paired comparison of two policies of `lychee eval --json` runs on the same samples (same
tasks, lengths, depths and seeds): issue 14's question whether one selection strategy beats
another at equal sparsity. Each side is FILE:LABEL (a run's file, a policy label in it). Per length:
the task-weighted mean accuracy of each side, the mean paired difference with a 95% interval
(normal approximation over the per-sample differences, each task weighing the same), the KV bytes
each side read over full attention's, and how many samples scored higher / lower.

  scripts/paired_strategies.py A.json:lychee-topk208 B.json:lychee-ratio0.1 [--markdown out.md]
(files may be gzipped: .json.gz; a side may pool several runs' files, comma-separated, e.g. the
seeds of a sweep: N10_L2048_s0.json,N10_L2048_s1.json:LABEL; the KV ratio is then their mean)
"""
import argparse
import collections
import gzip
import json
import sys

from strategies_table import task_weighted_mean


def load(spec):
    paths, _, label = spec.rpartition(":")
    if not paths:
        sys.exit(f"paired_strategies: '{spec}' is not FILE[,FILE...]:LABEL")
    recs, ratios = {}, collections.defaultdict(list)
    for path in paths.split(","):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            d = json.load(f)
        mine = {(r["length"], r["task"], r["depth"], r["seed"]): r["score"] for r in d["records"] if r["policy_label"] == label}
        if not mine:
            labels = sorted({r["policy_label"] for r in d["records"]})
            sys.exit(f"paired_strategies: {path} has no records of '{label}' (labels: {', '.join(labels)})")
        if set(mine) & set(recs):
            sys.exit(f"paired_strategies: {path} repeats samples of '{label}' already read (the same seed twice?)")
        recs.update(mine)
        for k in d["summary"]["kv"]:
            if k["policy_label"] == label:
                ratios[k["length"]].append(k["ratio"])
    kv = {length: sum(v) / len(v) for length, v in ratios.items()}
    return label, recs, kv


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--markdown")
    args = ap.parse_args()
    la, a, kva = load(args.a)
    lb, b, kvb = load(args.b)
    common = sorted(set(a) & set(b))
    if not common:
        sys.exit("paired_strategies: the two sides share no (length, task, depth, seed) sample")
    by_length = collections.defaultdict(lambda: collections.defaultdict(list))
    for key in common:
        by_length[key[0]][key[1]].append((a[key], b[key]))
    lines = [f"| length | {la} | {lb} | {lb} - {la} (points) | 95% interval | samples | {lb} higher / lower | KV bytes / full ({la}, {lb}) |",
             "|---:|---:|---:|---:|---:|---:|---|---|"]
    for length, tasks in sorted(by_length.items()):
        ma, _ = task_weighted_mean({t: [x for x, _ in v] for t, v in tasks.items()})
        mb, _ = task_weighted_mean({t: [y for _, y in v] for t, v in tasks.items()})
        _, half = task_weighted_mean({t: [y - x for x, y in v] for t, v in tasks.items()})
        up = sum(1 for v in tasks.values() for x, y in v if y > x)
        down = sum(1 for v in tasks.values() for x, y in v if y < x)
        n = sum(len(v) for v in tasks.values())
        bytes_text = f"{kva.get(length, float('nan')):.3f}, {kvb.get(length, float('nan')):.3f}"
        lines.append(f"| {length} | {100 * ma:.1f} | {100 * mb:.1f} | {100 * (mb - ma):+.1f} | ±{100 * half:.1f} | {n} | "
                     f"{up} / {down} | {bytes_text} |")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
