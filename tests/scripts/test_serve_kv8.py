"""scripts/bench/serve_load.py's streams-decoding-at-once count and scripts/bench/serve_kv8_table.py
(issue 38's serving comparison), on records and JSON files with known answers."""
import importlib.util
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def module(rel):
    spec = importlib.util.spec_from_file_location(os.path.basename(rel)[:-3], os.path.join(ROOT, rel))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


sl = module("scripts/bench/serve_load.py")


def rec(first, last):
    return {"t_first": first, "chunk_times": [] if first is None else [first, last]}


def test_decoding_at_once_counts_overlapping_streams():
    # [0, 2] and [1, 3] overlap over [1, 2]: at most 2; mean (1 + 2 + 1) / 3 over [0, 3].
    most, mean = sl.decoding_at_once([rec(0.0, 2.0), rec(1.0, 3.0), rec(None, None)])
    assert most == 2 and abs(mean - 4 / 3) < 1e-12
    # Back to back streams (one ends when the next starts) never run together.
    assert sl.decoding_at_once([rec(0.0, 1.0), rec(1.0, 2.0)]) == (1, 1.0)
    assert sl.decoding_at_once([]) == (0, 0.0)


def level(c, at_once, tok_s):
    return {"concurrency": c, "requests": c, "decoding_at_once_max": at_once, "decoding_at_once_mean": at_once - 0.5,
            "ttft_ms_p50": 100.0, "ttft_ms_p99": 200.0, "tpot_ms_p50": 20.0, "tpot_ms_p99": 30.0,
            "output_tok_s": tok_s, "failures": 0}


def test_table_gives_the_ratios_against_the_targets(tmp_path):
    for kv, at_once, tok in (("bf16", 16, 500.0), ("fp8", 32, 950.0)):
        json.dump([{"gpu": "H200", "commit": "abc", "server_args": f"--kv-cache-dtype {kv}", "prompt_tokens": 32768,
                    "shared_prefix": 28672, "output_tokens": 256, "levels": [level(64, at_once, tok)]}],
                  open(tmp_path / f"{kv}.json", "w"))
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts/bench/serve_kv8_table.py"), tmp_path / "bf16.json",
                        tmp_path / "fp8.json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "| 64 | fp8 | 64 | 32 / 31.5 |" in p.stdout
    assert "64 clients: decoding at once 2.00x (target >= 2x), output tok/s 1.90x" in p.stdout
    # decode tok/s = mean at once / TPOT p50: 15.5 / 20 ms = 775 and 31.5 / 20 ms = 1575 (2.03x)
    assert "| 775 |" in p.stdout and "| 1575 |" in p.stdout and "decode tok/s 2.03x" in p.stdout
    json.dump([{"levels": []}], open(tmp_path / "empty.json", "w"))
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "scripts/bench/serve_kv8_table.py"), tmp_path / "empty.json",
                          tmp_path / "fp8.json"], capture_output=True, text=True)
    assert bad.returncode != 0 and "no load run" in bad.stderr
