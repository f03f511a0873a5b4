#!/usr/bin/env python3
"""Per-layer attention time per GPU under tensor parallelism, from a `bench_e2e
--tensor-parallel 2 --profile-attention --json` results file: a summary (stdout, markdown) of the
slowest GPU over the mean per layer, split by whether the layer's retrieval-head count is even
(a balanced split exists) or odd (one GPU must hold one more dense head), and an SVG (no
third-party packages) with one pair of bars per layer. The per-layer counts come from the
seeded role draw bench_e2e used, as `lychee heads tp` prints it.

    python3 scripts/plot_tp_balance.py docs/results/gpu/tp_h200x2/call5_bc3f05a/e2e_tp_b8.json \
        --lychee build/bin/lychee --retrieval 32 -o docs/results/gpu/tp_h200x2/balance_b8.svg
"""
import argparse
import json
import re
import subprocess
from xml.sax.saxutils import escape

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]


def retrieval_counts(lychee, n_retrieval, gpus):
    """{layer: retrieval heads} of bench_e2e's seeded draw (layers without any are absent)."""
    out = subprocess.run([lychee, "heads", "tp", "--shape", "llama3-8b", "--random", str(n_retrieval),
                          "--gpus", str(gpus)], check=True, capture_output=True, text=True).stdout
    return {int(l): int(r) for l, r in re.findall(r"L(\d+)\(r(\d+)\)", out)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    ap.add_argument("--policy", default="lychee")
    ap.add_argument("--lychee", default="build/bin/lychee")
    ap.add_argument("--retrieval", type=int, default=32)
    ap.add_argument("-o", "--out")
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
    ratio = [max(t[g][l] for g in range(gpus)) / (sum(t[g][l] for g in range(gpus)) / gpus) for l in range(layers)]
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
    if not a.out:
        return
    W, H, PAD = 900, 260, 60
    top = max(max(x) for x in t) * 1.1
    bw = W / layers / (gpus + 1)
    sy = lambda v: PAD + H * (1 - v / top)
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W + 2 * PAD}" height="{H + 2 * PAD + 30}" '
         f'font-family="sans-serif">',
         f'<text x="{PAD + W / 2}" y="24" text-anchor="middle" font-size="14">{escape(a.policy)}: attention '
         f'per layer and GPU, batch {row["batch"]}, {row["context"] // 1024}K, TP={gpus} '
         f'({escape(str(j.get("gpu")))}, commit {escape(str(j.get("commit")))})</text>',
         f'<line x1="{PAD}" y1="{PAD + H}" x2="{PAD + W}" y2="{PAD + H}" stroke="black"/>',
         f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{PAD + H}" stroke="black"/>',
         f'<text x="{PAD - 40}" y="{PAD + H / 2}" text-anchor="middle" font-size="11" '
         f'transform="rotate(-90 {PAD - 40} {PAD + H / 2})">ms (median of 5 eager steps)</text>']
    for k in range(5):
        v = top * k / 5
        s.append(f'<text x="{PAD - 6}" y="{sy(v) + 4}" text-anchor="end" font-size="10">{v:.2f}</text>')
    for l in range(layers):
        x0 = PAD + l * W / layers
        for g in range(gpus):
            s.append(f'<rect x="{x0 + (g + 0.5) * bw:.1f}" y="{sy(t[g][l]):.1f}" width="{bw:.1f}" '
                     f'height="{PAD + H - sy(t[g][l]):.1f}" fill="{COLORS[g % len(COLORS)]}"/>')
        r = counts.get(l, 0)
        mark = ' font-weight="bold" fill="#d62728"' if r % gpus else ""
        s.append(f'<text x="{x0 + W / layers / 2:.1f}" y="{PAD + H + 14}" text-anchor="middle" font-size="9"'
                 f'{mark}>{r}</text>')
    s.append(f'<text x="{PAD + W / 2}" y="{PAD + H + 32}" text-anchor="middle" font-size="11">layer 0..{layers - 1}: '
             f'retrieval heads in the layer (red: not divisible by {gpus}, one GPU holds more)</text>')
    for g in range(gpus):
        s.append(f'<rect x="{PAD + W - 150}" y="{PAD + 4 + 16 * g}" width="10" height="10" '
                 f'fill="{COLORS[g % len(COLORS)]}"/><text x="{PAD + W - 135}" y="{PAD + 13 + 16 * g}" '
                 f'font-size="11">GPU {g}</text>')
    s.append("</svg>")
    open(a.out, "w").write("\n".join(s) + "\n")


if __name__ == "__main__":
    main()
