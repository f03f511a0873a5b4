#!/usr/bin/env python3
"""Self-speculative decoding's computed throughput (docs/speculative.md): the acceptance measured by
`lychee eval --speculate G --json` (one file per γ; records carry drafted/accepted) combined with
the step times `bench_spec --json` measured (Full step, LycheeDecode step, verification of γ + 1
rows per sequence). Tokens per second are COMPUTED, not run end to end:

    speculative = batch x E(alpha, γ) / (γ T_draft + T_verify(γ)),  E = (1 - alpha^(γ+1)) / (1 - alpha)
    full = batch / T_full,  lychee alone = batch / T_draft

Prints a markdown table (best γ per batch and context), writes the rows as JSON with -j, and draws
the speed-up over Full against context, one line per batch, with -o.

    python3 scripts/plot_speculative.py --times spec_times.json --accept 2=acc_g2.json 4=acc_g4.json \\
        --policy lychee -j spec_summary.json -o speedup.svg
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_common import EXTRA_COLORS, plt, save  # noqa: E402


def expected_tokens(alpha, gamma):
    """Tokens a cycle emits when each draft stands with probability alpha, independently."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def acceptance(records, policy):
    """accepted / drafted over the eval records of `policy` (None when it drafted nothing)."""
    drafted = sum(r.get("drafted", 0) for r in records if r["policy"] == policy and r.get("drafted", -1) >= 0)
    accepted = sum(r.get("accepted", 0) for r in records if r["policy"] == policy and r.get("drafted", -1) >= 0)
    return accepted / drafted if drafted > 0 else None


def draft_ms(t, policy):
    """The draft step of `policy` in a bench_spec row: draft_ms_by (bench_spec --drafts), or draft_ms,
    which older files timed for LycheeDecode only."""
    if "draft_ms_by" in t:
        if policy not in t["draft_ms_by"]:
            raise SystemExit(f"bench_spec timed no {policy} draft step (it timed {', '.join(t['draft_ms_by'])}): "
                             f"bench_spec --drafts {policy}")
        return t["draft_ms_by"][policy]
    if policy != "lychee":
        raise SystemExit(f"these bench_spec times have LycheeDecode's draft step only, not {policy}'s")
    return t["draft_ms"]


def combine(times, alpha_by_gamma, policy="lychee"):
    """One row per (batch, context, γ) with the computed tokens/s and speed-ups; times = bench_spec's rows.
    The speculative rate uses `policy`'s draft step; "lychee_tok_s" is the draft alone (plain decoding
    with the draft policy)."""
    out = []
    for t in times:
        if "skipped" in t:
            continue
        b = t["batch"]
        full = 1000.0 * b / t["full_ms"]
        t_draft = draft_ms(t, policy)
        lychee = 1000.0 * b / t_draft
        for g_text, verify_ms in sorted(t["verify_ms"].items(), key=lambda kv: int(kv[0])):
            g = int(g_text)
            alpha = alpha_by_gamma.get(g)
            if alpha is None:
                continue
            spec = 1000.0 * b * expected_tokens(alpha, g) / (g * t_draft + verify_ms)
            out.append({"batch": b, "context": t["context"], "gamma": g, "acceptance": alpha,
                        "full_tok_s": full, "lychee_tok_s": lychee, "spec_tok_s": spec,
                        "speedup_vs_full": spec / full, "speedup_vs_lychee": spec / lychee})
    return out


def best(rows):
    """The row of the largest speed-up over Full per (batch, context)."""
    top = {}
    for r in rows:
        k = (r["batch"], r["context"])
        if k not in top or r["speedup_vs_full"] > top[k]["speedup_vs_full"]:
            top[k] = r
    return [top[k] for k in sorted(top)]


def figure(rows, title):
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    top = best(rows)
    for i, b in enumerate(sorted({r["batch"] for r in top})):
        pts = [r for r in top if r["batch"] == b]
        ax.plot([r["context"] / 1024 for r in pts], [r["speedup_vs_full"] for r in pts], marker="o",
                color=EXTRA_COLORS[i % len(EXTRA_COLORS)], label=f"batch {b}")
    ax.axhline(1.0, color="#555555", linestyle="--", linewidth=1, label="Full")
    ax.set_xlabel("context (K tokens)")
    ax.set_ylabel("speed-up over Full (best γ; computed)")
    ax.legend(fontsize=9)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def markdown(rows):
    lines = ["| batch | context | best γ | acceptance | Full tok/s | LycheeDecode tok/s | speculative tok/s | "
             "vs Full | vs LycheeDecode |", "|---|---|---|---|---|---|---|---|---|"]
    for r in best(rows):
        lines.append(f"| {r['batch']} | {r['context']} | {r['gamma']} | {r['acceptance']:.3f} | {r['full_tok_s']:.1f} | "
                     f"{r['lychee_tok_s']:.1f} | {r['spec_tok_s']:.1f} | {r['speedup_vs_full']:.2f}x | "
                     f"{r['speedup_vs_lychee']:.2f}x |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--times", required=True, help="bench_spec --json")
    ap.add_argument("--accept", nargs="+", required=True, metavar="GAMMA=FILE", help="lychee eval --speculate GAMMA --json")
    ap.add_argument("--policy", default="lychee")
    ap.add_argument("-j", "--json", help="the computed rows")
    ap.add_argument("-o", "--out", help="the figure, .svg or .png")
    a = ap.parse_args()
    alpha = {}
    for item in a.accept:
        g, _, path = item.partition("=")
        if not path:
            raise SystemExit(f"--accept {item}: expected GAMMA=FILE")
        alpha[int(g)] = acceptance(json.load(open(path))["records"], a.policy)
    times = json.load(open(a.times))
    rows = combine(times["rows"], {g: v for g, v in alpha.items() if v is not None}, a.policy)
    if not rows:
        raise SystemExit(f"{a.times}: no (batch, context, γ) with both a time and an acceptance of {a.policy}")
    sys.stdout.write(markdown(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"computed": "tokens/s from measured step times and measured acceptance (not end to end)",
                       "gpu": times.get("gpu"), "model": times.get("model"), "times_command": times.get("command"),
                       "commit": times.get("commit"), "policy": a.policy, "acceptance": alpha, "rows": rows},
                      f, indent=1)
    if a.out:
        save(figure(rows, f"{times.get('gpu', '')}, {times.get('model', '')}: speculative {a.policy} over Full"), a.out)


if __name__ == "__main__":
    main()
