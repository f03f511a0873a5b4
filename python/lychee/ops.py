"""lychee.ops: lychee's decode-attention and selection kernels on CUDA torch tensors.

The tensors go to the kernels through DLPack without copies and the kernels run on the caller's
current CUDA stream. Available when lychee was built with CUDA (nvcc found at build time) and
torch is installed; the kernels need a Hopper GPU (sm_90a, the build's default architecture).

Layouts (outermost first, dtype last; as src/cuda/kernels/decode_attention.h):
    q            [batch, n_heads, head_dim] bf16, after RoPE
    k_cache      [n_pages, n_kv_heads, page_size, head_dim] bf16 (one layer's page pool)
    v_cache      [n_pages, n_kv_heads, page_size, head_dim] bf16
    block_table  [batch, max_pages] int32: physical page ids of each sequence
    seq_lens     [batch] int32: tokens of each sequence, the current one included
    out          [batch, n_heads, head_dim] bf16

Dense attention:

    out = lychee.ops.decode_attention(q, k_cache, v_cache, block_table, seq_lens)

The hybrid kernel ("plan, then run"): every head's work is a list of entries (HeadWork) of one KV
head, for all its query rows (GQA-packed) or one; plan_decode cuts all heads into splits of equal
token count over the SMs (the engine's host planner). A plan can be reused for every layer with
the same head pattern:

    plan = lychee.ops.plan_decode(heads, batch=.., n_heads=.., n_kv_heads=.., head_dim=.., page_size=..)
    out = lychee.ops.decode_attention(q, k_cache, v_cache, block_table, seq_lens, plan,
                                      unit_lists=lists, list_counts=counts, scores=scores)
    lists, counts = lychee.ops.select_units(scores, seq_lens, heads=..., row_heads=.., ...)

Dense items may emit scores in the same pass over K (fused scoring): "group_chunk16" (per 16
tokens the max of the group-mean query's logit q̄·k, LycheeDecode's block score), "group_token"
(q̄·k per token) or "row_token" (q·k per token and query row, TidalDecode). select_units turns
scores into ascending unit lists (top-k, top-p, threshold, ratio) that "units" heads then read.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from . import _lychee  # noqa: F401  (the error classes the kernels' errors map to)

try:
    from . import _ops
except ImportError:  # a build without CUDA
    _ops = None

try:
    import torch
    from torch.utils.dlpack import to_dlpack as _to_dlpack
except ImportError:  # torch is an optional dependency of lychee.ops only
    torch = None

KINDS = {"dense": 0, "units": 1, "window": 2}
SCORES = {"none": 0, "group_chunk16": 1, "group_token": 2, "row_token": 3}


def available() -> str:
    """"" when lychee.ops can run here, else why not."""
    if _ops is None:
        return "this lychee was built without CUDA (no nvcc when it was built), so lychee.ops has no kernels"
    if torch is None:
        return "lychee.ops needs torch (pip install torch)"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    status = _ops.cuda_status()
    if status:
        return status
    major, _ = torch.cuda.get_device_capability()
    if major != 9:
        return f"the kernels are built for Hopper (sm_90a); this GPU is sm_{major}x"
    return ""


_ready = False  # available() said "" once: it stays so for the process


def _require():
    global _ready
    if _ready:
        return
    why = available()
    if why:
        raise RuntimeError(f"lychee.ops: {why}")
    _ready = True


def _dl(t):
    """A tensor as a DLPack capsule for the binding (None stays None). torch.utils.dlpack.to_dlpack
    is one C call; letting nanobind call Tensor.__dlpack__ (a Python method) costs several
    microseconds per tensor, which at a dozen tensors per call was most of a small decode's time.
    The capsule shares the tensor's memory and keeps it alive; nothing is copied or synchronised
    (the kernel runs on the stream passed with it)."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    return _to_dlpack(t)


@dataclass(frozen=True)
class HeadWork:
    """One head's work for plan_decode: n_entries entries of `unit` tokens of KV head kv_head of
    sequence seq, for query rows [row_begin, row_begin + n_rows) of its group.

    kind "dense": entry e covers tokens [e*unit, e*unit + unit) (unit = page_size);
    "units": entry e covers unit unit_lists[list + e] (list_counts[count] entries are valid; plan
    at an upper bound when only the device knows the length); "window": the e-th of the first
    window[0] and last window[1] tokens (unit 1). score: what a dense item also writes.
    """

    seq: int
    kv_head: int
    n_entries: int
    unit: int
    row_begin: int = 0
    n_rows: int = 1
    kind: str = "dense"
    score: str = "none"
    list: int = 0
    count: int = 0

    def as_tuple(self):
        if self.kind not in KINDS:
            raise ValueError(f"HeadWork.kind must be one of {sorted(KINDS)}, got {self.kind!r}")
        if self.score not in SCORES:
            raise ValueError(f"HeadWork.score must be one of {sorted(SCORES)}, got {self.score!r}")
        if self.score != "none" and self.kind != "dense":
            raise ValueError(f"HeadWork: only dense heads emit scores, got kind {self.kind!r} with score {self.score!r}")
        return (self.seq, self.kv_head, self.n_entries, self.unit, self.row_begin, self.n_rows, KINDS[self.kind],
                SCORES[self.score], self.list, self.count)


@dataclass(frozen=True)
class PlanNeeds:
    """What a plan's items read and write beyond q, K and V: decode_attention checks the tensors
    it is given against these (the kernel itself cannot: the lengths live on the device)."""

    list_extent: int = 0    # unit_lists entries the "units" heads may read (list + n_entries)
    count_extent: int = 0   # list_counts entries they read (count + 1)
    uses_window: bool = False
    score_rows: int = 0     # rows of scores written (group kinds: seq * n_kv + kv; row_token: seq * n_heads + head)
    score_entries: int = 0  # entries per row (16-token chunks or tokens)
    dense_pages: int = 0    # block_table columns the dense heads read


def plan_needs(heads: Sequence[HeadWork], n_heads: int, n_kv_heads: int, page_size: int) -> PlanNeeds:
    """The list, score and block-table extents `heads` touch (pure; see PlanNeeds)."""
    group = n_heads // n_kv_heads
    units = [h for h in heads if h.kind == "units"]
    rows = entries = 0
    for h in heads:
        if h.score == "none":
            continue
        tokens = h.n_entries * h.unit
        if h.score == "row_token":
            rows = max(rows, h.seq * n_heads + h.kv_head * group + h.row_begin + h.n_rows)
        else:
            rows = max(rows, h.seq * n_kv_heads + h.kv_head + 1)
        entries = max(entries, -(-tokens // 16) if h.score == "group_chunk16" else tokens)
    return PlanNeeds(
        list_extent=max((h.list + h.n_entries for h in units), default=0),
        count_extent=max((h.count + 1 for h in units), default=0),
        uses_window=any(h.kind == "window" for h in heads),
        score_rows=rows, score_entries=entries,
        dense_pages=max((-(-h.n_entries * h.unit // page_size) for h in heads if h.kind == "dense"), default=0))


class DecodePlan:
    """A plan of the hybrid kernel on one device: the work items, the merge arrays and the
    partial-result buffers, plus what the plan needs of the lists and scores it reads/writes."""

    def __init__(self, heads: Sequence[HeadWork], batch: int, n_heads: int, n_kv_heads: int, head_dim: int,
                 page_size: int, device, sm_count: Optional[int] = None, max_items: Optional[int] = None,
                 min_tokens_per_split: Optional[int] = None):
        _require()
        device = torch.device(device if device is not None else "cuda")
        if device.type != "cuda":
            raise ValueError(f"plan_decode: device must be a CUDA device, got {device}")
        if device.index is None:  # "cuda" means the current device; tensors say "cuda:N"
            device = torch.device("cuda", torch.cuda.current_device())
        if n_kv_heads < 1 or n_heads % n_kv_heads != 0:
            raise ValueError(f"plan_decode: n_heads {n_heads} must be a multiple of n_kv_heads {n_kv_heads}")
        self.heads = list(heads)
        self.batch, self.n_heads, self.n_kv_heads = batch, n_heads, n_kv_heads
        self.head_dim, self.page_size, self.device = head_dim, page_size, device
        group = n_heads // n_kv_heads
        if sm_count is None:
            sm_count = torch.cuda.get_device_properties(device).multi_processor_count
        if max_items is None:
            max_items = max(2 * sm_count * 4, len(self.heads))
        if min_tokens_per_split is None:
            min_tokens_per_split = 2 * page_size
        words, merge_begin, merge_count, n_slots = _ops.plan_decode(
            [h.as_tuple() for h in self.heads], batch, n_heads, n_kv_heads, sm_count,
            _ops.ctas_per_sm(head_dim, page_size), min_tokens_per_split, max_items)
        n_items = len(words) // _ops.ITEM_WORDS
        self.n_items, self.n_slots = n_items, n_slots
        i32 = dict(dtype=torch.int32, device=device)
        self.items = torch.tensor(words, **i32).view(n_items, _ops.ITEM_WORDS)
        self.n_items_d = torch.tensor([n_items], **i32)
        self.merge_begin = torch.tensor(merge_begin, **i32)
        self.merge_count = torch.tensor(merge_count, **i32)
        slots = max(n_items, 1)
        self.partial_o = torch.empty(slots, group, head_dim, dtype=torch.float32, device=device)
        self.partial_lse = torch.empty(slots, group, dtype=torch.float32, device=device)
        self.needs = plan_needs(self.heads, n_heads, n_kv_heads, page_size)

    def __repr__(self):
        return (f"DecodePlan({len(self.heads)} heads -> {self.n_items} items, {self.n_slots} merge slots, "
                f"batch {self.batch}, {self.n_heads}/{self.n_kv_heads} heads)")


def plan_decode(heads: Sequence[HeadWork], batch: int, n_heads: int, n_kv_heads: int, head_dim: int,
                page_size: int, device=None, **kw) -> DecodePlan:
    """Plans the hybrid kernel for `heads` (the engine's host planner, plan_decode in
    src/cuda/kernels/decode_attention.h). kw: sm_count, max_items, min_tokens_per_split."""
    return DecodePlan(heads, batch, n_heads, n_kv_heads, head_dim, page_size, device, **kw)


def dense_heads(seq_lens: Sequence[int], n_kv_heads: int, group: int, page_size: int, max_pages: int,
                score: str = "none") -> List[HeadWork]:
    """Dense attention's work: every (sequence, KV head) reads all its pages, GQA-packed."""
    out = []
    for t in _ops.dense_heads([int(x) for x in seq_lens], n_kv_heads, group, page_size, max_pages):
        seq, kv, n, unit, row_begin, n_rows, _, _, lst, cnt = t
        out.append(HeadWork(seq, kv, n, unit, row_begin, n_rows, "dense", score, lst, cnt))
    return out


def _check_tensor(name, t, dtype):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {t.dtype}")


def decode_attention(q, k_cache, v_cache, block_table, seq_lens, plan: Optional[DecodePlan] = None, *,
                     unit_lists=None, list_counts=None, scores=None, window: Tuple[int, int] = (0, 0),
                     scale: Optional[float] = None, out=None, token_reads=None):
    """Paged decode attention of one query token per sequence (shapes in the module's doc).

    plan None: dense attention, planned here from seq_lens (one device-to-host copy of seq_lens;
    pass a plan to avoid it). unit_lists / list_counts: int32 lists "units" heads read; scores:
    float32 [rows, stride] that "*_token" / "group_chunk16" items write; window: (sink, recent)
    of "window" heads; token_reads: int64 [batch] += tokens read by GQA-packed items.
    Returns out (allocated when None). Runs on torch.cuda.current_stream().
    """
    _require()
    _check_tensor("q", q, torch.bfloat16)
    if q.dim() != 3:
        raise ValueError(f"decode_attention: q must be [batch, n_heads, head_dim], got shape {list(q.shape)}")
    _check_tensor("k_cache", k_cache, torch.bfloat16)
    if k_cache.dim() != 4:
        raise ValueError("decode_attention: k_cache must be [n_pages, n_kv_heads, page_size, head_dim], "
                         f"got shape {list(k_cache.shape)}")
    _check_tensor("seq_lens", seq_lens, torch.int32)
    _check_tensor("block_table", block_table, torch.int32)
    batch, n_heads, head_dim = q.shape
    n_kv, page_size = k_cache.shape[1], k_cache.shape[2]
    if plan is None:
        if n_kv < 1 or n_heads % n_kv != 0:
            raise ValueError(f"decode_attention: q's {n_heads} heads are not a multiple of k_cache's {n_kv} KV heads")
        if block_table.dim() != 2:
            raise ValueError(f"decode_attention: block_table must be [batch, max_pages], got shape {list(block_table.shape)}")
        heads = dense_heads(seq_lens.tolist(), n_kv, n_heads // n_kv, page_size, block_table.shape[1])
        plan = DecodePlan(heads, batch, n_heads, n_kv, head_dim, page_size, q.device)
    if (plan.batch, plan.n_heads, plan.n_kv_heads, plan.head_dim) != (batch, n_heads, n_kv, head_dim):
        raise ValueError(f"decode_attention: the plan is for batch {plan.batch}, {plan.n_heads}/{plan.n_kv_heads} "
                         f"heads, head_dim {plan.head_dim}; q is {list(q.shape)} and k_cache has {n_kv} KV heads")
    if plan.page_size != page_size:
        raise ValueError(f"decode_attention: the plan is for pages of {plan.page_size} tokens, k_cache's are {page_size}")
    if q.device != plan.device:
        raise ValueError(f"decode_attention: the plan lives on {plan.device}, q on {q.device}")
    needs = plan.needs
    if block_table.dim() == 2 and block_table.shape[1] < needs.dense_pages:
        raise ValueError(f"decode_attention: block_table has {block_table.shape[1]} pages per sequence; "
                         f"the plan's dense heads read {needs.dense_pages}")
    if needs.list_extent > 0:
        if unit_lists is None or list_counts is None:
            raise ValueError("decode_attention: the plan has 'units' heads: pass unit_lists and list_counts")
        _check_tensor("unit_lists", unit_lists, torch.int32)
        _check_tensor("list_counts", list_counts, torch.int32)
        if unit_lists.numel() < needs.list_extent or list_counts.numel() < needs.count_extent:
            raise ValueError(f"decode_attention: unit_lists has {unit_lists.numel()} entries and list_counts "
                             f"{list_counts.numel()}; the plan's heads read up to {needs.list_extent} and "
                             f"{needs.count_extent}")
        unit_lists, list_counts = unit_lists.reshape(-1), list_counts.reshape(-1)
    if needs.score_rows > 0:
        if scores is None:
            raise ValueError("decode_attention: the plan has scoring heads: pass scores [rows, stride] float32")
        _check_tensor("scores", scores, torch.float32)
        if scores.dim() != 2 or scores.shape[0] < needs.score_rows or scores.shape[1] < needs.score_entries:
            raise ValueError(f"decode_attention: scores must be at least [{needs.score_rows}, {needs.score_entries}] "
                             f"for the plan's scoring heads, got {list(scores.shape)}")
    sink, recent = window
    if needs.uses_window and sink + recent <= 0:
        raise ValueError("decode_attention: the plan has 'window' heads: pass window=(sink, recent)")
    if token_reads is not None:
        _check_tensor("token_reads", token_reads, torch.int64)
    if out is None:
        out = torch.empty_like(q)
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    stream = torch.cuda.current_stream(q.device).cuda_stream
    _ops.decode_attention(_dl(q), _dl(k_cache), _dl(v_cache), _dl(block_table), _dl(seq_lens), _dl(plan.items),
                          _dl(plan.n_items_d), _dl(plan.merge_begin), _dl(plan.merge_count), _dl(plan.partial_o),
                          _dl(plan.partial_lse), _dl(out), _dl(unit_lists), _dl(list_counts), _dl(scores),
                          _dl(token_reads), int(sink), int(recent), float(scale), stream)
    return out


def select_units(scores, seq_lens, heads, *, row_heads: int, score_unit: int, unit: int, strategy: str = "topk",
                 budget: int = 4096, value: float = 0.0, sink: int = 0, recent: int = 0, scale: float = 1.0,
                 max_len: Optional[int] = None):
    """The GPU selection (src/cuda/kernels/select.h) of units over fused scores.

    scores [batch * row_heads, stride] float32: row seq * row_heads + head, entry i covers
    tokens [i * score_unit, ...); a unit (a multiple of score_unit tokens) scores the max of its
    entries. heads: int32 CUDA tensor of the head index of each selector. strategy "topk" (budget
    tokens, forced units included), "topp" / "threshold" (value; probabilities softmax(scores *
    scale)), "ratio" (value of the units); sink / recent: forced tokens. max_len: the longest
    sequence (None: read from seq_lens, one device-to-host copy).
    Returns (lists [batch * row_heads, list_stride] int32 ascending unit ids, counts [batch *
    row_heads] int32); rows of heads not selected are left as they were allocated (zeros).
    """
    _require()
    _check_tensor("scores", scores, torch.float32)
    _check_tensor("seq_lens", seq_lens, torch.int32)
    _check_tensor("heads", heads, torch.int32)
    if strategy not in ("topk", "topp", "threshold", "ratio"):
        raise ValueError(f"select_units: strategy must be topk, topp, threshold or ratio, got {strategy!r}")
    if max_len is None:
        max_len = int(seq_lens.max().item()) if seq_lens.numel() else 1
    units = -(-max_len // unit)
    if scores.dim() != 2 or scores.shape[1] < -(-max_len // score_unit):
        raise ValueError(f"select_units: scores must be [rows, >= {-(-max_len // score_unit)}] for sequences of "
                         f"{max_len} tokens in entries of {score_unit}, got {list(scores.shape)}")
    rows = seq_lens.numel() * row_heads
    dev = scores.device
    lists = torch.zeros(rows, units + 1, dtype=torch.int32, device=dev)
    counts = torch.zeros(rows, dtype=torch.int32, device=dev)
    scratch = torch.empty(rows, units + 1, dtype=torch.float32, device=dev)
    stream = torch.cuda.current_stream(dev).cuda_stream
    _ops.select_units(_dl(scores), score_unit, unit, _dl(seq_lens), _dl(heads), row_heads, _dl(lists), _dl(counts),
                      _dl(scratch), strategy,
                      int(budget), float(value), int(sink), int(recent), float(scale), stream)
    return lists, counts


__all__ = ["DecodePlan", "HeadWork", "PlanNeeds", "available", "decode_attention", "dense_heads", "plan_decode",
           "plan_needs", "select_units"]
