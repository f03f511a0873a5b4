#!/usr/bin/env python3
"""The table of a retrieval-head-count sweep (issue 14; `scripts/gpu/run_all.sh sweep-eighth`): the
`lychee eval --json` files of one folder, named RUN_L<length>_s<seed>.json (RUN: N<n> for
LycheeDecode with gates trained at n retrieval heads, base for Full and DuoAttention), pooled over
seeds. Per (run, policy label, length): the mean accuracy over tasks (each task weighs the same)
with a 95% interval over samples (normal approximation, as scripts/strategies_table.py), the
samples, the seeds, and the KV bytes read per decode step over full attention's (mean over the
files). Rows at or under --bytes (default 1/8) are marked.

    python3 scripts/sweep_table.py OUT/sweep [--bytes 0.125] [--json table.json]
"""
import argparse
import glob
import json
import os
import re

from strategies_table import task_weighted_mean


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("--bytes", type=float, default=0.125)
    ap.add_argument("--json")
    a = ap.parse_args()
    scores, ratios, seeds = {}, {}, {}
    files = sorted(glob.glob(os.path.join(a.folder, "*_L*_s*.json")))
    if not files:
        raise SystemExit(f"{a.folder}: no RUN_L<length>_s<seed>.json files")
    for path in files:
        m = re.match(r"(.+)_L(\d+)_s(\d+)\.json$", os.path.basename(path))
        if not m:
            continue
        run, seed = m.group(1), int(m.group(3))
        d = json.load(open(path))
        for k in d["summary"]["kv"]:
            ratios.setdefault((run, k["policy_label"], k["length"]), []).append(k["ratio"])
        for r in d["records"]:
            key = (run, r["policy_label"], r["length"])
            scores.setdefault(key, {}).setdefault(r["task"], []).append(r["score"])
            seeds.setdefault(key, set()).add(seed)
    rows = []
    for key in sorted(scores, key=lambda k: (k[2], k[0], k[1])):
        tasks = scores[key]
        acc, half = task_weighted_mean(tasks)
        rs = ratios.get(key, [])
        ratio = sum(rs) / len(rs) if rs else None
        rows.append({"run": key[0], "policy": key[1], "length": key[2], "accuracy": acc, "ci95": half,
                     "samples": sum(len(v) for v in tasks.values()), "seeds": sorted(seeds[key]),
                     "kv_bytes_ratio": ratio})
    print(f"| run | policy | length | accuracy (%) | 95% interval | samples | seeds | KV bytes / full | <= {a.bytes:g} |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        ratio = r["kv_bytes_ratio"]
        under = "yes" if ratio is not None and ratio <= a.bytes + 1e-9 else ""
        print(f"| {r['run']} | {r['policy']} | {r['length']} | {100 * r['accuracy']:.1f} | ±{100 * r['ci95']:.1f} | "
              f"{r['samples']} | {len(r['seeds'])} | {'' if ratio is None else f'{ratio:.3f}'} | {under} |")
    if a.json:
        json.dump({"folder": a.folder, "bytes_limit": a.bytes, "rows": rows}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
