#!/usr/bin/env python3
"""Paired comparison of two `lychee eval --json` results run on the same samples (same tasks,
lengths, depths, samples and seed) with something else changed (weights, a build, a setting).

Per policy label and length, and per policy over all lengths ("all": each (length, task) weighing
the same): mean accuracy of each run over tasks (each task weighs the same, as lychee eval's
"Average" table), the difference with the 95% interval of the mean paired difference (normal
approximation over the per-sample differences, strategies_table.task_weighted_mean), and how many
samples scored differently (up / down), which resolves far smaller differences than two
independent intervals would.

  scripts/compare_eval.py base.json test.json [--names f32 fp8] [--markdown out.md]
(either file may be gzipped: .json.gz, as committed under docs/results)
"""
import argparse, collections, gzip, json, sys

from strategies_table import task_weighted_mean


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
    for label in dict.fromkeys(k[0] for k in common):  # every length together, after the per-length rows
        lengths = {k[1] for k in common if k[0] == label}
        if len(lengths) > 1:
            groups[(label, "all")] = [k for k in common if k[0] == label]
    na, nb = args.names
    lines = [f"| policy | length | {na} | {nb} | {nb} - {na} (points) | 95% interval | samples | scored higher / lower in {nb} |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    order = list(dict.fromkeys(k[0] for k in common))
    rows = sorted(groups.items(), key=lambda g: (order.index(g[0][0]), g[0][1] == "all", 0 if g[0][1] == "all" else g[0][1]))
    for (label, length), keys in rows:
        strata = collections.defaultdict(list)  # (length, task) -> [(score a, score b)]
        for k in keys:
            strata[(k[1], k[2])].append((a[k]["score"], b[k]["score"]))
        ma, _ = task_weighted_mean({t: [x for x, _ in v] for t, v in strata.items()})
        mb, _ = task_weighted_mean({t: [y for _, y in v] for t, v in strata.items()})
        diff, half = task_weighted_mean({t: [y - x for x, y in v] for t, v in strata.items()})
        up = sum(1 for v in strata.values() for x, y in v if y > x)
        down = sum(1 for v in strata.values() for x, y in v if y < x)
        lines.append(f"| {label} | {length} | {100 * ma:.1f} | {100 * mb:.1f} | {100 * diff:+.1f} | "
                     f"[{100 * (diff - half):+.1f}, {100 * (diff + half):+.1f}] | {len(keys)} | {up} / {down} |")
    out = "\n".join(lines) + "\n"
    if missing:
        out += f"\n({missing} samples are in only one of the runs and are left out.)\n"
    print(out, end="")
    if args.markdown:
        open(args.markdown, "w").write(out)


if __name__ == "__main__":
    main()
