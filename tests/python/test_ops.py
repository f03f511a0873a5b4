"""lychee.ops: the decode-attention kernel (dense and hybrid, with fused scoring) and the GPU
selection on torch tensors, against references at the tolerances of the C++ kernel tests
(tests/test_cuda_decode_attention.cpp, tests/test_cuda_hybrid.cpp):
    attention output  ||out - ref|| / ||ref|| <= 1e-2 (float64 reference over the same bf16 inputs)
    fused scores      |got - ref| <= 2e-3 (1 + |ref|)
    top-k / ratio     equal to the CPU reference selection (lychee.select_units_reference)
    top-p / threshold differing units only on the boundary (probability within 1e-5 of the
                      threshold, mass before the unit within 1e-4 of p), at most 2
The planner's binding is checked on the CPU too (any CUDA build). GPU tests skip, saying why, on a
machine without a Hopper GPU or without torch; scripts/gpu/run_all.sh python runs them there.
"""
import math
import os
import random

import pytest

import lychee
import lychee.ops as ops

WORDS = None if ops._ops is None else ops._ops.ITEM_WORDS
needs_ops_build = pytest.mark.skipif(ops._ops is None, reason="lychee was built without CUDA: no lychee.ops kernels")
GPU_REASON = ops.available()
# On the GPU machine (scripts/gpu/run_all.sh sets LYCHEE_REQUIRE_GPU=1) these tests fail instead of
# skipping when the GPU is unusable, so a broken driver cannot make the run green.
if os.environ.get("LYCHEE_REQUIRE_GPU") == "1":
    def needs_gpu(f):
        return f
else:
    needs_gpu = pytest.mark.skipif(GPU_REASON != "", reason=f"lychee.ops cannot run here: {GPU_REASON}")


# --- the planner's binding (host code: runs on any machine with a CUDA build) -------------------

def decode_items(words):
    items = []
    for i in range(0, len(words), WORDS):
        w = words[i:i + WORDS]
        packed, kinds = w[7] & 0xFFFFFFFF, w[8] & 0xFFFFFFFF
        items.append(dict(seq=w[0], kv_head=w[1], list=w[2], count=w[3], begin=w[4], end=w[5], slot=w[6],
                          unit=packed & 0xFFFF, row_begin=(packed >> 16) & 0xFF, n_rows=(packed >> 24) & 0xFF,
                          kind=kinds & 0xFF, score=(kinds >> 8) & 0xFF))
    return items


@needs_ops_build
@pytest.mark.parametrize("sm_count", [1, 7, 132])
def test_plan_covers_every_entry_once(sm_count):
    lens, n_kv, group, ps = [1, 63, 64, 700, 3001], 3, 3, 64
    heads = ops._ops.dense_heads(lens, n_kv, group, ps, 64)
    assert len(heads) == len(lens) * n_kv
    words, merge_begin, merge_count, n_slots = ops._ops.plan_decode(heads, len(lens), n_kv * group, n_kv, sm_count,
                                                                    2, 2 * ps, 4096)
    items = decode_items(words)
    assert len(merge_begin) == len(merge_count) == len(lens) * n_kv * group
    assert n_slots <= len(items)
    for seq, n in enumerate(lens):
        for kv in range(n_kv):
            mine = sorted((it["begin"], it["end"]) for it in items if (it["seq"], it["kv_head"]) == (seq, kv))
            covered = [e for b, e_ in mine for e in range(b, e_)]
            assert covered == list(range(-(-n // ps))), (seq, kv, mine)
            assert all(it["unit"] == ps and it["n_rows"] == group and it["kind"] == 0
                       for it in items if (it["seq"], it["kv_head"]) == (seq, kv))
    # A head split in k items merges k slots; a head in one item writes out directly.
    for seq in range(len(lens)):
        for kv in range(n_kv):
            k = sum(1 for it in items if (it["seq"], it["kv_head"]) == (seq, kv))
            for r in range(group):
                assert merge_count[(seq * n_kv + kv) * group + r] == (k if k > 1 else 0)


@needs_ops_build
def test_plan_rejects_bad_heads():
    with pytest.raises(lychee.InvalidArgumentError, match="plan_decode"):
        ops._ops.plan_decode([(0, 5, 4, 64, 0, 3, 0, 0, 0, 0)], 1, 9, 3, 132, 2, 128, 4096)
    with pytest.raises(lychee.InvalidArgumentError, match="kind"):
        ops._ops.plan_decode([(0, 0, 4, 64, 0, 3, 7, 0, 0, 0)], 1, 9, 3, 132, 2, 128, 4096)
    with pytest.raises(ValueError, match="only dense heads emit scores"):
        ops.HeadWork(0, 0, 4, 16, kind="units", score="group_token").as_tuple()


@needs_ops_build
def test_the_binding_checks_tensors_before_any_launch():
    """Host arrays (NumPy through DLPack/the buffer protocol) are refused, naming the argument."""
    import numpy as np

    q = np.zeros((1, 9, 64), np.float32)
    k = np.zeros((2, 3, 64, 64), np.float32)
    i32 = np.zeros((1, 2), np.int32)
    with pytest.raises(lychee.InvalidArgumentError, match="decode_attention: q must be a CUDA tensor"):
        ops._ops.decode_attention(q, k, k, i32, i32[0, :1], i32, i32[0, :1], i32[0], i32[0], q, q, q, None, None,
                                  None, None, 0, 0, 0.125, 0)
    with pytest.raises(lychee.InvalidArgumentError, match="select_units: seq_lens must be a CUDA tensor"):
        ops._ops.select_units(q[0], 1, 1, i32[0], i32[0], 1, i32, i32[0], q[0], "topk", 8, 0.0, 0, 0, 1.0, 0)


def test_plan_needs_bound_what_the_items_touch():
    """The extents decode_attention checks lists, scores and block tables against (pure Python)."""
    H = ops.HeadWork
    heads = [H(0, 0, 3, 64, 0, 4, "dense", "group_chunk16"), H(1, 5, 10, 64, 0, 4, "dense", "row_token"),
             H(1, 1, 7, 16, 0, 4, "units", "none", 100, 9), H(0, 3, 2, 1, 2, 1, "units", "none", 500, 20),
             H(0, 4, 42, 1, 0, 4, "window")]
    n = ops.plan_needs(heads, n_heads=24, n_kv_heads=6, page_size=64)
    assert n.list_extent == 502 and n.count_extent == 21 and n.uses_window
    assert n.score_rows == 1 * 24 + 5 * 4 + 4  # seq 1, KV head 5's last query row, + 1
    assert n.score_entries == 640               # row_token: 10 pages x 64 tokens
    assert n.dense_pages == 10
    none = ops.plan_needs([H(0, 0, 3, 64)], 8, 8, 64)
    assert (none.list_extent, none.score_rows, none.uses_window, none.dense_pages) == (0, 0, False, 3)


def test_ops_say_why_they_cannot_run():
    if GPU_REASON == "":
        pytest.skip("lychee.ops can run here")
    with pytest.raises(RuntimeError, match="lychee.ops: "):
        ops.decode_attention(None, None, None, None, None)


# --- GPU: the kernels against references ----------------------------------------------------

def paged_problem(lens, n_kv, group, d, ps, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    max_pages = max(-(-n // ps) for n in lens) + 1
    used = sum(-(-n // ps) for n in lens)
    n_pool = used + 3
    ids = torch.randperm(n_pool, generator=g).tolist()
    table = torch.full((len(lens), max_pages), -1, dtype=torch.int32)
    nxt = 0
    for s, n in enumerate(lens):
        for i in range(-(-n // ps)):
            table[s, i] = ids[nxt]
            nxt += 1
    q = (3.0 * torch.randn(len(lens), n_kv * group, d, generator=g)).bfloat16()
    k = torch.randn(n_pool, n_kv, ps, d, generator=g).bfloat16()
    v = torch.randn(n_pool, n_kv, ps, d, generator=g).bfloat16()
    seq = torch.tensor(lens, dtype=torch.int32)
    return [t.cuda() for t in (q, k, v, table, seq)]


def gather(cache, table, s, kv, positions, ps):
    import torch
    pos = torch.as_tensor(positions, device=cache.device, dtype=torch.long)
    pages = table[s].long()[pos // ps]
    return cache[pages, kv, pos % ps].double()


def reference(q, k, v, table, s, h, group, positions, ps, scale):
    kk, vv = gather(k, table, s, h // group, positions, ps), gather(v, table, s, h // group, positions, ps)
    p = (kk @ q[s, h].double() * scale).softmax(0)
    return p @ vv


def rel_l2(got, want):
    got = got.double()
    assert got.isfinite().all(), "an output element was not written (non-finite)"
    err = (got - want).norm() / want.norm()
    worst = (got - want).abs().argmax().item()
    return err.item(), worst


@needs_gpu
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("group,ps", [(3, 64), (4, 16), (1, 128)])
def test_dense_decode_attention_matches_the_reference(d, group, ps):
    import torch
    lens, n_kv = [1, 63, 64, 700, 3001], 3
    q, k, v, table, seq = paged_problem(lens, n_kv, group, d, ps, 11 + d + ps)
    out = torch.full_like(q, float("nan"))
    got = ops.decode_attention(q, k, v, table, seq, out=out)
    assert got.data_ptr() == out.data_ptr()  # written in place, no copy
    torch.cuda.synchronize()
    want = torch.stack([torch.stack([reference(q, k, v, table, s, h, group, range(n), ps, 1 / math.sqrt(d))
                                     for h in range(n_kv * group)]) for s, n in enumerate(lens)])
    err, worst = rel_l2(got, want)
    assert err <= 1e-2, f"rel. L2 {err:.3e}, worst element at flat index {worst}"


@needs_gpu
def test_runs_on_the_callers_stream():
    import torch
    q, k, v, table, seq = paged_problem([5, 900, 4000], 3, 3, 64, 64, 5)
    want = ops.decode_attention(q, k, v, table, seq)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        plan = ops.plan_decode(ops.dense_heads([5, 900, 4000], 3, 3, 64, table.shape[1]), 3, 9, 3, 64, 64, q.device)
        got = ops.decode_attention(q, k, v, table, seq, plan)
    side.synchronize()
    assert torch.equal(got, want)


@needs_gpu
@pytest.mark.parametrize("d", [64, 128])
def test_hybrid_heads_in_one_launch_match_the_reference(d):
    """KV heads: 0 dense + group-chunk scores, 1 page list, 2 16-token list planned at an upper
    bound, 3 per-query-head token lists, 4 window, 5 dense + per-row token scores."""
    import torch
    lens, n_kv, group, ps = [1, 63, 64, 700, 3001], 6, 4, 64
    n_heads, batch = n_kv * group, len(lens)
    q, k, v, table, seq = paged_problem(lens, n_kv, group, d, ps, 77 + d)
    rng = random.Random(3)
    max_units, sink, recent = 3001 + 1, 5, 37
    rows = batch * n_heads + batch * n_kv
    lists = torch.zeros(rows * max_units, dtype=torch.int32)
    counts = torch.zeros(rows, dtype=torch.int32)
    reads = {}
    heads = []

    def random_units(n_units, want):
        chosen = sorted(rng.sample(range(n_units - 1), min(want, n_units) - 1)) + [n_units - 1]
        return chosen

    for s, n in enumerate(lens):
        for h in range(n_kv):
            krow = s * n_kv + h
            if h in (0, 5):
                heads.append(ops.HeadWork(s, h, -(-n // ps), ps, 0, group, "dense",
                                          "group_chunk16" if h == 0 else "row_token"))
                toks = list(range(n))
            elif h in (1, 2):
                unit = ps if h == 1 else 16
                u = random_units(-(-n // unit), 1 + n // (3 * unit))
                lists[krow * max_units: krow * max_units + len(u)] = torch.tensor(u, dtype=torch.int32)
                counts[krow] = len(u)
                heads.append(ops.HeadWork(s, h, len(u) if h == 1 else -(-n // unit), unit, 0, group, "units",
                                          "none", krow * max_units, krow))
                toks = [t for x in u for t in range(x * unit, min(n, x * unit + unit))]
            elif h == 4:
                se = min(sink, n)
                re = min(recent, n - se)
                heads.append(ops.HeadWork(s, h, se + re, 1, 0, group, "window"))
                toks = list(range(se)) + list(range(n - re, n))
            else:  # h == 3: a token list per query head
                for gq in range(group):
                    qrow = s * n_heads + h * group + gq
                    lrow = batch * n_kv + qrow
                    u = random_units(n, 1 + rng.randrange(500))
                    lists[lrow * max_units: lrow * max_units + len(u)] = torch.tensor(u, dtype=torch.int32)
                    counts[lrow] = len(u)
                    heads.append(ops.HeadWork(s, h, len(u), 1, gq, 1, "units", "none", lrow * max_units, lrow))
                    reads[(s, h * group + gq)] = u
                continue
            for gq in range(group):
                reads[(s, h * group + gq)] = toks
    for sms in (1, 132):
        plan = ops.plan_decode(heads, batch, n_heads, n_kv, d, ps, q.device, sm_count=sms)
        # The dense heads are planned in whole pages: scores must hold 47 x 64 = 3008 tokens per
        # row (decode_attention refuses fewer, since the true lengths live on the device).
        stride = plan.needs.score_entries
        assert stride == -(-max(lens) // ps) * ps
        scores = torch.full((batch * n_heads, stride), float("nan"), device=q.device)
        token_reads = torch.zeros(batch, dtype=torch.int64, device=q.device)
        out = ops.decode_attention(q, k, v, table, seq, plan, unit_lists=lists.cuda(), list_counts=counts.cuda(),
                                   scores=scores, window=(sink, recent), token_reads=token_reads)
        torch.cuda.synchronize()
        want = torch.stack([torch.stack([reference(q, k, v, table, s, hq, group, reads[(s, hq)], ps, 1 / math.sqrt(d))
                                         for hq in range(n_heads)]) for s in range(batch)])
        err, worst = rel_l2(out, want)
        assert err <= 1e-2, f"d {d} sms {sms}: rel. L2 {err:.3e}, worst at flat index {worst}"
        sc = scores.cpu().double()
        for s, n in enumerate(lens):
            kk = gather(k, table, s, 0, range(n), ps).cpu()
            qbar = q[s, 0:group].double().mean(0).cpu()
            dots = kk @ qbar
            for c in range(-(-n // 16)):
                best = dots[c * 16:(c + 1) * 16].max().item()
                got = sc[s * n_kv + 0, c].item()
                assert abs(got - best) <= 2e-3 * (1 + abs(best)), f"seq {s} chunk {c}: {got} vs {best}"
            k5 = gather(k, table, s, 5, range(n), ps).cpu()
            for gq in range(group):
                row = q[s, 5 * group + gq].double().cpu()
                for t in range(0, n, 97):
                    dot = (k5[t] @ row).item()
                    got = sc[s * n_heads + 5 * group + gq, t].item()
                    assert abs(got - dot) <= 2e-3 * (1 + abs(dot)), f"seq {s} row {gq} token {t}"
        counted = token_reads.cpu().tolist()
        for s in range(batch):
            assert counted[s] == sum(len(reads[(s, h * group)]) for h in range(n_kv) if h != 3), s


def unit_max(scores, n, unit, score_unit):
    per = unit // score_unit
    out = [-math.inf] * -(-n // unit)
    for i in range(-(-n // score_unit)):
        out[i // per] = max(out[i // per], scores[i])
    return out


def gpu_select(scores, n, unit, score_unit, **params):
    import torch
    lists, counts = ops.select_units(torch.tensor([scores], dtype=torch.float32, device="cuda"),
                                     torch.tensor([n], dtype=torch.int32, device="cuda"),
                                     torch.tensor([0], dtype=torch.int32, device="cuda"),
                                     row_heads=1, score_unit=score_unit, unit=unit, **params)
    c = counts[0].item()
    return lists[0, :c].tolist()


@needs_gpu
def test_top_k_and_ratio_equal_the_cpu_reference():
    rng = random.Random(5)
    for trial in range(120):
        unit = (1, 16, 64)[trial % 3]
        score_unit = 1 if unit == 1 else 16
        n = 1 + rng.randrange(300 if trial % 2 else 9000)
        strategy = "ratio" if trial % 4 == 3 else "topk"
        budget = 1 + rng.randrange(2048)
        value = 0.02 + 0.5 * rng.randrange(1000) / 1000
        sink = rng.randrange(100) if trial % 5 == 0 else 0
        recent = rng.randrange(300) if trial % 7 == 0 else 0
        scores = [(rng.randrange(9) - 4) * 0.5 if trial % 2 else rng.gauss(0, 3) for _ in range(-(-n // score_unit))]
        p = dict(strategy=strategy, budget=budget, value=value, sink=sink, recent=recent, scale=0.125)
        want = lychee.select_units_reference(unit_max(scores, n, unit, score_unit), unit, n, **p)
        got = gpu_select(scores, n, unit, score_unit, **p)
        assert got == want, f"trial {trial}: n {n} unit {unit} {p}"


@needs_gpu
def test_top_p_and_threshold_differ_only_on_the_boundary():
    rng = random.Random(8)
    for trial in range(80):
        unit = 64 if trial % 2 else 1
        score_unit = 1 if unit == 1 else 16
        n = 1 + rng.randrange(6000)
        strategy = "topp" if trial % 4 < 2 else "threshold"
        value = (0.05 + 0.9 * rng.randrange(1000) / 1000) if strategy == "topp" else 0.0005 + 0.02 * rng.randrange(1000) / 1000
        p = dict(strategy=strategy, value=value, sink=4 if trial % 3 == 0 else 0, scale=0.125)
        scores = [rng.gauss(0, 6) for _ in range(-(-n // score_unit))]
        us = unit_max(scores, n, unit, score_unit)
        want = set(lychee.select_units_reference(us, unit, n, **p))
        got = set(gpu_select(scores, n, unit, score_unit, **p))
        diff = want ^ got
        assert len(diff) <= 2, f"trial {trial}"
        mx = max(s * 0.125 for s in us)
        prob = [math.exp(s * 0.125 - mx) for s in us]
        total = sum(prob)
        prob = [x / total for x in prob]
        for u in diff:
            if strategy == "threshold":
                assert abs(prob[u] - value) <= 1e-5, f"trial {trial} unit {u}"
            else:
                before = sum(prob[i] for i in range(len(us)) if us[i] > us[u] or (us[i] == us[u] and i < u))
                assert abs(before - value) <= 1e-4, f"trial {trial} unit {u}"


@needs_gpu
def test_bad_tensors_raise_clear_errors():
    import torch
    q, k, v, table, seq = paged_problem([10, 70], 3, 3, 64, 64, 1)
    with pytest.raises(ValueError, match="q must be torch.bfloat16"):
        ops.decode_attention(q.half(), k, v, table, seq)
    with pytest.raises(lychee.InvalidArgumentError, match="v_cache has shape .*dimension 3 must be 64"):
        ops.decode_attention(q, k, v[..., :32].contiguous(), table, seq)
    with pytest.raises(lychee.InvalidArgumentError, match="k_cache must be contiguous"):
        ops.decode_attention(q, k.transpose(2, 3).contiguous().transpose(2, 3), v, table, seq)
    with pytest.raises(lychee.InvalidArgumentError, match="v_cache must be a CUDA tensor"):
        ops.decode_attention(q, k, v.cpu(), table, seq)
    with pytest.raises(ValueError, match="block_table must be torch.int32"):
        ops.decode_attention(q, k, v, table.long(), seq)
    with pytest.raises(lychee.UnsupportedError, match="head_dim"):
        q96, k96, v96, t96, s96 = paged_problem([10], 1, 1, 96, 64, 2)
        ops.decode_attention(q96, k96, v96, t96, s96)
    plan = ops.plan_decode(ops.dense_heads([10, 70], 3, 3, 64, table.shape[1], score="group_chunk16"), 2, 9, 3, 64,
                           64, q.device)
    with pytest.raises(ValueError, match="pass scores"):
        ops.decode_attention(q, k, v, table, seq, plan)
    with pytest.raises(ValueError, match="scores must be at least"):
        ops.decode_attention(q, k, v, table, seq, plan, scores=torch.zeros(6, 2, device="cuda"))
    with pytest.raises(ValueError, match="strategy"):
        ops.select_units(torch.zeros(1, 8, device="cuda"), seq[:1], seq[:1] * 0, row_heads=1, score_unit=1, unit=1,
                         strategy="best")
