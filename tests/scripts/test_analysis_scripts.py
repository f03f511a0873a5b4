"""The analysis scripts behind committed results (scripts/sweep_table.py, paired_strategies.py and
the matplotlib figures of scripts/plot_*.py), run as their users run them, on small eval and bench
files written here with known answers: pooled means and intervals, paired differences, refusals of
inputs that would give a wrong table, and figures whose series carry exactly the data given, with
the axes and legends that name it."""
import importlib.util
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


def test_compare_eval_pairs_two_runs_with_intervals(tmp_path):
    # Two runs of the same samples (the same seeds), something else changed (e.g. the KV cache's dtype).
    full_a = two_tasks("full", 2048, [1, 1, 0, 1], [1, 0, 0, 0]) + two_tasks("full", 4096, [1, 1], [0, 0])
    full_b = two_tasks("full", 2048, [1, 0, 0, 1], [1, 0, 1, 0]) + two_tasks("full", 4096, [1, 1], [0, 0])
    eval_file(tmp_path / "a.json", 0, full_a, {})
    eval_file(tmp_path / "b.json", 0, full_b, {})
    p = run("compare_eval.py", tmp_path / "a.json", tmp_path / "b.json", "--names", "bf16", "fp8",
            "--markdown", tmp_path / "c.md")
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line for line in p.stdout.splitlines()
            if line.startswith("| full")}
    # 2048: passkey 3/4 -> 2/4, vt 1/4 -> 2/4: means 50.0 and 50.0, difference 0; one sample down, one up.
    # Per-sample differences: passkey [0,-1,0,0] (var 1/4 over 4), vt [0,0,1,0] (the same): the
    # interval's half-width 1.96 * sqrt((1/16 + 1/16) / 4) = 0.346.
    assert "| 50.0 | 50.0 | +0.0 | [-34.6, +34.6] | 8 | 1 / 1 |" in rows[("full", "2048")]
    # 4096: nothing changed, a zero-width interval.
    assert "| 50.0 | 50.0 | +0.0 | [+0.0, +0.0] | 4 | 0 / 0 |" in rows[("full", "4096")]
    # all lengths: four (length, task) strata, each weighing the same.
    assert "| 12 | 1 / 1 |" in rows[("full", "all")]
    assert open(tmp_path / "c.md").read() == p.stdout
    eval_file(tmp_path / "other.json", 5, two_tasks("full", 2048, [1], [1]), {})
    p = run("compare_eval.py", tmp_path / "a.json", tmp_path / "other.json", ok=False)
    assert p.returncode != 0 and "share no" in p.stderr


def grid_table(tmp_path):
    eval_file(tmp_path / "base_L2048_s0.json", 0, two_tasks("full", 2048, [1, 1], [1, 1]), {("full", 2048): 1.0})
    # one file per budget (as seeds 1 and 2 of run N10: the table keys rows by policy label anyway)
    for seed, (budget, score, ratio) in enumerate(((512, [1, 1], 0.35), (256, [1, 0], 0.25)), start=1):
        label = f"lychee topk {budget} block 16"
        eval_file(tmp_path / f"N10_L2048_s{seed}.json", seed, two_tasks(label, 2048, score, score), {(label, 2048): ratio})
    run("sweep_table.py", tmp_path, "--json", tmp_path / "grid.json")
    return tmp_path / "grid.json"


def plot_module(name):
    """scripts/<name>.py imported, to look inside the figure it builds."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(SCRIPTS, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, SCRIPTS)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(SCRIPTS)
    return module


def svg_text(path):
    svg = open(path).read()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    return svg


def lines_by_label(ax):
    return {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.get_lines()
            if not ln.get_label().startswith("_")}


def test_plot_accuracy_bytes_draws_a_sweep_table(tmp_path):
    grid = grid_table(tmp_path)
    run("plot_accuracy_bytes.py", grid, "-o", tmp_path / "a.svg")
    svg = svg_text(tmp_path / "a.svg")
    assert "2048 tokens" in svg and "mean accuracy (%)" in svg  # the panel and its axis, as text
    assert "lychee N10" in svg and "full" in svg  # legend
    m = plot_module("plot_accuracy_bytes")
    fig = m.figure(m.points_table(json.load(open(grid))))
    (ax,) = fig.axes
    series = lines_by_label(ax)
    assert set(series) == {"lychee N10", "full"}
    # budget 256: passkey 1/2, vt 1/2 -> 50% at 0.25 of the bytes; budget 512: 100% at 0.35
    assert series["lychee N10"][0] == pytest.approx([0.25, 0.35]) and series["lychee N10"][1] == pytest.approx([50, 100])
    assert series["full"] == ([1.0], [100.0])
    assert ax.get_xscale() == "log" and ax.get_title() == "2048 tokens"
    assert "KV bytes read" in ax.get_xlabel()


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
    svg = svg_text(tmp_path / "t.svg")
    assert "TPOT speedup over Full" in svg and "N10 (14% retrieval)" in svg and "1/8" in svg
    m = plot_module("plot_tradeoff")
    fig = m.figure({"N10": [(1.25, 1.0, 4, 32, 8.0, 10.0), (2.0, 0.5, 8, 32, 5.0, 10.0)]}, {"N10": 0.144}, ctx)
    (ax,) = fig.axes
    assert lines_by_label(ax) == {"N10 (14% retrieval)": ([1.25, 2.0], [100.0, 50.0])}
    assert sorted(t.get_text() for t in ax.texts) == ["1/4", "1/8"]
    p = run("plot_tradeoff.py", grid, tmp_path / "b4.json", "--run", "N10=0.144", "--context", 131072,
            "-o", tmp_path / "u.svg", ok=False)
    assert p.returncode != 0 and "no bench file has Full and LycheeDecode at context 131072" in p.stderr


def test_plot_e2e_one_panel_per_batch_one_line_per_policy(tmp_path):
    e2e = {"gpu": "test GPU", "commit": "abc", "rows": [
        {"batch": 1, "context": 16384, "policy": "full", "tpot_ms": 6.0},
        {"batch": 1, "context": 32768, "policy": "full", "tpot_ms": 7.0},
        {"batch": 1, "context": 16384, "policy": "lychee", "tpot_ms": 5.5},
        {"batch": 4, "context": 16384, "policy": "full", "tpot_ms": 8.5},
        {"batch": 4, "context": 131072, "policy": "full"}]}  # skipped: no TPOT (did not fit)
    hf = {"rows": [{"batch": 1, "context": 16384, "tpot_ms": 21.6}, {"batch": 4, "context": 131072, "tpot_ms": None}]}
    json.dump(e2e, open(tmp_path / "e.json", "w"))
    json.dump(hf, open(tmp_path / "h.json", "w"))
    run("plot_e2e.py", tmp_path / "e.json", tmp_path / "h.json", "-o", tmp_path / "e.svg")
    assert "test GPU (commit abc)" in svg_text(tmp_path / "e.svg")
    m = plot_module("plot_e2e")
    fig = m.figure(m.series(e2e, hf), "t")
    b1, b4 = fig.axes
    assert b1.get_title() == "batch 1" and b4.get_title() == "batch 4"
    assert lines_by_label(b1) == {"full": ([16384, 32768], [6.0, 7.0]), "lychee": ([16384], [5.5]),
                                  "hf sdpa": ([16384], [21.6])}
    assert lines_by_label(b4) == {"full": ([16384], [8.5])}
    assert b1.get_yscale() == "log" and "time per output token" in b1.get_ylabel()


def test_plot_fp8_gemv_bars_per_kernel_and_target(tmp_path):
    rows = [{"n": 1, "shape": "qkv", "kernel": "lychee_fp8", "pct_copy": 66.0},
            {"n": 1, "shape": "qkv", "kernel": "cublaslt_bf16", "pct_copy": 75.0},
            {"n": 8, "shape": "down", "kernel": "lychee_fp8", "pct_copy": 81.0},
            {"n": 8, "shape": "down", "kernel": "cublaslt_fp8"}]  # no pct_copy: skipped
    r = {"gpu": "test GPU", "commit": "abc", "target_pct_copy": 85, "copy_bandwidth_gbs": 4200.0, "rows": rows}
    json.dump(r, open(tmp_path / "g.json", "w"))
    run("plot_fp8_gemv.py", tmp_path / "g.json", "-o", tmp_path / "g.svg")
    svg = svg_text(tmp_path / "g.svg")
    assert "target 85%" in svg and "% of copy bandwidth" in svg and "copy bandwidth 4200 GB/s" in svg
    m = plot_module("plot_fp8_gemv")
    fig = m.figure(m.table(rows), 85, "t")
    n1, n8 = fig.axes[:2]
    heights = lambda ax: sorted(round(p.get_height(), 3) for p in ax.patches)
    assert heights(n1) == [66.0, 75.0] and heights(n8) == [81.0]
    assert [t.get_text() for t in n1.texts if t.get_text().isdigit()] == ["66"]  # lychee bars carry their value
    assert any(ln.get_ydata()[0] == 85 for ln in n1.get_lines())  # the target line


def gate_history(gate):
    """Two layers of two KV heads (gated heads 2 and 3) over steps 0, 100, 200."""
    return {"gate": gate, "model": "test", "n_layers": 2, "n_kv_heads": 2, "steps": [0, 100, 200],
            "expected_z": [[1, 1, 0.5, 0.5], [1, 1, 0.7, 0.3], [1, 1, 0.95, 0.05]],
            "params": [[0.0, 0.0, 0.0, 0.0], [0.5, -0.5, -0.5, 0.5], [1.0, -1.0, -1.0, 1.0]],
            "roles": [1, 1, 1, 0]}


def test_plot_gate_dynamics_ez_per_head_and_densities(tmp_path):
    for gate in ("hardkuma", "direct"):
        json.dump(gate_history(gate), open(tmp_path / f"{gate}.json", "w"))
    run("plot_gate_dynamics.py", tmp_path / "hardkuma.json", tmp_path / "direct.json", "-o", tmp_path / "d.svg")
    svg = svg_text(tmp_path / "d.svg")
    assert "hardkuma: E[z] per head (test)" in svg and "retrieval at the end: 1 heads" in svg
    m = plot_module("plot_gate_dynamics")
    fig = m.figure([gate_history("hardkuma"), gate_history("direct")])
    ez, high, low = fig.axes[:3]
    traces = sorted((list(ln.get_ydata()), ln.get_color()) for ln in ez.get_lines())
    assert traces == [([0.5, 0.3, 0.05], "#7f7f7f"), ([0.5, 0.7, 0.95], "#d62728")]  # sparse grey, retrieval red
    assert "layer 1 KV head 0" in high.get_title() and "layer 1 KV head 1" in low.get_title()
    # head 2's gate at step 200: a = exp(1), b = exp(-1); a density per snapshot
    labels = [ln.get_label() for ln in high.get_lines()]
    assert labels == ["step 0: a 1.00, b 1.00", "step 100: a 1.65, b 0.61", "step 200: a 2.72, b 0.37"]
    assert not fig.axes[4].axison and not fig.axes[5].axison  # the direct run has no density panels


def test_plot_overlap_one_heatmap_per_case(tmp_path):
    cases = [{"answer": " Paris", "n_layers": 3, "n_heads": 2, "overlap": [0.0, 1.0, 0.5, 0.5]},
             {"answer": "Two", "n_layers": 3, "n_heads": 2, "overlap": [1.0, 1.0, 1.0, 0.0]}]
    json.dump({"k": 5, "model": "test", "cases": cases}, open(tmp_path / "o.json", "w"))
    run("plot_overlap.py", tmp_path / "o.json", "-o", tmp_path / "o.svg")
    svg = svg_text(tmp_path / "o.svg")
    assert "Top-5 overlap of same-index heads in adjacent layers, test" in svg and 'case 1: "Paris"' in svg
    m = plot_module("plot_overlap")
    fig = m.figure({"k": 5, "model": "test", "cases": cases})
    a, b = fig.axes[:2]
    assert a.get_images()[0].get_array().tolist() == [[0.0, 1.0], [0.5, 0.5]]
    assert b.get_images()[0].get_array().tolist() == [[1.0, 1.0], [1.0, 0.0]]
    assert "mean 0.50" in a.get_title() and "mean 0.75" in b.get_title()
    json.dump({"k": 5, "model": "test", "cases": [dict(cases[0], overlap=[0.1])]}, open(tmp_path / "bad.json", "w"))
    p = run("plot_overlap.py", tmp_path / "bad.json", "-o", tmp_path / "bad.svg", ok=False)
    assert p.returncode != 0 and "1 overlaps, expected (n_layers - 1) x n_heads = 4" in p.stderr


def test_plot_serve_three_panels_p50_and_p99(tmp_path):
    def level(c, tok, ttft, tpot):
        return {"concurrency": c, "output_tok_s": tok, "ttft_ms_p50": ttft, "ttft_ms_p99": 2 * ttft,
                "tpot_ms_p50": tpot, "tpot_ms_p99": float("nan") if c == 4 else 1.5 * tpot}
    runs = [{"policy": "full", "label": "t", "gpu": "test GPU", "commit": "abc", "prompt_tokens": 2048,
             "output_tokens": 64, "levels": [level(1, 100.0, 50.0, 5.0), level(4, 300.0, 80.0, 6.0)]},
            {"policy": "lychee", "label": "t", "gpu": "test GPU", "commit": "abc", "prompt_tokens": 2048,
             "output_tokens": 64, "levels": [level(1, 120.0, 40.0, 4.0)]}]
    json.dump(runs, open(tmp_path / "s.json", "w"))
    run("plot_serve.py", tmp_path / "s.json", "-o", tmp_path / "s.svg")
    svg = svg_text(tmp_path / "s.svg")
    assert "2048-token prompts, 64 output tokens, test GPU (commit abc)" in svg and "concurrency" in svg
    m = plot_module("plot_serve")
    fig = m.figure(*m.load(runs))
    tok, ttft, tpot = fig.axes
    assert lines_by_label(tok) == {"full output_tok_s": ([1, 4], [100.0, 300.0]), "lychee output_tok_s": ([1], [120.0])}
    assert lines_by_label(ttft)["full ttft_ms_p99"] == ([1, 4], [100.0, 160.0])
    assert lines_by_label(tpot)["full tpot_ms_p99"] == ([1], [7.5])  # the NaN at concurrency 4 left out
    assert ttft.get_yscale() == "log" and tok.get_yscale() == "linear"
    p = run("plot_serve.py", tmp_path / "e.json", "-o", tmp_path / "e.svg", ok=False) if json.dump(
        [{"policy": "full"}], open(tmp_path / "e.json", "w")) is None else None
    assert p.returncode != 0 and "no run with concurrency levels" in p.stderr


def test_plot_tp_balance_bars_per_gpu_and_odd_layers_marked():
    m = plot_module("plot_tp_balance")
    t = [[1.0, 2.0, 0.5], [1.0, 1.0, 0.5]]  # [gpu][layer] ms
    assert m.balance(t) == pytest.approx([1.0, 2.0 / 1.5, 1.0])
    fig = m.figure(t, {0: 8, 1: 3}, "t")
    (ax,) = fig.axes
    by_gpu = {}
    for bar in ax.containers:
        by_gpu[bar.get_label()] = [round(p.get_height(), 3) for p in bar.patches]
    assert by_gpu == {"GPU 0": [1.0, 2.0, 0.5], "GPU 1": [1.0, 1.0, 0.5]}
    ticks = ax.get_xticklabels()
    assert [t.get_text() for t in ticks] == ["8", "3", "0"]
    assert [t.get_color() for t in ticks] == ["black", "#d62728", "black"]  # layer 1's 3 heads do not split in 2


def test_plot_speculative_computes_tokens_per_second_from_times_and_acceptance():
    m = plot_module("plot_speculative")
    assert m.expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert m.expected_tokens(1.0, 4) == 5.0
    records = [{"policy": "lychee", "drafted": 10, "accepted": 5}, {"policy": "lychee", "drafted": 10, "accepted": 5},
               {"policy": "quest", "drafted": 10, "accepted": 1}, {"policy": "full"}]
    assert m.acceptance(records, "lychee") == pytest.approx(0.5)
    assert m.acceptance(records, "duo") is None
    times = [{"batch": 1, "context": 32768, "full_ms": 4.0, "draft_ms": 1.0, "verify_ms": {"2": 2.0, "4": 2.0}},
             {"batch": 4, "context": 131072, "full_ms": 8.0, "draft_ms": 2.0, "verify_ms": {"2": 6.0}},
             {"batch": 8, "context": 131072, "skipped": "no pages"}]
    rows = m.combine(times, {2: 0.5, 4: 0.5})
    # batch 1, γ 2: 1000 x 1.75 / (2 x 1 + 2) = 437.5 tok/s against Full's 250 and LycheeDecode's 1000
    r = rows[0]
    assert (r["gamma"], r["spec_tok_s"], r["full_tok_s"], r["lychee_tok_s"]) == (2, pytest.approx(437.5), 250.0, 1000.0)
    assert r["speedup_vs_full"] == pytest.approx(1.75)
    # γ 4: 1000 x 1.9375 / 6 = 322.9: γ 2 is the best at batch 1
    assert [b["gamma"] for b in m.best(rows)] == [2, 2]
    # batch 4, γ 2: 4000 x 1.75 / 10 = 700 against 500
    assert m.best(rows)[1]["speedup_vs_full"] == pytest.approx(1.4)
    fig = m.figure(rows, "t")
    (ax,) = fig.axes
    lines = {l.get_label(): (list(l.get_xdata()), list(l.get_ydata())) for l in ax.get_lines()}
    assert lines["batch 1"] == ([32.0], [pytest.approx(1.75)])
    assert lines["batch 4"] == ([128.0], [pytest.approx(1.4)])
    assert "| 4 | 131072 | 2 | 0.500 |" in m.markdown(rows)
    # bench_spec --drafts: each policy's own draft step; an old file (LycheeDecode's step only) or a
    # file without that policy's step is refused instead of computing with another draft's time
    by = [{"batch": 1, "context": 32768, "full_ms": 4.0, "draft_ms": 1.0, "draft_ms_by": {"lychee": 1.0, "quest": 3.0},
           "verify_ms": {"2": 2.0}}]
    q = m.combine(by, {2: 0.5}, "quest")[0]
    assert q["spec_tok_s"] == pytest.approx(1750.0 / 8.0) and q["lychee_tok_s"] == pytest.approx(1000.0 / 3.0)
    assert m.combine(by, {2: 0.5}, "lychee")[0]["spec_tok_s"] == pytest.approx(437.5)
    with pytest.raises(SystemExit, match="tidal"):
        m.combine(by, {2: 0.5}, "tidal")
    with pytest.raises(SystemExit, match="LycheeDecode's draft step only"):
        m.combine(times, {2: 0.5}, "quest")


def train_bench(path, shape, results, bench="train_step"):
    """A `bench_train_step --json` file with the given per-variant results."""
    json.dump({"bench": bench, "gpu": "NVIDIA H200", "shape": shape, "context": 32768, "targets": 1024,
               "results": results}, open(path, "w"))


def train_result(variant, ctx_ms, step_ms, dz):
    return {"variant": variant, "context_ms": ctx_ms, "teacher_ms": 50.0, "student_forward_ms": 300.0,
            "student_loss_ms": 5.0, "student_backward_ms": 600.0, "step_wall_ms": step_ms, "memory_gib": 56.5,
            "device_used_gib": 58.0, "dz_rel_diff_vs_first": dz}


def test_train_speed_table(tmp_path):
    f = tmp_path / "b.json"
    train_bench(f, "llama3-8b", [train_result("tf32, flash prefill", 3300.0, 4300.0, 0.0),
                                 train_result("bf16 prefill", 1500.0, 2500.0, 0.0123)])
    out = tmp_path / "t.md"
    p = run("train_speed_table.py", f, "--markdown", out)
    rows = [l for l in out.read_text().splitlines() if l.startswith("| llama3-8b")]
    assert len(rows) == 2 and p.stdout == out.read_text()
    assert rows[0].split(" | ")[4:5] == ["3300.0"] and rows[0].rstrip(" |").endswith("ref")
    assert "| 2500.0 |" in rows[1] and rows[1].rstrip(" |").endswith("1.2e-02")
    train_bench(f, "llama3-8b", [train_result("x", 1.0, 2.0, 0.0)], bench="e2e")
    p = run("train_speed_table.py", f, ok=False)
    assert p.returncode != 0 and "not a bench_train_step file" in p.stderr
    r = train_result("x", 1.0, 2.0, 0.0)
    del r["memory_gib"]
    train_bench(f, "llama3-8b", [r])
    p = run("train_speed_table.py", f, ok=False)
    assert p.returncode != 0 and "lacks memory_gib" in p.stderr
