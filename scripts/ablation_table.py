#!/usr/bin/env python3
"""Merge `lychee eval` JSON files of several head sets into one ablation table (JSON + markdown).
usage: ablation_table.py --out PREFIX [--command CMD] LABEL=EVAL.json ...
Rows: the head set (LABEL) and the policy it ran; columns: task x length accuracy, the mean, and
the fraction of the dense KV bytes that decode steps read."""
import argparse
import collections
import json
import subprocess


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--command", default="")
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    rows = collections.OrderedDict()
    cols = set()
    for run in a.runs:
        label, path = run.split("=", 1)
        for r in json.load(open(path))["records"]:
            name = r["policy_label"] if r["policy"] in ("full",) else (
                f"{r['policy_label']} (stand-in roles)" if label == "base" else f"{r['policy_label']}, {label} roles")
            key = (r["task"], r["length"])
            cols.add(key)
            row = rows.setdefault(name, {"scores": collections.defaultdict(list), "read": 0, "dense": 0})
            row["scores"][key].append(r["score"])
            row["read"] += r["kv_bytes_read"]
            row["dense"] += r["kv_bytes_dense"]
    cols = sorted(cols)
    commit = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    out = {"command": a.command, "commit": commit, "columns": [f"{t} {l}" for t, l in cols], "rows": []}
    lines = ["| head set / policy | " + " | ".join(f"{t} {l}" for t, l in cols) + " | mean | KV read |",
             "|---|" + "---:|" * (len(cols) + 2)]
    for name, row in rows.items():
        accs = [100.0 * sum(row["scores"][c]) / len(row["scores"][c]) if row["scores"][c] else None for c in cols]
        vals = [x for x in accs if x is not None]
        mean = sum(vals) / len(vals) if vals else 0.0
        frac = row["read"] / row["dense"] if row["dense"] else 0.0
        n = max(len(v) for v in row["scores"].values())
        out["rows"].append({"name": name, "accuracy": accs, "mean": mean, "kv_read_fraction": frac, "samples": n})
        lines.append(f"| {name} | " + " | ".join("-" if x is None else f"{x:.0f}" for x in accs) +
                     f" | {mean:.1f} | {100 * frac:.1f}% |")
    json.dump(out, open(a.out + ".json", "w"), indent=1)
    md = ["# Head-role ablation", "",
          f"Produced by `{a.command}` at commit `{commit}` on the CPU reference. Accuracy in %"
          " (mean over depths and samples); KV read = bytes decode steps read over what dense attention reads.", ""]
    open(a.out + ".md", "w").write("\n".join(md + lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
