"""dispatch analyzer: per-call costs - operators too small to be worth dispatching, and optimizers
that update parameters one tensor at a time.

Facts (hermes_kb/facts/cpu.py; formulas in docs/analysis/cpu.md):

* ``operator_dispatch`` (rank-level): top-level operators on the training thread whose largest
  input, in them or in anything they call, has at most ``SMALL_ELEMENTS`` elements; their time
  plus the host time between consecutive ones (each gap up to ``GAP_CAP_US``). A Python loop over
  tiny tensors shows as hundreds of such operators per step, one after another.
* ``optimizer_step`` (rank-level): time inside 'Optimizer.step#<Class>.step' annotations, and
  whether the update ran fused, multi-tensor (foreach) or as a per-parameter loop.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.cpu import OperatorDispatch, OptimizerStep

from .context import RankContext
from .io import div, main_tid
from .whatif_sets import WhatIfSet, register

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


def largest_input(dims_text: str) -> int:
    """Element count of the largest tensor argument in a Kineto 'Input Dims' value; -1 when the
    value records no tensor shape."""
    try:
        dims = json.loads(dims_text) if dims_text else None
    except (TypeError, ValueError):
        return -1
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
    sel = np.flatnonzero((ops["depth"].to_numpy() == 0) & (ops["tid"].to_numpy() == tid) & (st >= 0))
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
    return [OptimizerStep(
        rank=tr.rank, optimizer=cls.group(1) if cls else "unknown", implementation=impl,
        steps_count=len(ctx.windows), window_us=window, calls_count=len(calls), optimizer_us=dur,
        optimizer_ratio=div(dur, window), ops_per_call=top_level / len(calls),
        evidence=Evidence(
            time_ranges_us=[(float(calls["ts"].iloc[i]), float(calls["end"].iloc[i])) for i in longest],
            events=[str(calls["name"].iloc[0])], counts={str(calls["name"].iloc[0]): len(calls)},
        ),
    )]  # fmt: skip


def _register_optimizer(ctx: RankContext, calls: pd.DataFrame) -> None:
    """The optimizer steps' host time and the device work launched inside them."""
    tr = ctx.trace
    kern = np.zeros(0, np.int64)
    mcpy = np.zeros(0, np.int64)
    lk = tr.links
    if len(lk) and len(tr.runtime):
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
        kern = gi[inside & (kind == "kernel")]
        mcpy = gi[inside & (kind == "memcpy")]
    register(ctx, WhatIfSet(
        "optimizer", "the optimizer steps on the host and the device work they launch",
        calls["tid"].to_numpy(np.int64), calls["ts"].to_numpy(float), calls["end"].to_numpy(float), kern, mcpy))


def per_rank(ctx: RankContext) -> list[Fact]:
    if not ctx.windows:
        return []
    return _dispatch(ctx) + _optimizer(ctx)
