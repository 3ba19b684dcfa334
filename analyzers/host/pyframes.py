"""pyframes analyzer: Python code in the training step that costs host time for no training work.

Facts (hermes_kb/facts/cpu.py; formulas in docs/analysis/cpu.md, section 8):

* ``autograd_anomaly``: autograd anomaly detection at work - the NaN check the engine runs after
  every backward node (aten::isnan / _is_any_true / item children of
  'autograd::engine::evaluate_function: ...') and the Python stack each forward operator captures
  for its node (torch/fx/traceback.py format_stack frames inside an operator);
* ``tensor_formatting``: tensors turned into text (Tensor.__repr__ / __str__ / __format__,
  torch/_tensor_str.py) by print, f-strings and log messages;
* ``module_hooks``: hook functions nn.Module's call wrapper runs besides forward(), the
  torch/utils/hooks.py machinery of full backward hooks and its BackwardHookFunction nodes;
* ``object_construction``: nn.Module / Optimizer constructors run in the step on the training
  thread (outside the DataLoader);
* ``gc_collect_calls``: explicit gc.collect() calls;
* ``state_copies``: copy.deepcopy / state_dict() of the model or optimizer in the step.

All but the first need Python stacks (with_stack=True); without them no fact is emitted (nothing
is guessed). Each fact registers the host time it measures as a what-if set of the same name
(``anomaly``, ``tensor_format``, ``module_hooks``, ``construction``, ``gc_collect``, ``state_copy``).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.cpu import (
    AutogradAnomaly,
    GcCollectCalls,
    ModuleHooks,
    ObjectConstruction,
    StateCopies,
    TensorFormatting,
)

from .. import intervals as iv
from ..context import RankContext
from ..selection import div, host_tids, main_tid, name_mask, on_tids, outermost_frames, python_stacks
from ..whatif.sets import WhatIfSet, register
from .dispatch import TENSOR_STR_RE
from .gc_pauses import GC_COLLECT_RE
from .syncs import blocked_union

EVALUATE_RE = re.compile(r"^autograd::engine::evaluate_function: ")
NAN_CHECK_OPS = frozenset({"aten::isnan", "aten::_is_any_true", "aten::any", "aten::item", "aten::_local_scalar_dense"})
STACK_CAPTURE_RE = re.compile(r"^torch/fx/traceback\.py\(\d+\): format_stack$|^torch/autograd/anomaly_mode\.py\(\d+\): ")
ITEM_OPS = ("aten::item", "aten::_local_scalar_dense")
CALL_WRAPPER_RE = re.compile(r"^torch/nn/modules/module\.py\(\d+\): (_call_impl|inner)$")
# children of the call wrapper that are not hooks: the module's forward, torch's own code (its
# wrappers, FSDP / quantization hooks, Dynamo), C built-ins and the profiler's module scopes
NOT_HOOK_RE = re.compile(r": forward$|^torch/|^<built-in|^nn\.Module: |^<")
HOOKS_MACHINERY_RE = re.compile(r"^torch/utils/hooks\.py\(\d+\): ")
HOOK_PATH_RE = re.compile(r"^torch/nn/modules/module\.py\(\d+\): inner$")
FORWARD_RE = re.compile(r": forward$")
HOOK_OPS = ("BackwardHookFunction", "BackwardHookFunctionBackward",
            "autograd::engine::evaluate_function: BackwardHookFunctionBackward")
MODULE_INIT_RE = re.compile(r"^torch/nn/modules/module\.py\(\d+\): __init__$")
OPTIMIZER_INIT_RE = re.compile(r"^torch/optim/optimizer\.py\(\d+\): __init__$")
INIT_RE = re.compile(r": __init__$")
DEEPCOPY_RE = re.compile(r"^copy\.py\(\d+\): deepcopy$")
STATE_DICT_RE = re.compile(r"^torch/nn/modules/module\.py\(\d+\): (load_)?state_dict$"
                           r"|^torch/optim/optimizer\.py\(\d+\): (load_)?state_dict$")
CLONE_OPS = ("aten::clone", "aten::copy_")
TOP = 5


def _in_steps(ctx: RankContext, ts: np.ndarray) -> np.ndarray:
    return ctx.step_of(ts) >= 0


def _blocks(tid: np.ndarray, ts: np.ndarray, end: np.ndarray) -> tuple[iv.Intervals, int, list[tuple[np.ndarray, ...]]]:
    """Union over all threads, number of disjoint per-thread blocks (outermost calls), and the
    per-thread unions (tid, starts, ends) for the what-if set."""
    per: list[tuple[np.ndarray, ...]] = []
    n = 0
    for t in np.unique(tid):
        m = tid == t
        s, e = iv.union(ts[m], end[m])
        n += len(s)
        per.append((np.full(len(s), t, dtype=np.int64), s, e))
    return iv.union(ts, end), n, per


def _register(ctx: RankContext, name: str, what: str, per: list[tuple[np.ndarray, ...]]) -> None:
    if per:
        register(ctx, WhatIfSet.of_intervals(name, what, np.concatenate([p[0] for p in per]),
                                             np.concatenate([p[1] for p in per]), np.concatenate([p[2] for p in per])))  # fmt: skip


def _ranges(u: iv.Intervals, n: int = 3) -> list[tuple[float, float]]:
    order = np.argsort(-(u[1] - u[0]))[:n]
    return [(float(u[0][i]), float(u[1][i])) for i in order]


def _top_names(names: np.ndarray, dur: np.ndarray) -> dict[str, int]:
    if not len(names):
        return {}
    s = pd.Series(dur).groupby(pd.Series(names.astype(str))).agg(["size", "sum"]).sort_values("sum", ascending=False)
    return {str(k): int(v) for k, v in s["size"].head(TOP).items()}


# ---------------------------------------------------------------- anomaly detection


def _anomaly(ctx: RankContext, tids: np.ndarray, stacks: bool) -> list[Fact]:
    tr = ctx.trace
    ops = tr.cpu_ops
    parts_t, parts_s, parts_e = [], [], []
    n_checks = 0
    check_us = 0.0
    if len(ops):
        names = ops["name"].astype(str).to_numpy()
        parent = ops["parent"].to_numpy()
        ev = name_mask(ops["name"], EVALUATE_RE)
        has_p = parent >= 0
        under_ev = np.zeros(len(ops), dtype=bool)
        under_ev[has_p] = ev[parent[has_p]]
        isnan = under_ev & (names == "aten::isnan") & _in_steps(ctx, ops["ts"].to_numpy())
        checked = np.unique(parent[isnan])
        # the check operators of the nodes that ran a NaN check
        chk = under_ev & np.isin(names, list(NAN_CHECK_OPS))
        chk[chk] = np.isin(parent[chk], checked)
        n_checks = len(checked)
        if chk.any():
            t, s, e = (ops[c].to_numpy()[chk] for c in ("tid", "ts", "end"))
            check_us = iv.length(iv.union(s, e))
            parts_t.append(t.astype(np.int64))
            parts_s.append(s)
            parts_e.append(e)
    n_cap, cap_us = 0, 0.0
    py = tr.python
    if stacks and len(py):
        m = name_mask(py["name"], STACK_CAPTURE_RE) & _in_steps(ctx, py["ts"].to_numpy())
        if m.any():
            t, s, e = (py[c].to_numpy()[m] for c in ("tid", "ts", "end"))
            u, n_cap, _ = _blocks(t.astype(np.int64), s, e)
            cap_us = iv.length(u)
            parts_t.append(t.astype(np.int64))
            parts_s.append(s)
            parts_e.append(e)
    if not n_checks and not n_cap:
        return []
    t, s, e = np.concatenate(parts_t), np.concatenate(parts_s), np.concatenate(parts_e)
    u, _, per = _blocks(t, s, e)
    _register(ctx, "anomaly", "autograd anomaly detection: NaN checks after backward nodes, stack captures in forward operators", per)
    total = iv.length(u)
    window = ctx.windows_us
    return [AutogradAnomaly(
        rank=tr.rank, steps_count=len(ctx.windows), window_us=window, nan_checks_count=n_checks, nan_check_us=check_us,
        stack_captures_count=n_cap, stack_capture_us=cap_us, anomaly_us=total, anomaly_ratio=div(total, window),
        stacks_recorded=stacks,
        evidence=Evidence(time_ranges_us=_ranges(u), events=["aten::isnan", "torch/fx/traceback.py format_stack"],
                          counts={"nan_checks": n_checks, "stack_captures": n_cap},
                          note="NaN checks: aten::isnan / _is_any_true / item children of autograd::engine::evaluate_function "
                               "nodes; stack captures: torch/fx/traceback.py format_stack frames (anomaly metadata)"),
    )]  # fmt: skip


# ---------------------------------------------------------------- tensors printed to text


def _formatting(ctx: RankContext, tids: np.ndarray) -> list[Fact]:
    tr = ctx.trace
    py = tr.python
    m = name_mask(py["name"], TENSOR_STR_RE) & _in_steps(ctx, py["ts"].to_numpy()) & on_tids(py, tids)
    if not m.any():
        return []
    t, s, e = (py[c].to_numpy()[m] for c in ("tid", "ts", "end"))
    u, n, per = _blocks(t.astype(np.int64), s, e)
    # a read-back inside waits for the device: that wait is the synchronisation's (host_sync), not
    # the printing's, and it does not go away with the printing when anything else reads back later
    waits = blocked_union(tr, tids)
    ops = tr.cpu_ops
    if len(tr.kernels) and len(ops):
        # on a device rank every read-back (item / _local_scalar_dense) waits for the queued device
        # work, and traces without runtime sync events (Ascend level 0) show the wait only as the
        # operator: left out whole, which also leaves out the per-element copies (a low estimate)
        rb = ops["name"].isin(ITEM_OPS).to_numpy() & on_tids(ops, tids)
        if rb.any():
            waits = iv.union(np.concatenate([waits[0], ops["ts"].to_numpy(float)[rb]]),
                             np.concatenate([waits[1], ops["end"].to_numpy(float)[rb]]))
    blocked = iv.intersect(u, waits)
    kept = []
    for pt, ps, pe in per:
        x = iv.subtract((ps, pe), blocked)
        if len(x[0]):
            kept.append((np.full(len(x[0]), pt[0], dtype=np.int64), x[0], x[1]))
    per = kept
    _register(ctx, "tensor_format", "tensors printed to text (Tensor.__repr__ / __format__, torch/_tensor_str.py)", per)
    blocked_us = iv.length(blocked)
    items = 0
    if len(ops):
        om = ops["name"].isin(ITEM_OPS).to_numpy() & on_tids(ops, tids)
        par = ops["parent"].to_numpy()
        inner = om & (par >= 0)
        inner[inner] = om[par[inner]]  # _local_scalar_dense under aten::item: one read
        om &= ~inner
        items = int(iv.covered_by(ops["ts"].to_numpy()[om], u).sum()) if om.any() else 0
    total = iv.length(u) - blocked_us
    window = ctx.windows_us
    steps = max(len(ctx.windows), 1)
    names = py["name"].to_numpy()[m]
    return [TensorFormatting(
        rank=tr.rank, steps_count=len(ctx.windows), window_us=window, calls_count=n, calls_per_step=n / steps,
        format_us=total, format_ratio=div(total, window), blocking_us=blocked_us, item_calls_count=items,
        evidence=Evidence(time_ranges_us=_ranges(u), events=list(_top_names(names, e - s)),
                          counts=_top_names(names, e - s), note="outermost tensor-printing frames on the host threads"),
    )]  # fmt: skip


# ---------------------------------------------------------------- module hooks


def _hooks(ctx: RankContext, tids: np.ndarray, stacks: bool) -> list[Fact]:
    tr = ctx.trace
    py, ops = tr.python, tr.cpu_ops
    parts_t, parts_s, parts_e = [], [], []
    n_calls = 0
    hook_names = np.zeros(0, dtype=object)
    hook_dur = np.zeros(0)
    if stacks and len(py):
        in_steps = _in_steps(ctx, py["ts"].to_numpy()) & on_tids(py, tids)
        wrapper = name_mask(py["name"], CALL_WRAPPER_RE)
        pid = pd.Series(np.arange(len(py)), index=py["py_id"].to_numpy())
        pid = pid[~pid.index.duplicated(keep="first")]
        prow = pd.Series(py["parent_id"].to_numpy()).map(pid).fillna(-1).to_numpy(np.int64)
        own = prow != np.arange(len(py))  # a root frame may name itself as its parent
        child_of_wrapper = (prow >= 0) & own
        child_of_wrapper[child_of_wrapper] = wrapper[prow[child_of_wrapper]]
        hook = child_of_wrapper & ~name_mask(py["name"], NOT_HOOK_RE) & in_steps
        machinery = name_mask(py["name"], HOOKS_MACHINERY_RE) & in_steps
        n_calls = int(hook.sum())
        sel = hook | machinery
        if sel.any():
            parts_t.append(py["tid"].to_numpy()[sel].astype(np.int64))
            parts_s.append(py["ts"].to_numpy()[sel])
            parts_e.append(py["end"].to_numpy()[sel])
        # the wrapper's hook path (module.py `inner`, taken only when the module has hooks):
        # everything in it but the module's own forward()
        inner = name_mask(py["name"], HOOK_PATH_RE) & in_steps
        if inner.any():
            fwd = (prow >= 0) & own & name_mask(py["name"], FORWARD_RE)
            fwd[fwd] = inner[prow[fwd]]
            for t in np.unique(py["tid"].to_numpy()[inner]):
                on_t = py["tid"].to_numpy() == t
                w = iv.subtract(iv.union(py["ts"].to_numpy()[inner & on_t], py["end"].to_numpy()[inner & on_t]),
                                iv.union(py["ts"].to_numpy()[fwd & on_t], py["end"].to_numpy()[fwd & on_t]))  # fmt: skip
                parts_t.append(np.full(len(w[0]), t, dtype=np.int64))
                parts_s.append(w[0])
                parts_e.append(w[1])
        hook_names = py["name"].to_numpy()[hook]
        hook_dur = (py["end"] - py["ts"]).to_numpy()[hook]
    n_nodes = 0
    if len(ops):
        om = ops["name"].isin(HOOK_OPS).to_numpy() & _in_steps(ctx, ops["ts"].to_numpy())
        n_nodes = int((ops["name"].isin(HOOK_OPS[:2]).to_numpy() & om).sum())
        if om.any():
            parts_t.append(ops["tid"].to_numpy()[om].astype(np.int64))
            parts_s.append(ops["ts"].to_numpy()[om])
            parts_e.append(ops["end"].to_numpy()[om])
    if not parts_t or not sum(len(x) for x in parts_t):
        return []  # no hook frame, no hook path, no hook node
    u, _, per = _blocks(np.concatenate(parts_t), np.concatenate(parts_s), np.concatenate(parts_e))
    _register(ctx, "module_hooks", "module forward / backward hooks and the autograd nodes of full backward hooks", per)
    total = iv.length(u)
    window = ctx.windows_us
    steps = max(len(ctx.windows), 1)
    top = _top_names(hook_names, hook_dur)
    return [ModuleHooks(
        rank=tr.rank, steps_count=len(ctx.windows), window_us=window, hook_calls_count=n_calls,
        hook_calls_per_step=n_calls / steps, backward_hook_nodes_count=n_nodes, hook_us=total,
        hook_ratio=div(total, window),
        evidence=Evidence(time_ranges_us=_ranges(u), events=list(top) + ([HOOK_OPS[1]] if n_nodes else []),
                          counts=top | ({"backward_hook_nodes": n_nodes} if n_nodes else {}),
                          note="hook frames: children of torch/nn/modules/module.py _call_impl / inner other than "
                               "forward() and torch's own code"),
    )]  # fmt: skip


# ---------------------------------------------------------------- objects built in the step


def _construction(ctx: RankContext) -> list[Fact]:
    tr = ctx.trace
    py = tr.python
    tid = main_tid(tr)
    if tid is None or not len(py):
        return []
    base_mod = name_mask(py["name"], MODULE_INIT_RE)
    base_opt = name_mask(py["name"], OPTIMIZER_INIT_RE)
    ok = _in_steps(ctx, py["ts"].to_numpy()) & (py["tid"].to_numpy() == tid)
    ann = tr.annotations
    if len(ann):
        dl = ann[(ann["kind"] == "dataloader").to_numpy()]
        if len(dl):
            ok &= ~iv.covered_by(py["ts"].to_numpy(), iv.union(dl["ts"].to_numpy(), dl["end"].to_numpy()))
    base = (base_mod | base_opt) & ok
    if not base.any():
        return []
    pid = pd.Series(np.arange(len(py)), index=py["py_id"].to_numpy())
    pid = pid[~pid.index.duplicated(keep="first")]
    prow = pd.Series(py["parent_id"].to_numpy()).map(pid).fillna(-1).to_numpy(np.int64)
    init = name_mask(py["name"], INIT_RE)
    # climb from each base constructor to the outermost constructor around it (a subclass's
    # __init__, the user module's __init__ that builds it)
    rows = np.flatnonzero(base)
    top = rows.copy()
    for _ in range(64):
        p = prow[top]
        up = (p >= 0) & (p != top)
        up[up] = init[p[up]]
        if not up.any():
            break
        top[up] = p[up]
    top = np.unique(top)
    s, e = py["ts"].to_numpy()[top], py["end"].to_numpy()[top]
    u = iv.union(s, e)
    register(ctx, WhatIfSet.of_intervals("construction", "nn.Module / Optimizer constructors run in the step", tid, u[0], u[1]))
    total = iv.length(u)
    window = ctx.windows_us
    steps = max(len(ctx.windows), 1)
    n_mod, n_opt = int((base_mod & ok).sum()), int((base_opt & ok).sum())
    names = py["name"].to_numpy()[top]
    return [ObjectConstruction(
        rank=tr.rank, steps_count=len(ctx.windows), window_us=window, modules_count=n_mod, optimizers_count=n_opt,
        constructions_per_step=(n_mod + n_opt) / steps, construction_us=total, construction_ratio=div(total, window),
        evidence=Evidence(time_ranges_us=_ranges(u), events=list(_top_names(names, e - s)),
                          counts=_top_names(names, e - s) | {"Module.__init__": n_mod, "Optimizer.__init__": n_opt},
                          note=f"training thread {tid}, outside the DataLoader; outermost constructor frames"),
    )]  # fmt: skip


# ---------------------------------------------------------------- model state copied in the step


def _state_copies(ctx: RankContext) -> list[Fact]:
    tr = ctx.trace
    py = tr.python
    tid = main_tid(tr)
    if tid is None:
        return []
    ok = _in_steps(ctx, py["ts"].to_numpy()) & (py["tid"].to_numpy() == tid)
    dc = name_mask(py["name"], DEEPCOPY_RE) & ok
    sd = name_mask(py["name"], STATE_DICT_RE) & ok
    if not (dc | sd).any():
        return []
    top = outermost_frames(py, dc | sd)
    s, e = py["ts"].to_numpy()[top], py["end"].to_numpy()[top]
    u = iv.union(s, e)
    register(ctx, WhatIfSet.of_intervals("state_copy", "model / optimizer state deep-copied in the step", tid, u[0], u[1]))
    ops = tr.cpu_ops
    clones = 0
    if len(ops):
        om = ops["name"].isin(CLONE_OPS).to_numpy() & (ops["tid"].to_numpy() == tid)
        par = ops["parent"].to_numpy()
        nested = om & (par >= 0)
        nested[nested] = om[par[nested]]  # a copy_ inside a clone is the same copy
        om &= ~nested
        clones = int(iv.covered_by(ops["ts"].to_numpy()[om], u).sum()) if om.any() else 0
    n_dc, n_sd = int(dc[top].sum()), int(sd[top].sum())
    total = iv.length(u)
    window = ctx.windows_us
    steps = max(len(ctx.windows), 1)
    return [StateCopies(
        rank=tr.rank, steps_count=len(ctx.windows), window_us=window, deepcopy_calls_count=n_dc,
        state_dict_calls_count=n_sd, clone_ops_count=clones, copies_per_step=(n_dc + n_sd) / steps, copy_us=total,
        copy_ratio=div(total, window),
        evidence=Evidence(time_ranges_us=_ranges(u), events=["copy.deepcopy", "state_dict"],
                          counts={"copy.deepcopy": n_dc, "state_dict": n_sd, "tensor_copies": clones},
                          note=f"training thread {tid}; outermost deepcopy / state_dict frames"),
    )]  # fmt: skip


# ---------------------------------------------------------------- explicit gc.collect()


def _gc_collect(ctx: RankContext, tids: np.ndarray) -> list[Fact]:
    tr = ctx.trace
    py = tr.python
    ts = py["ts"].to_numpy()
    m = name_mask(py["name"], GC_COLLECT_RE) & _in_steps(ctx, ts) & on_tids(py, tids)
    if not m.any():
        return []
    t, s, e = (py[c].to_numpy()[m] for c in ("tid", "ts", "end"))
    u, n, per = _blocks(t.astype(np.int64), s, e)
    _register(ctx, "gc_collect", "explicit gc.collect() calls", per)
    total = iv.length(u)
    window = ctx.windows_us
    steps = max(len(ctx.windows), 1)
    with_call = len(np.unique(ctx.step_of(s)))
    return [GcCollectCalls(
        rank=tr.rank, steps_count=len(ctx.windows), window_us=window, calls_count=n, calls_per_step=n / steps,
        steps_with_call_ratio=div(with_call, len(ctx.windows)), collect_us=total, longest_us=float((u[1] - u[0]).max()),
        collect_ratio=div(total, window),
        evidence=Evidence(time_ranges_us=_ranges(u), events=["gc.collect()"], counts={"gc.collect()": n}),
    )]  # fmt: skip


def per_rank(ctx: RankContext) -> list[Fact]:
    if not ctx.windows:
        return []
    tr = ctx.trace
    tids = host_tids(tr)
    stacks = python_stacks(tr)
    facts: list[Fact] = []
    facts.extend(_anomaly(ctx, tids, stacks))
    if stacks and len(tr.python):
        facts.extend(_formatting(ctx, tids))
        facts.extend(_construction(ctx))
        facts.extend(_gc_collect(ctx, tids))
        facts.extend(_state_copies(ctx))
    facts.extend(_hooks(ctx, tids, stacks))
    return facts
