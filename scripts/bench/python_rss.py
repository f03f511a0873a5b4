#!/usr/bin/env python3
"""Resident memory of a lychee.Engine over windows of repeated calls (what
tests/python/test_engine.py::test_memory_is_flat_over_many_calls bounds): a leak grows every window
by about the same, allocator warm-up only the first ones.

    python3 scripts/bench/python_rss.py [--threads N] [--device cpu] [--windows 4] [--rounds 30]
"""
import argparse
import gc
import os

import lychee


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=30)
    a = ap.parse_args()
    engine = lychee.Engine(device=a.device, threads=a.threads)
    prompt = "The Roman Empire was"

    def calls(n, first):  # the test's round: generate, stream, tokenize/detokenize
        for i in range(n):
            engine.generate(prompt, max_tokens=4, temperature=0.5, seed=first + i, stop=["zz"])
            "".join(engine.stream(prompt, max_tokens=4))
            engine.detokenize(engine.tokenize(prompt * 20))
        gc.collect()

    start = rss_bytes()
    calls(8, 0)
    print(f"first 8 rounds: {(rss_bytes() - start) / 2**20:+.2f} MiB (RSS {rss_bytes() / 2**20:.1f} MiB)", flush=True)
    for w in range(a.windows):
        before = rss_bytes()
        calls(a.rounds, 1000 * (w + 1))
        print(f"window {w + 1} ({a.rounds} rounds): {(rss_bytes() - before) / 2**20:+.2f} MiB", flush=True)


if __name__ == "__main__":
    main()
