#!/usr/bin/env python3
"""The serving comparison of issue 38: `lychee serve` with bf16 KV against FP8 KV at the same
--kv-memory (scripts/gpu/run_all.sh bench-serve, part kv8), one serve_load.py JSON each. Prints a
markdown table per concurrency level (streams decoding at once, TTFT and TPOT p50/p99, output tok/s,
the decode rate mean-at-once / TPOT)
and the ratios FP8 / bf16 against the targets (>= 2x running at once, >= 1.8x output tok/s).

  scripts/bench/serve_kv8_table.py bf16.json fp8.json
"""
import argparse, json, sys


def levels(path):
    runs = json.load(open(path))
    if not runs or not runs[0].get("levels"):
        sys.exit(f"serve_kv8_table: {path} holds no load run with levels")
    return runs[0], {lv["concurrency"]: lv for lv in runs[0]["levels"]}


def decode_rate(lv):
    """Tokens per second the server's decode steps produced while streams decoded: the mean number
    decoding at once over the median time per output token (an estimate; output tok/s also counts
    the time the level spent in prefill)."""
    at, tpot = lv.get("decoding_at_once_mean"), lv.get("tpot_ms_p50")
    return at / tpot * 1000.0 if at and tpot else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bf16")
    ap.add_argument("fp8")
    a = ap.parse_args()
    rb, b = levels(a.bf16)
    rf, f = levels(a.fp8)
    print(f"# Serving, bf16 KV against FP8 KV ({rb.get('gpu', '?')}, commit {rb.get('commit', '?')})\n")
    print(f"bf16: `{rb.get('server_args', '')}`; fp8: `{rf.get('server_args', '')}`; prompts of "
          f"{rb.get('prompt_tokens')} tokens ({rb.get('shared_prefix', 0)} shared), {rb.get('output_tokens')} new tokens\n")
    print("| clients | KV | requests | decoding at once (max / mean) | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms "
          "| TPOT p99 ms | output tok/s | decode tok/s (mean at once / TPOT p50) | failures |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    fmt = lambda x, d=1: "-" if x is None else f"{x:.{d}f}"
    for c in sorted(set(b) & set(f)):
        for kv, lv in (("bf16", b[c]), ("fp8", f[c])):
            print(f"| {c} | {kv} | {lv['requests']} | {lv.get('decoding_at_once_max', '-')} / "
                  f"{fmt(lv.get('decoding_at_once_mean'))} | {fmt(lv['ttft_ms_p50'], 0)} | {fmt(lv['ttft_ms_p99'], 0)} | "
                  f"{fmt(lv['tpot_ms_p50'], 2)} | {fmt(lv['tpot_ms_p99'], 2)} | {fmt(lv['output_tok_s'])} | "
                  f"{fmt(decode_rate(lv), 0)} | {lv['failures']} |")
    print()
    for c in sorted(set(b) & set(f)):
        x, y = b[c], f[c]
        run = (y.get("decoding_at_once_max") or 0) / x["decoding_at_once_max"] if x.get("decoding_at_once_max") else None
        tok = y["output_tok_s"] / x["output_tok_s"] if x["output_tok_s"] else None
        dec = decode_rate(y) / decode_rate(x) if decode_rate(x) and decode_rate(y) else None
        print(f"- {c} clients: decoding at once {fmt(run, 2)}x (target >= 2x), output tok/s {fmt(tok, 2)}x "
              f"(target >= 1.8x), decode tok/s {fmt(dec, 2)}x, FP8 over bf16")


if __name__ == "__main__":
    main()
