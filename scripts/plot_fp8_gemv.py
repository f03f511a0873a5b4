#!/usr/bin/env python3
"""FP8 GEMV bandwidth against cuBLASLt, from a `bench_fp8_gemv --json` results file, as an SVG
without third-party packages: two panels side by side (n = 1 and n = 8 activation columns); in
each, one group of bars per layer shape and one bar per kernel; y = bytes that kernel reads over
its time, as a percent of the measured copy bandwidth (graph timing). A dashed line marks the
file's target_pct_copy, and the lychee bars carry their value. Rows without pct_copy are skipped.

    python3 scripts/plot_fp8_gemv.py docs/results/fp8_gpu/fp8_gemv.json \
        -o docs/results/fp8_gpu/fp8_gemv.svg
"""
import argparse
import json
from xml.sax.saxutils import escape

SHAPES = ["qkv", "o", "gate_up", "down", "lm_head"]
KERNELS = [("lychee_fp8", "lychee FP8 GEMV", "#d62728"),
           ("cublaslt_bf16", "cuBLASLt bf16", "#1f77b4"),
           ("cublaslt_fp8", "cuBLASLt FP8", "#2ca02c")]
PANELS = [1, 8]
W, H, PAD = 420, 260, 56
Y_MAX = 110.0


def table(rows):
    """{(n, shape, kernel): pct_copy} for the rows that have a number."""
    out = {}
    for r in rows:
        pct = r.get("pct_copy")
        if pct is None:
            continue
        out[(r.get("n"), r.get("shape"), r.get("kernel"))] = float(pct)
    return out


def panel(n, data, target, x0, y0):
    # y position of a percentage, clipped to the axis range
    sy = lambda p: y0 + H * (1 - min(max(p, 0.0), Y_MAX) / Y_MAX)
    out = [f'<text x="{x0 + W / 2}" y="{y0 - 10}" text-anchor="middle" font-size="13">n = {n}</text>',
           f'<text x="{x0 - 40}" y="{y0 + H / 2}" text-anchor="middle" font-size="11" '
           f'transform="rotate(-90 {x0 - 40} {y0 + H / 2})">% of copy bandwidth</text>']
    # horizontal grid lines with their labels every 20 percent
    for p in range(0, int(Y_MAX) + 1, 20):
        out.append(f'<line x1="{x0}" y1="{sy(p):.1f}" x2="{x0 + W}" y2="{sy(p):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{x0 - 6}" y="{sy(p) + 3:.1f}" text-anchor="end" font-size="10">{p}</text>')
    group = W / len(SHAPES)
    bar = group * 0.8 / len(KERNELS)
    for i, shape in enumerate(SHAPES):
        gx = x0 + i * group + group * 0.1
        out.append(f'<text x="{x0 + (i + 0.5) * group:.1f}" y="{y0 + H + 16}" text-anchor="middle" '
                   f'font-size="11">{escape(shape)}</text>')
        for j, (kernel, label, color) in enumerate(KERNELS):
            pct = data.get((n, shape, kernel))
            if pct is None:
                continue
            bx, top = gx + j * bar, sy(pct)
            out.append(f'<rect x="{bx:.1f}" y="{top:.1f}" width="{bar:.1f}" height="{y0 + H - top:.1f}" '
                       f'fill="{color}"><title>{escape(label)}, {escape(shape)}, n = {n}: '
                       f'{pct:.1f}%</title></rect>')
            if kernel == "lychee_fp8":
                out.append(f'<text x="{bx + bar / 2:.1f}" y="{top - 3:.1f}" text-anchor="middle" '
                           f'font-size="9">{pct:.0f}</text>')
    # the target line goes over the bars so it stays visible
    if target is not None:
        ty = sy(float(target))
        out.append(f'<line x1="{x0}" y1="{ty:.1f}" x2="{x0 + W}" y2="{ty:.1f}" stroke="#555" '
                   f'stroke-dasharray="6,4"/>')
        out.append(f'<text x="{x0 + W - 2}" y="{ty - 4:.1f}" text-anchor="end" font-size="9" '
                   f'fill="#555">target {float(target):g}%</text>')
    out.append(f'<rect x="{x0}" y="{y0}" width="{W}" height="{H}" fill="none" stroke="#000"/>')
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="bench_fp8_gemv --json output")
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args()
    with open(args.results) as f:
        r = json.load(f)
    data = table(r.get("rows", []))
    top = PAD + 20  # room for the title line above the panel headings
    title = (f'{r.get("gpu", "?")}, commit {r.get("commit", "?")}: '
             f'bytes read / time vs copy bandwidth (graph timing)')
    body = [f'<text x="{PAD}" y="22" font-size="14">{escape(title)}</text>']
    for i, n in enumerate(PANELS):
        body += panel(n, data, r.get("target_pct_copy"), PAD + i * (W + PAD), top)
    # legend, one coloured square per kernel
    lx, ly = PAD, top + H + 36
    for _, label, color in KERNELS:
        body.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{color}"/>'
                    f'<text x="{lx + 14}" y="{ly}" font-size="11">{escape(label)}</text>')
        lx += 130
    copy = r.get("copy_bandwidth_gbs")
    if copy is not None:
        body.append(f'<text x="{lx + 20}" y="{ly}" font-size="10" fill="#555">copy bandwidth '
                    f'{float(copy):.0f} GB/s</text>')
    width, height = PAD + len(PANELS) * (W + PAD), top + H + 56
    with open(args.out, "w") as f:
        f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                f'font-family="sans-serif"><rect width="100%" height="100%" fill="#fff"/>'
                + "".join(body) + "</svg>\n")


if __name__ == "__main__":
    main()
