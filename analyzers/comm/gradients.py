"""What the gradient-bucket search (buckets.py) reads of a rank's trace:

1. its gradient collectives: all_reduce / reduce_scatter kernels whose issuing host operation
   (the ``record_param_comms`` op, else the launch call) lies inside a backward operator
   (``autograd::engine::evaluate_function: ...``);
2. its gradients: one per ``AccumulateGrad`` of a step, ready on the host at the end of its
   inner ``torch::autograd::AccumulateGrad`` op, with its bytes from the recorded shape and
   element type;
3. the device drain D(h), the latest end of the non-communication device work launched at or
   before host time h, and the end of each step's last backward operator.

Model and assumptions: docs/analysis/buckets.md."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from hermes_kb.core.dtypes import element_bytes
from hermes_kb.trace.args import decode, first_shape

from ..context import RankContext
from ..selection import name_mask
from .collectives import issue_time

BACKWARD_PREFIX = "autograd::engine::evaluate_function:"
_BACKWARD_RE = re.compile("^" + re.escape(BACKWARD_PREFIX))
ACCUMULATE_TOP = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
ACCUMULATE_INNER = "torch::autograd::AccumulateGrad"
GRAD_KINDS = ("all_reduce", "reduce_scatter")


def _top_ops(ctx: RankContext) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per thread, its top-level CPU ops sorted by start: (start, end, row index)."""
    cached = ctx.shared.get("buckets_top_ops")
    if cached is not None:
        return cached
    ops = ctx.trace.cpu_ops
    top = ops[ops["depth"].to_numpy() == 0]
    out = {}
    for tid, g in top.groupby("tid", sort=False):
        g = g.sort_values("ts")
        out[int(tid)] = (g["ts"].to_numpy(float), g["end"].to_numpy(float), g.index.to_numpy(np.int64))
    ctx.shared["buckets_top_ops"] = out
    return out


def _enclosing_top(ctx: RankContext, tids: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Row index of the top-level op on thread ``tids[i]`` that encloses ``ts[i]`` (-1 when none)."""
    tops = _top_ops(ctx)
    out = np.full(len(ts), -1, dtype=np.int64)
    for i, (tid, t) in enumerate(zip(tids, ts)):
        arr = tops.get(int(tid))
        if arr is None:
            continue
        s, e, idx = arr
        k = int(np.searchsorted(s, t, side="right")) - 1
        if k >= 0 and e[k] >= t:
            out[i] = idx[k]
    return out


def _launches(ctx: RankContext, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per link of device activities of ``kind`` (kernel / memcpy): (row in that frame, launch
    time, launch thread, External id). Times come from the runtime frame (on the bundle's clock),
    not from the links' own copy of them."""
    links = ctx.trace.links
    rt = ctx.trace.runtime
    if not len(links) or not len(rt):
        z = np.zeros(0, dtype=np.int64)
        return z, np.zeros(0), z, z
    lk = links[links["gpu_kind"].astype(str).to_numpy() == kind]
    ri = lk["runtime_idx"].to_numpy(np.int64)
    ok = (ri >= 0) & (ri < len(rt))
    ri = ri[ok]
    return (lk["gpu_idx"].to_numpy(np.int64)[ok], rt["ts"].to_numpy(float)[ri], rt["tid"].to_numpy(np.int64)[ri],
            lk["ext_id"].to_numpy(np.int64)[ok])  # fmt: skip


def _issue_points(ctx: RankContext, c: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(thread, time) where each collective was issued: its record_param_comms op; else the CPU op
    whose External id its kernel's link names (torch_npu launches from a task-queue thread, the
    op that issued the work keeps the id); else the launch call of its kernel; thread -1 when none
    is known."""
    t = ctx.trace
    ops = t.cpu_ops
    tid = np.full(len(c), -1, dtype=np.int64)
    ts = np.full(len(c), np.nan)
    cidx = c["cpu_idx"].to_numpy(np.int64)
    ok = (cidx >= 0) & (cidx < len(ops))
    tid[ok] = ops["tid"].to_numpy(np.int64)[cidx[ok]]
    ts[ok] = ops["ts"].to_numpy(float)[cidx[ok]]
    gidx, lts, ltid, ext = _launches(ctx, "kernel")
    if len(gidx) and (~ok).any():
        kidx = c["kernel_idx"].to_numpy(np.int64)
        by_idx = {int(g): i for i, g in enumerate(gidx)}
        first_op = ops[ops["ext_id"].to_numpy() >= 0].drop_duplicates("ext_id")
        op_of = dict(zip(first_op["ext_id"].to_numpy(np.int64), first_op.index.to_numpy(np.int64)))
        otid, ots = ops["tid"].to_numpy(np.int64), ops["ts"].to_numpy(float)
        for i in np.flatnonzero(~ok):
            j = by_idx.get(int(kidx[i]))
            if j is None:
                continue
            row = op_of.get(int(ext[j])) if ext[j] >= 0 else None
            if row is not None and otid[row] != ltid[j]:
                tid[i], ts[i] = otid[row], ots[row]
            else:
                tid[i], ts[i] = ltid[j], lts[j]
    return tid, ts


def gradient_collectives(ctx: RankContext) -> pd.DataFrame:
    """The rank's gradient collectives in the analysed steps: all_reduce / reduce_scatter kernels
    issued inside a backward operator. Columns: step, issue (host time), ts, end, dur, bytes (-1
    unknown), pg, kind, name."""
    t = ctx.trace
    c = t.collectives
    cols = ["step", "issue", "ts", "end", "dur", "bytes", "pg", "kind", "name"]
    if not len(c):
        return pd.DataFrame({k: [] for k in cols})
    kind = c["kind"].astype(str).to_numpy()
    keep = (np.isin(kind, GRAD_KINDS) & (c["source"].astype(str).to_numpy() == "kernel")
            & (c["collective"].astype(str).to_numpy() != "wait"))  # fmt: skip
    if not keep.any():
        return pd.DataFrame({k: [] for k in cols})
    anchor = issue_time(ctx)
    step = ctx.step_of(anchor)
    keep &= step >= 0
    sel = c[keep]
    if not len(sel):
        return pd.DataFrame({k: [] for k in cols})
    tid, its = _issue_points(ctx, sel)
    top = _enclosing_top(ctx, tid, its)
    names = t.cpu_ops["name"].astype(str).to_numpy()
    backward = np.array([i >= 0 and names[i].startswith(BACKWARD_PREFIX) for i in top], dtype=bool)
    sel = sel[backward]
    if not len(sel):
        return pd.DataFrame({k: [] for k in cols})
    pg = sel["pg_name"].astype(str).to_numpy()
    out = pd.DataFrame({
        "step": step[keep][backward],
        "issue": its[backward],
        "ts": sel["ts"].to_numpy(float),
        "end": sel["end"].to_numpy(float),
        "dur": sel["dur"].to_numpy(float),
        "bytes": np.maximum(sel["in_bytes"].to_numpy(np.int64), sel["out_bytes"].to_numpy(np.int64)),
        "pg": np.where(pg != "", pg, "unknown"),
        "kind": sel["kind"].astype(str).to_numpy(),
        "name": sel["name"].astype(str).to_numpy(),
    })  # fmt: skip
    return out.sort_values("issue", kind="stable").reset_index(drop=True)


def device_drain(ctx: RankContext):
    """D(h): the latest end of the non-communication device work (kernels, memcpy/memset) launched
    at or before host time h (work without a launch link counts from its own start)."""
    t = ctx.trace
    k = t.kernels
    comm = t.collectives["kernel_idx"].to_numpy(np.int64) if len(t.collectives) else np.zeros(0, np.int64)
    mask = np.ones(len(k), dtype=bool)
    comm = comm[(comm >= 0) & (comm < len(k))]
    mask[comm] = False
    parts_l, parts_e = [], []
    for frame, kind, m in ((k, "kernel", mask), (t.memcpy, "memcpy", np.ones(len(t.memcpy), dtype=bool))):
        if not len(frame):
            continue
        launch = frame["ts"].to_numpy(float).copy()
        gi, lts, _, _ = _launches(ctx, kind)
        ok = (gi >= 0) & (gi < len(frame))
        launch[gi[ok]] = np.minimum(lts[ok], launch[gi[ok]])
        parts_l.append(launch[m])
        parts_e.append(frame["end"].to_numpy(float)[m])
    if not parts_l:
        return None
    launch = np.concatenate(parts_l)
    end = np.concatenate(parts_e)
    order = np.argsort(launch, kind="stable")
    launch, cm = launch[order], np.maximum.accumulate(end[order])

    def drain(h: np.ndarray) -> np.ndarray:
        i = np.searchsorted(launch, np.asarray(h, dtype=float), side="right") - 1
        return np.where(i >= 0, cm[np.clip(i, 0, None)], -np.inf)

    return drain


def _first_shape_numel(text: str) -> int:
    shape = first_shape(text)
    if shape is None:
        return -1
    n = 1
    for d in shape:
        if not isinstance(d, int) or d < 0:
            return -1
        n *= d
    return n


def _first_type_bytes(text: str) -> int:
    """Element size of the first input's type (the op's ``Input type``, or a
    record_param_comms dtype), -1 when unknown."""
    v = decode(text)
    if not isinstance(v, list) or not v or not isinstance(v[0], str):
        return -1
    size = element_bytes(v[0])
    return size if size is not None else -1


def gradients(ctx: RankContext) -> pd.DataFrame:
    """One row per AccumulateGrad in the analysed steps: step, h (host time the gradient is in
    place), bytes (-1 unknown)."""
    ops = ctx.trace.cpu_ops
    names = ops["name"].astype(str)
    top = ops[(names == ACCUMULATE_TOP).to_numpy() & (ops["depth"].to_numpy() == 0)]
    if not len(top):
        return pd.DataFrame({"step": [], "h": [], "bytes": []})
    inner = ops[(names == ACCUMULATE_INNER).to_numpy()]
    inner = inner[inner["parent"].isin(top.index)].drop_duplicates("parent").set_index("parent")
    h = top["ts"].to_numpy(float).copy()
    nbytes = np.full(len(top), -1, dtype=np.int64)
    pos = {p: i for i, p in enumerate(top.index)}
    if len(inner):
        rows = np.array([pos[p] for p in inner.index], dtype=np.int64)
        h[rows] = inner["end"].to_numpy(float)
        numel = np.array([_first_shape_numel(s) for s in inner["input_dims"].astype(str)], dtype=np.int64)
        esize = np.array([_first_type_bytes(s) for s in inner["input_types"].astype(str)], dtype=np.int64)
        nbytes[rows] = np.where((numel >= 0) & (esize > 0), numel * esize, np.where(numel >= 0, -2 - numel, -1))
    out = pd.DataFrame({"step": ctx.step_of(top["ts"].to_numpy(float)), "h": h, "bytes": nbytes})
    return out[out["step"] >= 0].sort_values("h", kind="stable").reset_index(drop=True)


def backward_ends(ctx: RankContext) -> dict[int, float]:
    """Per analysed step, the end of its last backward operator on the host."""
    ops = ctx.trace.cpu_ops
    top = ops[ops["depth"].to_numpy() == 0]
    top = top[name_mask(top["name"], _BACKWARD_RE)]
    if not len(top):
        return {}
    st = ctx.step_of(top["ts"].to_numpy(float))
    df = pd.DataFrame({"step": st, "end": top["end"].to_numpy(float)})
    df = df[df["step"] >= 0]
    return {int(k): float(v) for k, v in df.groupby("step")["end"].max().items()}


__all__ = ["ACCUMULATE_INNER", "ACCUMULATE_TOP", "BACKWARD_PREFIX", "GRAD_KINDS", "backward_ends",
           "device_drain", "gradient_collectives", "gradients"]  # fmt: skip
