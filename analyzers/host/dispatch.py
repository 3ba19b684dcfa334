"""dispatch analyzer: per-call costs - operators too small to be worth dispatching, and optimizers
that update parameters one tensor at a time.

Facts (hermes_kb/facts/cpu.py; formulas in docs/analysis/cpu.md):

* ``operator_dispatch`` (rank-level): top-level operators on the training thread whose largest
  input, in them or in anything they call, has at most ``SMALL_ELEMENTS`` elements; their time
  plus the host time between consecutive ones (each gap up to ``GAP_CAP_US``). A Python loop over
  tiny tensors shows as hundreds of such operators per step, one after another.
* ``optimizer_step`` (rank-level): time inside 'Optimizer.step#<Class>.step' annotations,
  whether the update ran fused, multi-tensor (foreach) or as a per-parameter loop, and how long
  the device idled inside it.
* ``zero_grad``: 'Optimizer.zero_grad#' annotations and the fills inside them (set_to_none=False);
* host/parallel_wrappers.py: ``ddp_buffer_broadcast``: DistributedDataParallel's buffer broadcast
  at each forward; ``data_parallel``: nn.DataParallel's replicate / scatter / gather / reduce
  functions; ``sync_batchnorm``: SyncBatchNorm's functions and the device waits inside them.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.cpu import OperatorDispatch, OptimizerStep, ZeroGrad
from hermes_kb.trace.args import decode

from .. import intervals as iv
from ..context import RankContext
from ..selection import div, main_tid, name_mask
from ..whatif.sets import WhatIfSet, register
from .parallel_wrappers import data_parallel, ddp_buffer_broadcast, sync_batchnorm

# 4096 elements is a few microseconds of arithmetic at most, about what PyTorch's Python binding,
# dispatcher and autograd bookkeeping cost per call on a CPU core
SMALL_ELEMENTS = 4096
GAP_CAP_US = 200.0
TOP_NAMES = 5
# operators that only write a new tensor header over the same storage: their cost is the call, not
# the tensor's size, so a select on a large batch is as small as a mul on a (16,) slice. reshape,
# flatten and contiguous copy when they must, and then through a callee (clone, copy_) that
# carries its own input size
VIEW_OPS = frozenset(f"aten::{n}" for n in (
    "alias", "as_strided", "chunk", "contiguous", "detach", "diagonal", "expand", "expand_as", "flatten",
    "narrow", "permute", "reshape", "reshape_as", "select", "slice", "split", "split_with_sizes", "squeeze",
    "t", "transpose", "unbind", "unflatten", "unsqueeze", "view", "view_as", "_reshape_alias", "_unsafe_view",
    "lift_fresh", "numpy_T",
))  # fmt: skip
OPTIMIZER_RE = re.compile(r"^Optimizer\.step#(\w+)\.step$")
# torch's tensor printer (the same frames analyzers/host/pyframes.py measures as tensor_formatting)
TENSOR_STR_RE = re.compile(r"^torch/_tensor\.py\(\d+\): (__repr__|__str__|__format__)$|^torch/_tensor_str\.py\(\d+\): ")
ZERO_GRAD_RE = re.compile(r"^Optimizer\.zero_grad#(\w+)\.zero_grad$")
FILL_OPS = ("aten::zero_", "aten::fill_", "aten::_foreach_zero_")


def largest_input(dims_text: str) -> int:
    """Element count of the largest tensor argument in a Kineto 'Input Dims' value; -1 when the
    value records no tensor shape."""
    dims = decode(dims_text)
    if not isinstance(dims, list):
        return -1
    best = -1
    for d in dims:
        if isinstance(d, list) and all(isinstance(x, int) for x in d):
            best = max(best, math.prod(d) if d else 1)
    return best


def _work_of_roots(ops: pd.DataFrame, depth_max: int) -> np.ndarray:
    """Largest input under each top-level op, indexed by row (-1 when unknown; meaningless for
    nested rows)."""
    cats = ops["input_dims"].cat.categories
    per_cat = np.array([largest_input(str(c)) for c in cats] + [-1], dtype=np.int64)
    codes = ops["input_dims"].cat.codes.to_numpy().astype(np.int64)
    el = per_cat[np.where(codes < 0, len(cats), codes)]
    el[ops["name"].isin(VIEW_OPS).to_numpy()] = 0  # a view's callees are views too, or count on their own
    parent = ops["parent"].to_numpy()
    root = np.arange(len(ops))
    for _ in range(depth_max):
        p = parent[root]
        if (p < 0).all():
            break
        root = np.where(p >= 0, p, root)
    work = np.full(len(ops), -1, dtype=np.int64)
    np.maximum.at(work, root, el)
    return work


def _dispatch(ctx: RankContext) -> list[Fact]:
    tr = ctx.trace
    ops = tr.cpu_ops
    if not len(ops) or not any(str(c) for c in ops["input_dims"].cat.categories):
        return []
    tid = main_tid(tr)
    if tid is None:
        return []
    work = _work_of_roots(ops, int(ops["depth"].max()))
    st = ctx.step_of(ops["ts"].to_numpy())
    top = (ops["depth"].to_numpy() == 0) & (ops["tid"].to_numpy() == tid) & (st >= 0)
    # operators torch's tensor printer issues (print / f-strings of tensors: one read per element)
    # are the printing's cost (tensor_formatting), not a loop of the user's to vectorise
    py = tr.python
    if len(py):
        pm = name_mask(py["name"], TENSOR_STR_RE) & (py["tid"].to_numpy() == tid)
        if pm.any():
            top &= ~iv.covered_by(ops["ts"].to_numpy(), iv.union(py["ts"].to_numpy()[pm], py["end"].to_numpy()[pm]))
    sel = np.flatnonzero(top)
    if not len(sel):
        return []
    sel = sel[np.argsort(ops["ts"].to_numpy()[sel], kind="stable")]
    ts, end = ops["ts"].to_numpy()[sel], ops["end"].to_numpy()[sel]
    w, step = work[sel], st[sel]
    small = (w >= 0) & (w <= SMALL_ELEMENTS)
    pair = small[:-1] & small[1:] & (step[:-1] == step[1:])
    gaps = np.clip(ts[1:] - end[:-1], 0.0, GAP_CAP_US)
    small_us = float((end - ts)[small].sum())
    between = float(gaps[pair].sum())
    if small.any():
        gs, ge = end[:-1][pair], end[:-1][pair] + gaps[pair]
        register(ctx, WhatIfSet.of_intervals(
            "tiny_ops", f"operators on at most {SMALL_ELEMENTS} elements and the host time between consecutive ones",
            tid, np.concatenate([ts[small], gs]), np.concatenate([end[small], ge])))  # fmt: skip
    n_small = int(small.sum())
    window = ctx.windows_us
    names = ops["name"].to_numpy()[sel][small]
    uniq, counts = np.unique(names.astype(str), return_counts=True) if n_small else (np.array([]), np.array([]))
    top = np.argsort(-counts)[:TOP_NAMES]
    longest = np.flatnonzero(small)[np.argsort(-(end - ts)[small])[:3]]  # the 3 longest small ops
    return [OperatorDispatch(
        rank=tr.rank, steps_count=len(ctx.windows), window_us=window, small_elements=SMALL_ELEMENTS,
        ops_count=len(sel), shaped_ops_count=int((w >= 0).sum()), small_ops_count=n_small,
        small_ops_per_step=n_small / max(len(ctx.windows), 1), small_ops_us=small_us, between_small_us=between,
        gap_cap_us=GAP_CAP_US, dispatch_us=small_us + between, dispatch_ratio=div(small_us + between, window),
        dispatch_per_op_us=(small_us + between) / n_small if n_small else None,
        evidence=Evidence(
            time_ranges_us=[(float(ts[i]), float(end[i])) for i in longest],
            events=[str(uniq[i]) for i in top], counts={str(uniq[i]): int(counts[i]) for i in top},
            note=f"training thread {tid}; small = largest input of the op and its callees <= {SMALL_ELEMENTS} elements",
        ),
    )]  # fmt: skip


def optimizer_calls(ctx: RankContext) -> pd.DataFrame:
    """The 'Optimizer.step#<Class>.step' annotations that start in an analysed step."""
    ann = ctx.trace.annotations
    if not len(ann):
        return ann
    m = ann["name"].astype(str).str.match(OPTIMIZER_RE.pattern).to_numpy() & (ctx.step_of(ann["ts"].to_numpy()) >= 0)
    return ann[m]


def in_optimizer(ops: pd.DataFrame, calls: pd.DataFrame) -> np.ndarray:
    """Which ops start inside one of the optimizer calls, on the call's thread."""
    inside = np.zeros(len(ops), dtype=bool)
    if not len(ops) or not len(calls):
        return inside
    ots, otid = ops["ts"].to_numpy(), ops["tid"].to_numpy()
    for tid in np.unique(calls["tid"].to_numpy()):
        c = calls[calls["tid"].to_numpy() == tid].sort_values("ts")
        starts, ends = c["ts"].to_numpy(), c["end"].to_numpy()
        rows = np.flatnonzero(otid == tid)
        i = np.searchsorted(starts, ots[rows], side="right") - 1
        ok = i >= 0
        inside[rows[ok]] = ots[rows[ok]] < ends[i[ok]]
    return inside


def ops_in_optimizer(ctx: RankContext) -> np.ndarray:
    """in_optimizer for the rank's cpu ops, computed once per rank (ctx.shared) for this analyzer
    and the compute analyzer's class split."""
    got = ctx.shared.get("ops_in_optimizer")
    if got is None:
        got = ctx.shared["ops_in_optimizer"] = in_optimizer(ctx.trace.cpu_ops, optimizer_calls(ctx))
    return got


def _optimizer(ctx: RankContext) -> list[Fact]:
    tr = ctx.trace
    calls = optimizer_calls(ctx)
    if not len(calls):
        return []
    ops = tr.cpu_ops
    inside = ops_in_optimizer(ctx)
    op_names = ops["name"].to_numpy()[inside].astype(str) if inside.any() else np.array([], dtype=str)
    _register_optimizer(ctx, calls)
    impl = ("fused" if any("_fused_" in n for n in op_names)
            else "foreach" if any("_foreach_" in n for n in op_names) else "for_loop")  # fmt: skip
    top_level = int((inside & (ops["depth"].to_numpy() == 0)).sum()) if len(ops) else 0
    window = ctx.windows_us
    dur = float(calls["dur"].sum())
    cls = OPTIMIZER_RE.match(str(calls["name"].iloc[0]))
    longest = np.argsort(-calls["dur"].to_numpy())[:3]
    device = _device_busy(ctx)
    idle = None
    if device is not None:
        idle = iv.length(iv.subtract(iv.union(calls["ts"].to_numpy(float), calls["end"].to_numpy(float)), device))
    return [OptimizerStep(
        rank=tr.rank, optimizer=cls.group(1) if cls else "unknown", implementation=impl,
        steps_count=len(ctx.windows), window_us=window, calls_count=len(calls), optimizer_us=dur,
        optimizer_ratio=div(dur, window), ops_per_call=top_level / len(calls),
        device_idle_us=idle, device_idle_ratio=div(idle, window) if idle is not None else None,
        evidence=Evidence(
            time_ranges_us=[(float(calls["ts"].iloc[i]), float(calls["end"].iloc[i])) for i in longest],
            events=[str(calls["name"].iloc[0])], counts={str(calls["name"].iloc[0]): len(calls)},
        ),
    )]  # fmt: skip


def _register_optimizer(ctx: RankContext, calls: pd.DataFrame) -> None:
    """The optimizer steps' host time and the device work launched inside them."""
    kern, mcpy = _device_inside(ctx, calls)
    register(ctx, WhatIfSet(
        "optimizer", "the optimizer steps on the host and the device work they launch",
        calls["tid"].to_numpy(np.int64), calls["ts"].to_numpy(float), calls["end"].to_numpy(float), kern, mcpy))


def _device_busy(ctx: RankContext) -> iv.Intervals | None:
    """Union of the rank's kernels and copies (None on a CPU-only rank)."""
    got = ctx.shared.get("dispatch_device_busy", False)
    if got is not False:
        return got
    tr = ctx.trace
    parts = [fr for fr in (tr.kernels, tr.memcpy) if len(fr)]
    got = iv.union(np.concatenate([f["ts"].to_numpy() for f in parts]),
                   np.concatenate([f["end"].to_numpy() for f in parts])) if parts else None  # fmt: skip
    ctx.shared["dispatch_device_busy"] = got
    return got


def _device_inside(ctx: RankContext, calls: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Rows of trace.kernels and trace.memcpy launched by runtime calls made inside the given host
    intervals (ts, end, tid columns), on the same thread."""
    tr = ctx.trace
    lk = tr.links
    if not len(lk) or not len(tr.runtime) or not len(calls):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    rt = tr.runtime
    ri = lk["runtime_idx"].to_numpy(np.int64)
    ok = (ri >= 0) & (ri < len(rt))
    inside = np.zeros(len(lk), dtype=bool)
    rts, rtid = rt["ts"].to_numpy()[ri[ok]], rt["tid"].to_numpy()[ri[ok]]
    for t in np.unique(calls["tid"].to_numpy()):
        c = calls[calls["tid"].to_numpy() == t].sort_values("ts")
        i = np.searchsorted(c["ts"].to_numpy(), rts, side="right") - 1
        hit = (i >= 0) & (rtid == t)
        hit[hit] = rts[hit] < c["end"].to_numpy()[i[hit]]
        inside[np.flatnonzero(ok)[hit]] = True
    kind, gi = lk["gpu_kind"].to_numpy(), lk["gpu_idx"].to_numpy(np.int64)
    return gi[inside & (kind == "kernel")], gi[inside & (kind == "memcpy")]


def _zero_grad(ctx: RankContext) -> list[Fact]:
    """optimizer.zero_grad(): time, and whether it writes zeros into the gradients."""
    tr = ctx.trace
    ann = tr.annotations
    if not len(ann):
        return []
    m = ann["name"].astype(str).str.match(ZERO_GRAD_RE.pattern).to_numpy() & (ctx.step_of(ann["ts"].to_numpy()) >= 0)
    calls = ann[m]
    if not len(calls):
        return []
    ops = tr.cpu_ops
    inside = in_optimizer(ops, calls)
    names = ops["name"].astype(str).to_numpy() if len(ops) else np.zeros(0, dtype=str)
    fill = inside & (ops["depth"].to_numpy() == 0) & np.isin(names, FILL_OPS) if len(ops) else inside
    acc = 0
    if len(ops):
        par = ops["parent"].to_numpy()
        add = (names == "aten::add_") & (par >= 0)
        add[add] = (names[par[add]] == "torch::autograd::AccumulateGrad") & (ctx.step_of(ops["ts"].to_numpy()[add]) >= 0)
        acc = len(np.unique(par[add]))
    kern, mcpy = _device_inside(ctx, calls)
    register(ctx, WhatIfSet(
        "zero_grad", "optimizer.zero_grad() on the host and the fills it launches", calls["tid"].to_numpy(np.int64),
        calls["ts"].to_numpy(float), calls["end"].to_numpy(float), kern, mcpy))  # fmt: skip
    window = ctx.windows_us
    dur = float(calls["dur"].sum())
    cls = ZERO_GRAD_RE.match(str(calls["name"].iloc[0]))
    longest = np.argsort(-calls["dur"].to_numpy())[:3]
    n_fill = int(fill.sum())
    return [ZeroGrad(
        rank=tr.rank, optimizer=cls.group(1) if cls else "unknown", steps_count=len(ctx.windows), window_us=window,
        calls_count=len(calls), zero_grad_us=dur, zero_grad_ratio=div(dur, window), fill_ops_count=n_fill,
        fills_gradients=n_fill > 0, device_work_count=len(kern) + len(mcpy), accumulate_add_count=acc,
        evidence=Evidence(
            time_ranges_us=[(float(calls["ts"].iloc[i]), float(calls["end"].iloc[i])) for i in longest],
            events=[str(calls["name"].iloc[0])] + sorted(set(names[fill].tolist())),
            counts={str(calls["name"].iloc[0]): len(calls), "fill_ops": n_fill},
        ),
    )]  # fmt: skip


def per_rank(ctx: RankContext) -> list[Fact]:
    if not ctx.windows:
        return []
    return (_dispatch(ctx) + _optimizer(ctx) + _zero_grad(ctx) + ddp_buffer_broadcast(ctx) + data_parallel(ctx)
            + sync_batchnorm(ctx))  # fmt: skip
