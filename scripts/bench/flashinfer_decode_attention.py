#!/usr/bin/env python3
"""Times FlashInfer's decode attention at the shapes of bench/bench_decode_attention.cu (the
batch x context x sparse-head share sweep), so that our kernel, torch's cuDNN SDPA and FlashInfer
are compared in the same run.

Shape: Llama-3-8B's attention, 32 query / 8 KV heads, d = 128, page 64, bf16, one query token per
sequence. Share s/8 as in bench_decode_attention: the last s KV heads are sparse heads reading
--sparse-frac of their pages (ceil(frac * pages), a random ascending set that ends with the last
page; --budget TOKENS instead reads budget/64 pages), the others read every page. Configurations:

  share 0 (dense):
    decode-cc   BatchDecodeWithPagedKVCacheWrapper, use_tensor_cores=False (CUDA-core decode)
    decode-tc   BatchDecodeWithPagedKVCacheWrapper, use_tensor_cores=True
                (each in every --layouts layout, NHD first; page indices shuffled; backend "auto",
                or e.g. decode-tc-fa2, decode-tc-fa3, decode-cc-cudnn in --dense-configs to pin one)
  share > 0 (FlashInfer's paged wrappers take one page list per request, so per-KV-head page
  lists are emulated by making each (request, KV head) a request of its own with 1 KV head and
  4 query heads, over the HND pool viewed as [pages * 8, 64, 1, 128]: dense heads list every page
  of their request, sparse heads their selected pages; one plan, one launch):
    perhead-cc  BatchDecodeWithPagedKVCacheWrapper, use_tensor_cores=False, those lists
    perhead-tc  the same with use_tensor_cores=True
    bsr         BlockSparseAttentionWrapper, rows = (request, KV head), R = 1, C = 64, the same lists
    vbsr        VariableBlockSparseAttentionWrapper, block_mask_map [8 KV heads, batch rows,
                batch * pages columns] (per-KV-head masks; row b may select its own pages only),
                64-token column blocks, the KV as [8, batch * context, 128]

Timing as in torch_decode_attention.py: CUDA events around each call after warm-up, the median of
--reps calls; plans built once, input sets (q and the whole KV pool) rotated so that at least
400 MB of KV is touched per rotation (L2 is 50 MB), at most 800 MB of pools. Each call is also
timed as a CUDA-graph replay (one graph per input set) where capture works. Bandwidth = K+V bytes
touched / time; % copy against a device-to-device copy timed in the same run. A configuration that
fails (JIT, plan, run, capture) is reported in its row and the run goes on. JSON is rewritten
after every shape, so a run cut short keeps what it measured.

    python3 scripts/bench/flashinfer_decode_attention.py --json flashinfer_decode_attention.json
    python3 scripts/bench/flashinfer_decode_attention.py --jit-only   # compile the kernels, time nothing
"""
import argparse
import datetime
import json
import math
import os
import sys
import time
import traceback

import torch

# The same timing and copy reference as torch SDPA's benchmark (this folder is on sys.path when run).
from torch_decode_attention import copy_bandwidth, driver_version, time_calls  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 64
GROUP = HEADS // KV_HEADS
ROTATE_BYTES = 400e6
WORKSPACE_BYTES = 256 << 20
DENSE_CONFIGS = ("decode-cc", "decode-tc")
SPARSE_CONFIGS = ("perhead-cc", "perhead-tc", "bsr", "vbsr")


def time_graphs(fn, n_sets, warmup, reps):
    """One CUDA graph per input set, each capturing fn(set); replays timed like time_calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graphs = []
    with torch.cuda.stream(stream):
        for s in range(n_sets):  # a call outside capture first: lazy allocations, workspace
            fn(s)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    for s in range(n_sets):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            fn(s)
        graphs.append(g)
    torch.cuda.synchronize()
    med, best = time_calls(lambda i: graphs[i].replay(), n_sets, warmup, reps)
    del graphs
    return med, best


def short_error(e):
    msg = f"{type(e).__name__}: {e}".strip()
    lines = [l for l in msg.splitlines() if l.strip()]
    # JIT failures end with the compiler's error; keep the first and the last lines.
    text = lines[0] if len(lines) <= 2 else f"{lines[0]} ... {lines[-1]}"
    return text[:500]


class Shape:
    """One (batch, context, share): the pools (rotated sets), q, and the page lists."""

    def __init__(self, batch, context, share, sparse_frac, budget, seed):
        self.batch, self.context, self.share = batch, context, share
        self.pp = context // PAGE                          # pages per sequence
        self.n_pages = batch * self.pp                     # pages of one set's pool
        if budget:
            self.sparse_pages = max(1, min(self.pp, budget // PAGE))
        else:
            self.sparse_pages = max(1, min(self.pp, math.ceil(sparse_frac * self.pp)))
        n_dense = KV_HEADS - share
        bytes_per_page = 2 * PAGE * HEAD_DIM * 2           # K + V of one (page, KV head)
        self.kv_bytes = bytes_per_page * batch * (n_dense * self.pp + share * self.sparse_pages)
        pool_bytes = 2 * batch * context * KV_HEADS * HEAD_DIM * 2
        self.n_sets = min(max(1, math.ceil(ROTATE_BYTES / self.kv_bytes)), max(1, int(2 * ROTATE_BYTES / pool_bytes)))
        g = torch.Generator(device="cpu").manual_seed(batch * 131 + context + share)
        # Pools: one [pages, 8, 64, 128] (HND) buffer per set for K and for V; other layouts view
        # the same memory (the data are random, so a reinterpretation is as good as a copy).
        self.k = torch.empty(self.n_sets, self.n_pages, KV_HEADS, PAGE, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
        self.v = torch.empty_like(self.k)
        self.k.uniform_(-1, 1)
        self.v.uniform_(-1, 1)
        self.q = torch.empty(self.n_sets, batch, HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda").uniform_(-1, 1)
        # Page table: request b's logical page j is physical page perm[b * pp + j].
        self.perm = torch.randperm(self.n_pages, generator=g).to(torch.int32)
        # Sparse heads' selections: sparse_pages logical pages, ascending, the last one included.
        self.sel = {}
        for b in range(batch):
            for h in range(n_dense, KV_HEADS):
                if self.sparse_pages >= self.pp:
                    self.sel[b, h] = torch.arange(self.pp, dtype=torch.int32)
                    continue
                pick = torch.randperm(self.pp - 1, generator=g)[: self.sparse_pages - 1].sort().values
                self.sel[b, h] = torch.cat([pick.to(torch.int32), torch.tensor([self.pp - 1], dtype=torch.int32)])
        self.n_dense = n_dense

    def logical_pages(self, b, h):
        return self.sel[b, h] if h >= self.n_dense else torch.arange(self.pp, dtype=torch.int32)

    def perhead_lists(self):
        """indptr, indices over the [pages * 8] per-(page, head) view: row b * 8 + h."""
        lists = []
        for b in range(self.batch):
            table = self.perm[b * self.pp:(b + 1) * self.pp]
            for h in range(KV_HEADS):
                lists.append(table[self.logical_pages(b, h).long()] * KV_HEADS + h)
        indptr = torch.zeros(len(lists) + 1, dtype=torch.int32)
        indptr[1:] = torch.cumsum(torch.tensor([len(x) for x in lists]), 0)
        return indptr, torch.cat(lists)

    def free(self):
        del self.k, self.v, self.q


def make_workspace(state):
    if "ws" not in state:
        state["ws"] = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    return state["ws"]


def setup_decode(fi, sh, layout, tensor_cores, state, backend="auto"):
    """Dense paged decode over the whole pool: returns call(set)."""
    ws = make_workspace(state)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, layout, use_tensor_cores=tensor_cores, backend=backend)
    indptr = torch.arange(sh.batch + 1, dtype=torch.int32) * sh.pp
    last = torch.full((sh.batch,), PAGE, dtype=torch.int32)
    w.plan(indptr.cuda(), sh.perm.cuda(), last.cuda(), HEADS, KV_HEADS, HEAD_DIM, PAGE,
           pos_encoding_mode="NONE", q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
           o_data_type=torch.bfloat16)
    if layout == "NHD":
        kv = [(sh.k[s].view(sh.n_pages, PAGE, KV_HEADS, HEAD_DIM), sh.v[s].view(sh.n_pages, PAGE, KV_HEADS, HEAD_DIM))
              for s in range(sh.n_sets)]
    else:
        kv = [(sh.k[s], sh.v[s]) for s in range(sh.n_sets)]
    out = torch.empty(sh.batch, HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    return w, lambda s: w.run(sh.q[s], kv[s], out=out), out


def setup_perhead(fi, sh, tensor_cores, state):
    """Per-(request, KV head) page lists through the paged decode wrapper."""
    ws = make_workspace(state)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tensor_cores)
    indptr, indices = sh.perhead_lists()
    rows = sh.batch * KV_HEADS
    last = torch.full((rows,), PAGE, dtype=torch.int32)
    w.plan(indptr.cuda(), indices.cuda(), last.cuda(), GROUP, 1, HEAD_DIM, PAGE,
           pos_encoding_mode="NONE", q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
           o_data_type=torch.bfloat16)
    # HND [pages, 8, 64, 128] == NHD [pages * 8, 64, 1, 128]: page p's head h is page p * 8 + h.
    kv = [(sh.k[s].view(sh.n_pages * KV_HEADS, PAGE, 1, HEAD_DIM), sh.v[s].view(sh.n_pages * KV_HEADS, PAGE, 1, HEAD_DIM))
          for s in range(sh.n_sets)]
    qs = [sh.q[s].view(rows, GROUP, HEAD_DIM) for s in range(sh.n_sets)]  # query head = kv head * 4 + g
    out = torch.empty(rows, GROUP, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    return w, lambda s: w.run(qs[s], kv[s], out=out), out


def setup_bsr(fi, sh, state):
    """BlockSparseAttentionWrapper: rows (request, KV head), columns the per-(page, head) blocks."""
    ws = make_workspace(state)
    w = fi.BlockSparseAttentionWrapper(ws)
    indptr, indices = sh.perhead_lists()
    rows = sh.batch * KV_HEADS
    n_tokens = sh.n_pages * KV_HEADS * PAGE
    w.plan(indptr.cuda(), indices.cuda(), rows, n_tokens, 1, PAGE, GROUP, 1, HEAD_DIM,
           q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, o_data_type=torch.bfloat16)
    kv = [(sh.k[s].view(n_tokens, 1, HEAD_DIM), sh.v[s].view(n_tokens, 1, HEAD_DIM)) for s in range(sh.n_sets)]
    qs = [sh.q[s].view(rows, GROUP, HEAD_DIM) for s in range(sh.n_sets)]
    out = torch.empty(rows, GROUP, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    return w, lambda s: w.run(qs[s], kv[s][0], kv[s][1], out=out), out


def setup_vbsr(fi, sh, state):
    """VariableBlockSparseAttentionWrapper: per-KV-head block masks, 64-token column blocks."""
    ws = make_workspace(state)
    w = fi.VariableBlockSparseAttentionWrapper(ws)
    n_cols = sh.batch * sh.pp
    mask = torch.zeros(KV_HEADS, sh.batch, n_cols, dtype=torch.bool)
    for b in range(sh.batch):
        for h in range(KV_HEADS):
            mask[h, b, b * sh.pp + sh.logical_pages(b, h).long()] = True
    row_sz = torch.ones(KV_HEADS, sh.batch, dtype=torch.int32)
    col_sz = torch.full((KV_HEADS, n_cols), PAGE, dtype=torch.int32)
    w.plan(mask.cuda(), row_sz.cuda(), col_sz.cuda(), HEADS, KV_HEADS, HEAD_DIM,
           q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    n_tok = sh.batch * sh.context
    kv = [(sh.k[s].view(KV_HEADS, n_tok, HEAD_DIM), sh.v[s].view(KV_HEADS, n_tok, HEAD_DIM)) for s in range(sh.n_sets)]
    qs = [sh.q[s].transpose(0, 1).contiguous() for s in range(sh.n_sets)]  # [32, batch, 128]
    return w, lambda s: w.run(qs[s], kv[s][0], kv[s][1]), None


def resolved(w):
    for attr in ("resolved_backend", "_backend"):
        try:
            v = getattr(w, attr)
            return v if isinstance(v, str) else str(v)
        except Exception:  # noqa: BLE001
            continue
    return None


def run_config(fi, sh, name, layout, args, state):
    row = {"batch": sh.batch, "context": sh.context, "sparse_share": sh.share, "config": name,
           "layout": layout, "kv_bytes": sh.kv_bytes, "input_sets": sh.n_sets,
           "sparse_pages": sh.sparse_pages if sh.share else 0}
    t0 = time.time()
    try:
        if name.startswith("decode-cc") or name.startswith("decode-tc"):
            backend = name[len("decode-tc-"):] or "auto"
            w, call, _ = setup_decode(fi, sh, layout, name.startswith("decode-tc"), state, backend)
        elif name == "perhead-cc":
            w, call, _ = setup_perhead(fi, sh, False, state)
        elif name == "perhead-tc":
            w, call, _ = setup_perhead(fi, sh, True, state)
        elif name == "bsr":
            w, call, _ = setup_bsr(fi, sh, state)
        elif name == "vbsr":
            w, call, _ = setup_vbsr(fi, sh, state)
        else:
            raise ValueError(f"unknown config {name}")
        row["backend"] = resolved(w)
        o = call(0)
        torch.cuda.synchronize()
        if isinstance(o, (tuple, list)):
            o = o[0]
        if not torch.isfinite(o.float()).all().item():
            raise RuntimeError("non-finite output")
        row["setup_s"] = round(time.time() - t0, 2)
        if args.jit_only:
            row["jit_only"] = True
            return row
        med, best = time_calls(call, sh.n_sets, args.warmup, args.reps)
        row.update(us_median=med, us_min=best, gbs=sh.kv_bytes / med / 1e3)
        if not args.no_graphs:
            try:
                gmed, _ = time_graphs(call, sh.n_sets, args.warmup, args.reps)
                row.update(us_graph_median=gmed, gbs_graph=sh.kv_bytes / gmed / 1e3)
            except Exception as e:  # noqa: BLE001 - eager timing stands without the graph one
                row["graph_error"] = short_error(e)
                torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - one bad configuration must not lose the run
        row["error"] = short_error(e)
        if args.verbose:
            traceback.print_exc()
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001 - a sticky CUDA error: later rows will say so
            pass
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--contexts", default="16384,32768,65536,131072")
    ap.add_argument("--shares", default="0,4,5,6,7,8")
    ap.add_argument("--sparse-frac", type=float, default=0.1, help="as bench_decode_attention (default 0.1)")
    ap.add_argument("--budget", type=int, default=0, help="sparse heads read budget/64 pages instead of --sparse-frac")
    ap.add_argument("--dense-configs", default=",".join(DENSE_CONFIGS))
    ap.add_argument("--sparse-configs", default=",".join(SPARSE_CONFIGS))
    ap.add_argument("--layouts", default="NHD,HND", help="layouts of the dense decode configs")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--no-graphs", action="store_true", help="skip the CUDA-graph replay timing")
    ap.add_argument("--max-seconds", type=float, default=0, help="start no new shape after this many seconds")
    ap.add_argument("--jit-only", action="store_true", help="build every configuration once at a small shape")
    ap.add_argument("--tag", default="")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    args.reps = max(50, args.reps)
    start = time.time()

    t0 = time.time()
    import flashinfer as fi  # noqa: E402 - imported late: its import is timed and reported
    import_s = time.time() - t0
    from flashinfer.jit import env as jit_env
    gpu = torch.cuda.get_device_name()
    print(f"{gpu}, driver {driver_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"flashinfer {fi.__version__} (import {import_s:.1f} s)")
    print(f"flashinfer JIT cache: {jit_env.FLASHINFER_JIT_DIR}", flush=True)
    dense_cfgs = [c for c in args.dense_configs.split(",") if c]
    sparse_cfgs = [c for c in args.sparse_configs.split(",") if c]
    layouts = [l for l in args.layouts.split(",") if l]
    state = {}

    if args.jit_only:
        rows = []
        for share, cfgs in ((0, dense_cfgs), (4, sparse_cfgs)):
            sh = Shape(1, 4096, share, args.sparse_frac, args.budget, 0)
            for c in cfgs:
                for layout in (layouts if c.startswith("decode") else ["HND"]):
                    r = run_config(fi, sh, c, layout, args, state)
                    rows.append(r)
                    print(f"  jit {c:10s} {layout}: {r.get('error') or 'ok, backend %s, %.1f s' % (r.get('backend'), r['setup_s'])}",
                          flush=True)
            sh.free()
        sys.exit(1 if any("error" in r for r in rows) else 0)

    copy_bw = copy_bandwidth()
    print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s (read + write)")
    doc = {
        "benchmark": "flashinfer_decode",
        "gpu": gpu,
        "driver": driver_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "flashinfer": fi.__version__,
        "flashinfer_git": getattr(fi, "__git_commit__", None),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join([sys.executable] + sys.argv),
        "tag": args.tag,
        "copy_bandwidth_gbs": copy_bw / 1e9,
        "shape": {"n_heads": HEADS, "n_kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "page_size": PAGE, "dtype": "bf16"},
        "sparse_frac": args.sparse_frac,
        "budget": args.budget,
        "reps": args.reps,
        "complete": False,
        "rows": [],
    }
    rows = doc["rows"]

    def write():
        if args.json:
            tmp = args.json + ".tmp"
            with open(tmp, "w") as f:
                json.dump(doc, f, indent=1)
            os.replace(tmp, args.json)

    stopped = False
    for b in [int(x) for x in args.batches.split(",")]:
        for c in [int(x) for x in args.contexts.split(",")]:
            for share in [int(x) for x in args.shares.split(",")]:
                if args.max_seconds and time.time() - start > args.max_seconds:
                    stopped = True
                    break
                cfgs = [(n, l) for n in dense_cfgs for l in layouts] if share == 0 else [(n, "HND") for n in sparse_cfgs]
                try:
                    sh = Shape(b, c, share, args.sparse_frac, args.budget, 0)
                except Exception as e:  # noqa: BLE001 - e.g. out of memory at the largest shapes
                    for n, l in cfgs:
                        rows.append({"batch": b, "context": c, "sparse_share": share, "config": n, "layout": l,
                                     "error": short_error(e)})
                    print(f"  batch {b} context {c:6d} sparse {share}/8: {short_error(e)}", flush=True)
                    torch.cuda.empty_cache()
                    continue
                for n, l in cfgs:
                    r = run_config(fi, sh, n, l, args, state)
                    if "us_median" in r:
                        r["pct_copy"] = 100 * r["kv_bytes"] / (r["us_median"] * 1e-6) / copy_bw
                        if "us_graph_median" in r:
                            r["pct_copy_graph"] = 100 * r["kv_bytes"] / (r["us_graph_median"] * 1e-6) / copy_bw
                    rows.append(r)
                    if "error" in r:
                        msg = "ERROR " + r["error"]
                    else:
                        g = f"graph {r['us_graph_median']:8.1f} us" if "us_graph_median" in r else "graph -"
                        msg = (f"{r['us_median']:8.1f} us ({g}), {r['gbs']:6.0f} GB/s, {r['pct_copy']:5.1f}% of copy"
                               f" [{r.get('backend')}]")
                    print(f"  batch {b} context {c:6d} sparse {share}/8 {n:10s} {l}: {msg}", flush=True)
                sh.free()
                torch.cuda.empty_cache()
                write()
            if stopped:
                break
        if stopped:
            break
    doc["complete"] = not stopped
    doc["seconds"] = round(time.time() - start, 1)

    print("\n| batch | context | sparse | config | layout | touched MB | µs | GB/s | % copy | graph µs | % copy |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "us_median" in r:
            gu = f"{r['us_graph_median']:.1f}" if "us_graph_median" in r else "-"
            gp = f"{r['pct_copy_graph']:.1f}" if "pct_copy_graph" in r else "-"
            print(f"| {r['batch']} | {r['context'] // 1024}K | {r['sparse_share']}/8 | {r['config']} | {r['layout']} | "
                  f"{r['kv_bytes'] / 1e6:.0f} | {r['us_median']:.1f} | {r['gbs']:.0f} | {r['pct_copy']:.1f} | {gu} | {gp} |")
        else:
            print(f"| {r['batch']} | {r['context'] // 1024}K | {r['sparse_share']}/8 | {r['config']} | {r['layout']} | "
                  f"| error | | | | |")
    if stopped:
        print(f"\nstopped after --max-seconds {args.max_seconds:.0f}: {len(rows)} rows")
    write()
    if args.json:
        print(f"\nwrote {args.json}")
    n_err = sum("error" in r for r in rows)
    if n_err:
        print(f"{n_err} of {len(rows)} rows failed")
    sys.exit(1 if rows and n_err == len(rows) else 0)


if __name__ == "__main__":
    main()
