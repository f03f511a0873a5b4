#!/usr/bin/env python3
"""Plots a `lychee serve` load benchmark (the JSON list of runs written by scripts/bench/serve_load.py)
against concurrency, one colour per policy, as an SVG without third-party packages: output tokens/s,
TTFT p50 (solid) and p99 (dashed), and TPOT p50 and p99, three panels side by side (log2 x axis,
log y for the latencies).

    python3 scripts/plot_serve.py docs/results/gpu/serving/serve_smollm2.json \
        -o docs/results/gpu/serving/serve_smollm2.svg
    python3 scripts/plot_serve.py docs/results/gpu/serving/serve_8b.json \
        -o docs/results/gpu/serving/serve_8b.svg
"""
import argparse
import json
import math
from xml.sax.saxutils import escape

COLORS = {"full": "#555555", "lychee": "#d62728", "tidal": "#1f77b4", "quest": "#2ca02c", "duo": "#9467bd",
          "hf sdpa": "#ff7f0e"}
EXTRA = ["#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#000000"]
DASH = "6,4"

# (title, [(key, dashed)], log y)
PANELS = [("output tokens/s", [("output_tok_s", False)], False),
          ("TTFT, ms (p50 solid, p99 dashed)", [("ttft_ms_p50", False), ("ttft_ms_p99", True)], True),
          ("TPOT, ms (p50 solid, p99 dashed)", [("tpot_ms_p50", False), ("tpot_ms_p99", True)], True)]


def num(v):
    """A finite float, or None for a missing / non-numeric / NaN / infinite value."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def fmt(v):
    """Tick label: 0.5, 2, 50, 2k, 20k, 1.5k."""
    if v >= 1000:
        k = v / 1000
        return f"{k:g}k"
    return f"{v:g}"


def linear_ticks(hi):
    """0 .. a 1/2/5 step multiple covering hi, about 5 intervals."""
    if hi <= 0:
        return [0, 1], 1
    raw = hi / 5
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    n = math.ceil(hi / step - 1e-9)
    return [i * step for i in range(n + 1)], n * step


def log_ticks(lo, hi, px_per_decade, min_gap=16):
    """Ticks between 10**lo and 10**hi: the finest of 1..9, 1/2/3/5, 1/2/5, 1/3 and powers of ten
    whose neighbours are all at least min_gap pixels apart."""
    for mults in ((1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9), (1, 2, 3, 5), (1, 2, 5), (1, 3), (1,)):
        out = [m * 10.0 ** e for e in range(math.floor(lo) - 1, math.ceil(hi) + 1) for m in mults
               if lo <= math.log10(m * 10.0 ** e) <= hi]
        gaps = [math.log10(b / a) * px_per_decade for a, b in zip(out, out[1:])]
        if not gaps or min(gaps) >= min_gap:
            return out
    return out


def series_name(run, counts):
    pol = str(run.get("policy", "?"))
    if counts[pol] > 1 and run.get("policy_args"):
        return f"{pol} {run['policy_args']}"
    return pol


def one_value(runs, key):
    vals = []
    for r in runs:
        v = r.get(key)
        if v is not None and str(v) not in vals:
            vals.append(str(v))
    return "/".join(vals) if vals else "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("serve", help="JSON file written by scripts/bench/serve_load.py")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    runs = json.load(open(a.serve))
    if isinstance(runs, dict):
        runs = [runs]
    runs = [r for r in runs if isinstance(r, dict) and r.get("levels")]
    if not runs:
        raise SystemExit(f"{a.serve}: no run with concurrency levels (not a load-mode file?)")

    counts = {}
    for r in runs:
        counts[str(r.get("policy", "?"))] = counts.get(str(r.get("policy", "?")), 0) + 1
    names, colors = [], {}
    extra = iter(EXTRA * 4)
    data = {}  # name -> {key: [(concurrency, value)]}
    for r in runs:
        name = series_name(r, counts)
        if name not in names:
            names.append(name)
            colors[name] = COLORS.get(str(r.get("policy")), None) or next(extra, "#000000")
        for lv in r["levels"]:
            c = num(lv.get("concurrency"))
            if c is None or c <= 0:
                continue
            for _, keys, _ in PANELS:
                for key, _ in keys:
                    v = num(lv.get(key))
                    if v is not None:
                        data.setdefault(name, {}).setdefault(key, []).append((c, v))
    concs = sorted({c for d in data.values() for pts in d.values() for c, _ in pts})
    if not concs:
        raise SystemExit(f"{a.serve}: no measured values")

    pw, ph = 330, 240          # plot area of one panel
    left, right = 62, 22       # per panel: room for y tick labels / gap to the next panel
    top, bottom = 58, 48       # title + panel title / x tick labels + axis label
    legend_w = 120
    panel_w = left + pw + right
    width, height = panel_w * len(PANELS) + legend_w, top + ph + bottom
    title = (f"lychee serve, {one_value(runs, 'label')}: {one_value(runs, 'prompt_tokens')}-token prompts, "
             f"{one_value(runs, 'output_tokens')} output tokens, {one_value(runs, 'gpu')} "
             f"(commit {one_value(runs, 'commit')})")
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="18" font-size="13">{escape(title)}</text>']

    lc, hc = math.log2(concs[0]), math.log2(concs[-1])

    for i, (ptitle, keys, logy) in enumerate(PANELS):
        x0 = i * panel_w + left
        y0 = top
        if hc > lc:
            px = lambda c, x0=x0: x0 + 12 + (math.log2(c) - lc) * (pw - 24) / (hc - lc)
        else:
            px = lambda c, x0=x0: x0 + pw / 2
        vals = [v for d in data.values() for key, _ in keys for _, v in d.get(key, [])]
        if logy:
            vals = [v for v in vals if v > 0]
        svg.append(f'<text x="{x0 + pw / 2:.1f}" y="{y0 - 8}" text-anchor="middle" font-size="12">'
                   f'{escape(ptitle)}</text>')
        svg.append(f'<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
        svg.append(f'<text x="{x0 + pw / 2:.1f}" y="{y0 + ph + 38}" text-anchor="middle">concurrency</text>')
        # x ticks at the measured concurrencies, skipping a label that would overlap the previous one
        last_right = -1e9
        for c in concs:
            x = px(c)
            label = f"{c:g}"
            half = 3.5 * len(label)
            svg.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y0 + ph}" y2="{y0 + ph + 4}" stroke="#999"/>')
            if x - half > last_right + 4:
                svg.append(f'<text x="{x:.1f}" y="{y0 + ph + 17}" text-anchor="middle">{label}</text>')
                last_right = x + half
        if not vals:
            svg.append(f'<text x="{x0 + pw / 2:.1f}" y="{y0 + ph / 2}" text-anchor="middle" fill="#999">'
                       'no data</text>')
            continue
        if logy:
            lo, hi = min(vals), max(vals)
            lo, hi = math.log10(lo / 1.3), math.log10(hi * 1.3)
            if hi - lo < 0.5:
                mid = (hi + lo) / 2
                lo, hi = mid - 0.25, mid + 0.25
            py = lambda v, lo=lo, hi=hi: y0 + ph * (1 - (math.log10(v) - lo) / (hi - lo))
            ticks = log_ticks(lo, hi, ph / (hi - lo))
        else:
            ticks, top_v = linear_ticks(max(vals) * 1.05)
            py = lambda v, t=top_v: y0 + ph * (1 - v / t)
        last_y = 1e9
        for t in ticks:
            y = py(t)
            if last_y - y < 16:      # keep tick labels more than a line apart
                continue
            last_y = y
            svg.append(f'<line x1="{x0}" x2="{x0 + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
            svg.append(f'<text x="{x0 - 5}" y="{y + 4:.1f}" text-anchor="end">{fmt(t)}</text>')
        for name in names:
            color = colors[name]
            for key, dashed in keys:
                pts = sorted(p for p in data.get(name, {}).get(key, []) if not logy or p[1] > 0)
                if not pts:
                    continue
                path = " ".join(f"{px(c):.1f},{py(v):.1f}" for c, v in pts)
                dash = f' stroke-dasharray="{DASH}"' if dashed else ""
                svg.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
                for c, v in pts:
                    fill = "white" if dashed else color
                    svg.append(f'<circle cx="{px(c):.1f}" cy="{py(v):.1f}" r="3" fill="{fill}" '
                               f'stroke="{color}" stroke-width="1.5"/>')

    # legend: policies by colour, then p50 / p99 line styles
    lx, ly = panel_w * len(PANELS) + 4, top + 6
    for j, name in enumerate(names):
        y = ly + 16 * j
        svg.append(f'<line x1="{lx}" x2="{lx + 22}" y1="{y}" y2="{y}" stroke="{colors[name]}" stroke-width="2"/>')
        svg.append(f'<circle cx="{lx + 11}" cy="{y}" r="3" fill="{colors[name]}"/>')
        svg.append(f'<text x="{lx + 28}" y="{y + 4}" fill="{colors[name]}">{escape(name)}</text>')
    y = ly + 16 * len(names) + 10
    for label, dashed in (("p50", False), ("p99", True)):
        dash = f' stroke-dasharray="{DASH}"' if dashed else ""
        svg.append(f'<line x1="{lx}" x2="{lx + 22}" y1="{y}" y2="{y}" stroke="#333" stroke-width="2"{dash}/>')
        svg.append(f'<circle cx="{lx + 11}" cy="{y}" r="3" fill="{"white" if dashed else "#333"}" '
                   'stroke="#333" stroke-width="1.5"/>')
        svg.append(f'<text x="{lx + 28}" y="{y + 4}">{label}</text>')
        y += 16
    svg.append("</svg>")
    open(a.out, "w").write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
