#!/usr/bin/env python3
"""lychee beside vLLM, from the same run: the decode table (bench_e2e's JSON and
scripts/bench/vllm_decode.py's) and the serving table (scripts/bench/serve_load.py's JSON of
`lychee serve` and of `vllm serve`), as markdown, with issue 37's targets checked:

  decode   lychee Full TPOT <= vLLM's at every batch and context; LycheeDecode >= 1.6x faster than
           vLLM at batch 1, 128K
  serving  lychee's output tok/s >= vLLM's at every concurrency, with TTFT p99 no worse

    python3 scripts/bench/vllm_compare.py --e2e e2e.json --vllm vllm_decode.json \\
        --serve-lychee serve_lychee.json --serve-vllm serve_vllm.json --markdown vllm_vs_lychee.md
"""
import argparse
import json
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def fmt(x, digits=3):
    return "-" if x is None else f"{x:.{digits}f}"


def decode_table(e2e, vllm):
    """Markdown lines, and the targets: {name: True/False/None (not measured)}."""
    ours = {}
    for r in e2e.get("rows", []):
        if "tpot_ms" in r and r.get("weights", "bf16") == "bf16" and r.get("tensor_parallel", 1) == 1:
            ours[(r["batch"], r["context"], r["policy"])] = r
    peer = {(r["batch"], r["context"]): r for r in vllm.get("rows", [])}
    lines = [f"GPU: lychee {e2e.get('gpu')} (commit {e2e.get('commit')}), vLLM {vllm.get('gpu')} "
             f"(vLLM {vllm.get('vllm')}, torch {vllm.get('torch')}, {vllm.get('attention_backend')})", "",
             "| batch | context | lychee Full ms | LycheeDecode ms | vLLM ms | Full bound ms | vLLM % of bound "
             "| vLLM / Full | vLLM / LycheeDecode |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    full_ok, lychee_target = [], None
    for (b, c) in sorted(set((b, c) for b, c, _ in ours) | set(peer)):
        full, lyc, v = ours.get((b, c, "full")), ours.get((b, c, "lychee")), peer.get((b, c))
        vms = v.get("tpot_ms") if v else None
        fms = full["tpot_ms"] if full else None
        lms = lyc["tpot_ms"] if lyc else None
        bound = full.get("bound_ms") if full else None
        if vms is None and v is not None:
            vcell = "skipped"
        else:
            vcell = fmt(vms)
        lines.append(f"| {b} | {c} | {fmt(fms)} | {fmt(lms)} | {vcell} | {fmt(bound)} | "
                     f"{fmt(100 * bound / vms, 1) + '%' if bound and vms else '-'} | "
                     f"{fmt(vms / fms, 2) + 'x' if vms and fms else '-'} | {fmt(vms / lms, 2) + 'x' if vms and lms else '-'} |")
        if vms and fms:
            full_ok.append(fms <= vms)
        if b == 1 and c == 131072 and vms and lms:
            lychee_target = vms / lms >= 1.6
    targets = {"lychee Full TPOT <= vLLM's at every measured shape": all(full_ok) if full_ok else None,
               "LycheeDecode >= 1.6x faster than vLLM at batch 1, 128K": lychee_target}
    return lines, targets


def serve_levels(runs, policy=None):
    out = {}
    for run in runs:
        if run.get("mode", "load") != "load" or (policy and run.get("policy") != policy):
            continue
        for lv in run.get("levels", []):
            out[(run.get("policy"), lv["concurrency"])] = lv
    return out


def serve_table(lychee_runs, vllm_runs):
    ours, peer = serve_levels(lychee_runs), serve_levels(vllm_runs)
    lines = ["| engine | policy | clients | output tok/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    peer_by_c = {c: lv for (_, c), lv in peer.items()}
    ok = []
    for engine, levels in (("lychee", ours), ("vLLM", peer)):
        for (pol, c), lv in sorted(levels.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
            lines.append(f"| {engine} | {pol} | {c} | {fmt(lv.get('output_tok_s'), 1)} | {fmt(lv.get('ttft_ms_p50'), 1)} | "
                         f"{fmt(lv.get('ttft_ms_p99'), 1)} | {fmt(lv.get('tpot_ms_p50'), 2)} | {fmt(lv.get('tpot_ms_p99'), 2)} |")
    for (pol, c), lv in ours.items():
        v = peer_by_c.get(c)
        if v and lv.get("output_tok_s") is not None and v.get("output_tok_s") is not None:
            better_ttft = (lv.get("ttft_ms_p99") or 0) <= (v.get("ttft_ms_p99") or float("inf"))
            ok.append(lv["output_tok_s"] >= v["output_tok_s"] and better_ttft)
    return lines, {"serving: lychee tok/s >= vLLM's with TTFT p99 no worse, every concurrency": all(ok) if ok else None}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--e2e", help="bench_e2e --json")
    ap.add_argument("--vllm", help="vllm_decode.py --json")
    ap.add_argument("--serve-lychee", help="serve_load.py --json of lychee serve")
    ap.add_argument("--serve-vllm", help="serve_load.py --json of vllm serve")
    ap.add_argument("--markdown")
    a = ap.parse_args(argv)
    if not ((a.e2e and a.vllm) or (a.serve_lychee and a.serve_vllm)):
        ap.error("give --e2e with --vllm, or --serve-lychee with --serve-vllm, or both pairs")
    lines, targets = [], {}
    if a.e2e and a.vllm:
        d, t = decode_table(load(a.e2e), load(a.vllm))
        lines += ["## Decode: time per output token", ""] + d + [""]
        targets.update(t)
    if a.serve_lychee and a.serve_vllm:
        s, t = serve_table(load(a.serve_lychee), load(a.serve_vllm))
        lines += ["## Serving (serve_load.py, same prompts)", ""] + s + [""]
        targets.update(t)
    lines += ["## Targets (issue 37)", ""]
    for name, met in targets.items():
        lines.append(f"- {name}: {'not measured' if met is None else 'met' if met else 'NOT met'}")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
