#!/usr/bin/env python3
"""Re-decide a trained head-role file at exactly N retrieval heads: the N gated heads (layers >= 1)
with the largest expected gate value E[z] (ties: lower index), plus all of layer 0.
N defaults to the file's provenance.n_retrieval_target. With --cover, each KV index first gets its
own best head (largest E[z] over layers >= 1, while N allows), then the rest go by E[z]: a sparse
head reads the set of the latest retrieval head of its KV index, so an index without one reads
layer 0's sets in every layer (docs/results/eighth_cpu/README.md).
usage: roles_top_n.py [--cover] IN.json OUT.json [N]"""
import json
import sys


def main():
    args = [a for a in sys.argv[1:] if a != "--cover"]
    cover = "--cover" in sys.argv[1:]
    src, dst = args[0], args[1]
    d = json.load(open(src))
    n_layers, n_kv = d["model"]["n_layers"], d["model"]["n_kv_heads"]
    ez = d.get("gates", {}).get("expected_z")
    if not ez:
        sys.exit(f"{src}: no expected_z to rank heads by")
    flat = [v for row in ez for v in row] if isinstance(ez[0], list) else list(ez)
    n = int(args[2]) if len(args) > 2 else int(d["provenance"]["n_retrieval_target"])
    order = sorted(range(n_kv, n_layers * n_kv), key=lambda i: (-flat[i], i))
    gated = []
    if cover:  # each KV index's best head first, the indices in order of that head's E[z]
        best = {}
        for i in order:
            best.setdefault(i % n_kv, i)
        gated = sorted(best.values(), key=lambda i: (-flat[i], i))[:n]
    gated += [i for i in order if i not in gated][:n - len(gated)]
    roles = [[1 if l == 0 or (l * n_kv + h) in gated else 0 for h in range(n_kv)] for l in range(n_layers)]
    d["roles"] = roles
    d["provenance"]["decision"] = (f"top-n ({n}) by E[z]{', each KV index covered first' if cover else ''}, "
                                   "re-decided by scripts/roles_top_n.py")
    json.dump(d, open(dst, "w"), indent=1)


if __name__ == "__main__":
    main()
