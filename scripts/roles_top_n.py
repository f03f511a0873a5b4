#!/usr/bin/env python3
"""Re-decide a trained head-role file at exactly N retrieval heads: the N gated heads (layers >= 1)
with the largest expected gate value E[z] (ties: lower index), plus all of layer 0.
N defaults to the file's provenance.n_retrieval_target.
usage: roles_top_n.py IN.json OUT.json [N]"""
import json
import sys


def main():
    src, dst = sys.argv[1], sys.argv[2]
    d = json.load(open(src))
    n_layers, n_kv = d["model"]["n_layers"], d["model"]["n_kv_heads"]
    ez = d.get("gates", {}).get("expected_z")
    if not ez:
        sys.exit(f"{src}: no expected_z to rank heads by")
    flat = [v for row in ez for v in row] if isinstance(ez[0], list) else list(ez)
    n = int(sys.argv[3]) if len(sys.argv) > 3 else int(d["provenance"]["n_retrieval_target"])
    gated = sorted(range(n_kv, n_layers * n_kv), key=lambda i: (-flat[i], i))[:n]
    roles = [[1 if l == 0 or (l * n_kv + h) in gated else 0 for h in range(n_kv)] for l in range(n_layers)]
    d["roles"] = roles
    d["provenance"]["decision"] = f"top-n ({n}) by E[z], re-decided by scripts/roles_top_n.py"
    json.dump(d, open(dst, "w"), indent=1)


if __name__ == "__main__":
    main()
