#!/usr/bin/env python3
"""Our decode attention against its peers, per shape: reads bench_decode_attention's JSON
(decode_attention.json or the hybrid sweep's hybrid_attention.json), torch_decode_attention.py's
JSON (cuDNN / flash SDPA, dense only) and flashinfer_decode_attention.py's JSON, and prints (and
with --markdown writes) tables of times and ratios, ratio = our time / peer time (< 1: we are
faster).

  eager table: CUDA events around single launches on both sides (ours us_median, peers us_median)
  graph table: CUDA-graph replays on both sides (ours us_graph_median, FlashInfer's
               us_graph_median; torch has no graph timing)
Rows are (batch, context, sparse share); a peer column appears where the peer has that shape. The
FlashInfer columns at share 0 are its dense decode wrappers, at share > 0 its per-head-list
emulations (perhead-*) and block-sparse wrappers (bsr, vbsr), all at the same sparsity as ours
when both runs used the same --sparse-frac / --budget (checked and printed).

    python3 scripts/bench/compare_peers.py --ours hybrid_attention.json --torch torch_decode_attention.json \\
        --flashinfer flashinfer_decode_attention.json --markdown peers.md
"""
import argparse
import json
import sys


def load(path):
    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"compare_peers: cannot read {path}: {e}", file=sys.stderr)
        return None


def key(r):
    return (int(r["batch"]), int(r["context"]), int(r.get("sparse_share", 0)))


def fmt_us(x):
    return "-" if x is None else f"{x:.1f}"


def fmt_ratio(ours, peer):
    if ours is None or peer is None or peer <= 0:
        return "-"
    return f"{ours / peer:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours", action="append", default=[], help="bench_decode_attention JSON (repeatable; later files win)")
    ap.add_argument("--torch", help="torch_decode_attention.py JSON")
    ap.add_argument("--flashinfer", help="flashinfer_decode_attention.py JSON")
    ap.add_argument("--markdown", help="write the tables here")
    ap.add_argument("--json", help="write the per-shape ratios here")
    args = ap.parse_args()

    ours = {}
    ours_docs = []
    for p in args.ours:
        d = load(p)
        if d:
            ours_docs.append(d)
            for r in d.get("rows", []):
                ours[key(r)] = r
    if not ours:
        sys.exit("compare_peers: no rows of ours (--ours)")
    tdoc, fdoc = load(args.torch), load(args.flashinfer)

    # peers[name][shape] = {"us": eager median, "graph": graph median}
    peers = {}
    if tdoc:
        for r in tdoc.get("rows", []):
            if "us_median" in r:
                peers.setdefault(f"torch-{r['backend']}", {})[key(r)] = {"us": r["us_median"], "graph": None}
    fi_errors = {}
    if fdoc:
        for r in fdoc.get("rows", []):
            name = f"fi-{r['config']}" + (f"-{r['layout']}" if r["config"].startswith("decode") else "")
            if "us_median" in r:
                peers.setdefault(name, {})[key(r)] = {"us": r["us_median"], "graph": r.get("us_graph_median")}
            elif "error" in r:
                fi_errors.setdefault(name, r["error"])

    lines = []
    out = lambda s="": lines.append(s)  # noqa: E731
    head = []
    for d in ours_docs[:1]:
        head.append(f"ours: {d.get('gpu')}, {d.get('command')}, {d.get('tag') or d.get('lychee_commit') or ''}".rstrip(", "))
    if tdoc:
        head.append(f"torch: {tdoc.get('torch')}, {tdoc.get('command')}")
    if fdoc:
        head.append(f"flashinfer {fdoc.get('flashinfer')}: {fdoc.get('command')}")
        o_frac = ours_docs[0].get("sparse_frac") if ours_docs else None
        if fdoc.get("budget"):
            out(f"> note: FlashInfer's sparse heads read budget {fdoc['budget']} tokens; ours read sparse_frac {o_frac}")
        elif o_frac is not None and abs(float(o_frac) - float(fdoc.get("sparse_frac", -1))) > 1e-9:
            out(f"> note: sparse_frac differs: ours {o_frac}, FlashInfer {fdoc.get('sparse_frac')}")
        gpus = {d.get("gpu") for d in ours_docs} | {fdoc.get("gpu")} | ({tdoc.get("gpu")} if tdoc else set())
        if len(gpus) > 1:
            out(f"> note: results from different GPUs: {sorted(g for g in gpus if g)}")
    for h in head:
        out(f"- {h}")
    out()

    results = []
    for mode, ours_field, peer_field in (("eager", "us_median", "us"), ("graph", "us_graph_median", "graph")):
        for group, pick in (("dense", lambda s: s[2] == 0), ("sparse", lambda s: s[2] > 0)):
            shapes = [s for s in sorted(ours) if pick(s)]
            names = [n for n in sorted(peers) if any(peers[n].get(s, {}).get(peer_field) for s in shapes)]
            if not names:
                continue
            out(f"### {group}, {mode}: our time / peer time (µs; ratio < 1 means ours is faster)")
            out()
            out("| batch | context | sparse | ours µs | " + " | ".join(f"{n} µs | ratio" for n in names) +
                " | best peer | ours / best |")
            out("|---|---|---|---|" + "---|---|" * len(names) + "---|---|")
            for s in shapes:
                o = ours[s].get(ours_field)
                cells, best = [], None
                for n in names:
                    p = peers[n].get(s, {}).get(peer_field)
                    cells += [fmt_us(p), fmt_ratio(o, p)]
                    if p and (best is None or p < best[1]):
                        best = (n, p)
                if best is None:
                    continue
                out(f"| {s[0]} | {s[1] // 1024}K | {s[2]}/8 | {fmt_us(o)} | " + " | ".join(cells) +
                    f" | {best[0]} | {fmt_ratio(o, best[1])} |")
                results.append({"mode": mode, "batch": s[0], "context": s[1], "sparse_share": s[2], "ours_us": o,
                                "peers": {n: peers[n][s][peer_field] for n in names
                                          if peers[n].get(s, {}).get(peer_field)},
                                "best_peer": best[0], "ratio_vs_best": (o / best[1]) if o else None})
            out()
    if fi_errors:
        out("FlashInfer configurations that failed (first error each):")
        for n, e in sorted(fi_errors.items()):
            out(f"- {n}: {e}")
        out()

    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
