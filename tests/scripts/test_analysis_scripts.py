"""The analysis scripts behind committed results (scripts/sweep_table.py, paired_strategies.py,
plot_accuracy_bytes.py, plot_tradeoff.py), run as their users run them, on small eval and bench
files written here with known answers: pooled means and intervals, paired differences, refusals of
inputs that would give a wrong table, and figures that name what they plot."""
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPTS = os.path.join(ROOT, "scripts")


def run(script, *args, ok=True):
    p = subprocess.run([sys.executable, os.path.join(SCRIPTS, script), *map(str, args)], capture_output=True,
                       text=True, cwd=ROOT)
    if ok:
        assert p.returncode == 0, p.stderr
    return p


def eval_file(path, seed, rows, kv):
    """A `lychee eval --json` file: rows = [(policy_label, length, task, depth, score)], kv =
    {(policy_label, length): ratio}; each row a sample with its own seed."""
    records = [{"policy_label": label, "length": length, "task": task, "depth": depth, "score": score,
                "seed": seed * 1000 + i} for i, (label, length, task, depth, score) in enumerate(rows)]
    kv_rows = [{"policy_label": label, "length": length, "ratio": ratio} for (label, length), ratio in kv.items()]
    json.dump({"records": records, "summary": {"kv": kv_rows, "average": []}, "run": {"command": "test"}},
              open(path, "w"))


def two_tasks(label, length, a_scores, b_scores):
    return [(label, length, "passkey", 0.5, s) for s in a_scores] + [(label, length, "vt", 0.5, s) for s in b_scores]


def test_sweep_table_pools_seeds_and_weighs_tasks_equally(tmp_path):
    label = "lychee topk 64 block 16"
    # seed 0: passkey 1, 1; vt 0, 0. seed 1: passkey 1, 0; vt 0, 0 -> passkey 0.75, vt 0 -> 0.375
    eval_file(tmp_path / "N10_L2048_s0.json", 0, two_tasks(label, 2048, [1, 1], [0, 0]), {(label, 2048): 0.10})
    eval_file(tmp_path / "N10_L2048_s1.json", 1, two_tasks(label, 2048, [1, 0], [0, 0]), {(label, 2048): 0.14})
    eval_file(tmp_path / "base_L2048_s0.json", 0, two_tasks("full", 2048, [1, 1], [1, 0]), {("full", 2048): 1.0})
    p = run("sweep_table.py", tmp_path, "--json", tmp_path / "t.json")
    rows = {(r["run"], r["policy"]): r for r in json.load(open(tmp_path / "t.json"))["rows"]}
    r = rows[("N10", label)]
    assert r["accuracy"] == pytest.approx(0.375)
    assert r["samples"] == 8 and r["seeds"] == [0, 1]
    assert r["kv_bytes_ratio"] == pytest.approx(0.12)
    # passkey [1,1,1,0]: variance 0.25 over 4; vt [0,0,0,0]: 0 -> half-width 1.96 * sqrt(0.0625 / 4)
    assert r["ci95"] == pytest.approx(1.96 * math.sqrt(0.25 / 4 / 4))
    assert rows[("base", "full")]["accuracy"] == pytest.approx(0.75)
    line = [ln for ln in p.stdout.splitlines() if label in ln][0]
    assert line.rstrip().endswith("| yes |")  # 0.12 <= 1/8
    assert "| 37.5 |" in line


def test_sweep_table_refuses_an_empty_folder(tmp_path):
    p = run("sweep_table.py", tmp_path, ok=False)
    assert p.returncode != 0 and "no RUN_L<length>_s<seed>.json files" in p.stderr


def test_paired_strategies_pools_files_and_refuses_a_seed_read_twice(tmp_path):
    a, b = "lychee topk 64 block 16", "lychee topk 64 block 64"
    for seed, (sa, sb) in enumerate([([1, 0], [1, 1]), ([0, 0], [1, 0])]):
        eval_file(tmp_path / f"A_s{seed}.json", seed, two_tasks(a, 2048, sa, sa), {(a, 2048): 0.2})
        eval_file(tmp_path / f"B_s{seed}.json", seed, two_tasks(b, 2048, sb, sb), {(b, 2048): 0.1 + 0.1 * seed})
    files = lambda side: ",".join(str(tmp_path / f"{side}_s{s}.json") for s in (0, 1))
    p = run("paired_strategies.py", f"{files('A')}:{a}", f"{files('B')}:{b}")
    line = p.stdout.strip().splitlines()[-1]
    # A: 1/4 per task, B: 3/4 per task -> +50 points; 4 samples up, 0 down; B's KV ratio the mean 0.15
    assert "| 25.0 | 75.0 | +50.0 |" in line and "| 4 / 0 |" in line and "0.200, 0.150" in line
    twice = f"{tmp_path / 'A_s0.json'},{tmp_path / 'A_s0.json'}:{a}"
    p = run("paired_strategies.py", twice, f"{files('B')}:{b}", ok=False)
    assert p.returncode != 0 and "repeats samples" in p.stderr
    p = run("paired_strategies.py", f"{tmp_path / 'A_s0.json'}:no such label", f"{files('B')}:{b}", ok=False)
    assert p.returncode != 0 and "has no records of 'no such label'" in p.stderr


def grid_table(tmp_path):
    eval_file(tmp_path / "base_L2048_s0.json", 0, two_tasks("full", 2048, [1, 1], [1, 1]), {("full", 2048): 1.0})
    # one file per budget (as seeds 1 and 2 of run N10: the table keys rows by policy label anyway)
    for seed, (budget, score, ratio) in enumerate(((512, [1, 1], 0.35), (256, [1, 0], 0.25)), start=1):
        label = f"lychee topk {budget} block 16"
        eval_file(tmp_path / f"N10_L2048_s{seed}.json", seed, two_tasks(label, 2048, score, score), {(label, 2048): ratio})
    run("sweep_table.py", tmp_path, "--json", tmp_path / "grid.json")
    return tmp_path / "grid.json"


def test_plot_accuracy_bytes_draws_a_sweep_table(tmp_path):
    grid = grid_table(tmp_path)
    run("plot_accuracy_bytes.py", grid, "-o", tmp_path / "a.svg")
    svg = open(tmp_path / "a.svg").read()
    assert svg.startswith("<svg") and "2048 tokens" in svg
    assert "N10: lychee topk 256 block 16: 50.0% at 0.250" in svg  # the point's tooltip
    assert "lychee N10" in svg and "full" in svg  # legend


def bench_file(path, retrieval, budget, context, full_ms, lychee_ms):
    rows = [{"batch": 1, "context": context, "policy": p, "tpot_ms": t} for p, t in (("full", full_ms), ("lychee", lychee_ms))]
    json.dump({"budget": budget, "retrieval_kv_heads": retrieval, "commit": "test", "gpu": "test", "rows": rows},
              open(path, "w"))


def test_plot_tradeoff_pairs_accuracy_and_speed_by_shares(tmp_path):
    grid = grid_table(tmp_path)
    ctx = 32768
    bench_file(tmp_path / "b4.json", 32, ctx // 4, ctx, 10.0, 8.0)   # budget 1/4: 1.25x
    bench_file(tmp_path / "b8.json", 32, ctx // 8, ctx, 10.0, 5.0)   # budget 1/8: 2x
    bench_file(tmp_path / "r64.json", 64, ctx // 8, ctx, 10.0, 9.0)  # a retrieval share no run is near
    p = run("plot_tradeoff.py", grid, tmp_path / "b4.json", tmp_path / "b8.json", tmp_path / "r64.json",
            "--run", "N10=0.144", "--context", ctx, "-o", tmp_path / "t.svg")
    lines = {ln.split("|")[2].strip(): ln for ln in p.stdout.splitlines() if ln.startswith("| N10")}
    assert "| 100.0 |" in lines["1/4"] and "1.25x" in lines["1/4"]
    assert "| 50.0 |" in lines["1/8"] and "2.00x" in lines["1/8"] and "| 32 |" in lines["1/8"]
    assert "1/8: 50.0% at 2.00x" in open(tmp_path / "t.svg").read()
    p = run("plot_tradeoff.py", grid, tmp_path / "b4.json", "--run", "N10=0.144", "--context", 131072,
            "-o", tmp_path / "u.svg", ok=False)
    assert p.returncode != 0 and "no bench file has Full and LycheeDecode at context 131072" in p.stderr
