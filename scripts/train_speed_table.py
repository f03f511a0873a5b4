#!/usr/bin/env python3
"""The head-role trainer's speed table (docs/trainer.md, "Train roles for your model";
docs/results/train_speed/) from `bench_train_step --json` files: one row per (shape, context,
variant) with the phases in ms, the step, the student's reserved memory and the device's used
memory, and the variant's dz difference from the file's first variant (the bf16 prefill's effect on
the gradient). Stops on a file that is not a train_step bench or lacks a field the table prints.

  train_speed_table.py BENCH.json [BENCH.json ...] [--markdown OUT.md]
"""
import argparse
import json
import sys

PHASES = [("context_ms", "context"), ("teacher_ms", "teacher"), ("student_forward_ms", "s.fwd"),
          ("student_loss_ms", "s.loss"), ("student_backward_ms", "s.bwd")]
FIELDS = [k for k, _ in PHASES] + ["step_wall_ms", "memory_gib", "device_used_gib", "dz_rel_diff_vs_first"]


def rows_of(path):
    with open(path) as f:
        j = json.load(f)
    if j.get("bench") != "train_step":
        raise ValueError(f"{path}: not a bench_train_step file (bench = {j.get('bench')!r})")
    for k in ("shape", "context", "targets", "gpu", "results"):
        if k not in j:
            raise ValueError(f"{path}: no field {k!r}")
    out = []
    for r in j["results"]:
        missing = [k for k in FIELDS + ["variant"] if k not in r]
        if missing:
            raise ValueError(f"{path}: variant {r.get('variant')!r} lacks {', '.join(missing)}")
        out.append((j, r))
    return out


def table(paths):
    lines = ["| shape | context + targets | GPU | variant | " + " | ".join(n for _, n in PHASES) +
             " | step (ms) | reserved GiB | device GiB | dz vs first |",
             "|---|---:|---|---|" + "---:|" * (len(PHASES) + 4)]
    for p in paths:
        for j, r in rows_of(p):
            cells = [j["shape"], f"{j['context']} + {j['targets']}", j["gpu"], r["variant"]]
            cells += [f"{r[k]:.1f}" for k, _ in PHASES]
            cells += [f"{r['step_wall_ms']:.1f}", f"{r['memory_gib']:.1f}", f"{r['device_used_gib']:.1f}",
                      "ref" if r is j["results"][0] else f"{r['dz_rel_diff_vs_first']:.1e}"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench", nargs="+")
    ap.add_argument("--markdown", default="")
    a = ap.parse_args()
    try:
        text = table(a.bench)
    except (ValueError, OSError, json.JSONDecodeError) as e:
        sys.exit(f"train_speed_table.py: {e}")
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
