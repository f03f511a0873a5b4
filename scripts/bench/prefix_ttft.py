#!/usr/bin/env python3
"""Time to first token with and without prefix reuse: against a running `lychee serve`, two
questions about the same long document, each streamed; prints (and with --json writes) the
prompt length, the cached tokens the server reports, and both TTFTs.

    lychee serve -c 4096 &
    python3 scripts/bench/prefix_ttft.py --url http://127.0.0.1:8080 --doc-tokens 3000 --json out.json
"""
import argparse
import json
import time
import urllib.request

COLOURS = ["red", "blue", "green", "yellow", "purple", "orange", "black", "white", "grey", "pink", "brown", "gold"]


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=600)


def ttft(url, prompt):
    t0 = time.time()
    first, usage = None, None
    with post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": True,
                                       "stream_options": {"include_usage": True}}) as resp:
        for line in resp:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            if first is None and any(c.get("text") for c in chunk.get("choices", [])):
                first = time.time() - t0
    return first, usage


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--doc-tokens", type=int, default=3000)
    ap.add_argument("--json")
    a = ap.parse_args()
    lines, i = ["Inventory notes."], 0
    while True:
        c = COLOURS[i % len(COLOURS)]
        lines.append(f"Shelf {i}: the {c} box holds {i * 7 + 3} marbles and {i % 9 + 2} keys.")
        doc = "\n".join(lines)
        with post(a.url, "/tokenize", {"content": doc}) as r:
            if len(json.loads(r.read())["tokens"]) >= a.doc_tokens:
                break
        i += 1
    rows = []
    for q in ["how many marbles are on shelf 3?", "how many keys are on shelf 5?"]:
        t, u = ttft(a.url, doc + "\nQuestion: " + q + "\nAnswer:")
        rows.append({"question": q, "ttft_s": t, "prompt_tokens": u["prompt_tokens"],
                     "cached_tokens": u["prompt_tokens_details"]["cached_tokens"]})
        print(f"{u['prompt_tokens']} prompt tokens, {rows[-1]['cached_tokens']} from the cache: "
              f"time to first token {t * 1e3:.0f} ms")
    print(f"second / first: {rows[1]['ttft_s'] / rows[0]['ttft_s']:.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"url": a.url, "rows": rows, "date": time.strftime("%Y-%m-%d %H:%M:%S")}, f, indent=1)


if __name__ == "__main__":
    main()
