#!/usr/bin/env python3
"""Paired comparison of two `lychee eval --json` results run on the same samples (same tasks,
lengths, depths, samples and seed) with something else changed (weights, a build, a setting).

Per policy label and length: mean accuracy of each run over tasks (each task weighs the same, as
lychee eval's "Average" table), the difference, and how many samples scored differently (up /
down), which resolves far smaller differences than two independent intervals would.

  scripts/compare_eval.py base.json test.json [--names f32 fp8] [--markdown out.md]
(either file may be gzipped: .json.gz, as committed under docs/results)
"""
import argparse, collections, gzip, json, sys


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        recs = json.load(f)["records"]
    return {(r["policy_label"], r["length"], r["task"], r["depth"], r["seed"]): r for r in recs}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("test")
    ap.add_argument("--names", nargs=2, default=["base", "test"])
    ap.add_argument("--markdown")
    args = ap.parse_args()
    a, b = load(args.base), load(args.test)
    common = sorted(set(a) & set(b))
    if not common:
        sys.exit("compare_eval: the two runs share no (policy, length, task, depth, seed) sample")
    missing = len(set(a) ^ set(b))
    groups = collections.OrderedDict()
    for key in common:
        groups.setdefault((key[0], key[1]), []).append(key)
    na, nb = args.names
    lines = [f"| policy | length | {na} | {nb} | {nb} - {na} (points) | samples | scored higher / lower in {nb} |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for (label, length), keys in groups.items():
        per_task = collections.defaultdict(lambda: [[], []])
        up = down = 0
        for k in keys:
            sa, sb = a[k]["score"], b[k]["score"]
            per_task[k[2]][0].append(sa)
            per_task[k[2]][1].append(sb)
            up += sb > sa
            down += sb < sa
        mean = lambda i: 100.0 * sum(sum(v[i]) / len(v[i]) for v in per_task.values()) / len(per_task)
        lines.append(f"| {label} | {length} | {mean(0):.1f} | {mean(1):.1f} | {mean(1) - mean(0):+.1f} | {len(keys)} | {up} / {down} |")
    out = "\n".join(lines) + "\n"
    if missing:
        out += f"\n({missing} samples are in only one of the runs and are left out.)\n"
    print(out, end="")
    if args.markdown:
        open(args.markdown, "w").write(out)


if __name__ == "__main__":
    main()
