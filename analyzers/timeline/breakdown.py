"""Step breakdown: each analysed step split into compute, exposed communication, exposed host work
(launch, dispatch, Python), data wait and idle (docs/analysis/breakdown.md).

The split is the paper's multi-component overlap, made exclusive so the parts add up to the step:

* compute: the device computes (kernels, device-to-device and device-to-host copies);
* communication: collectives run while the device computes nothing (exposed);
* while the device computes nothing, a host-to-device copy in flight (the input arriving) or
  the DataLoader's ``next()`` (its annotation) -> data; a launch, another runtime call or a sync after its device work ended
  (on any host thread) -> host_launch; a CPU operator -> host_dispatch; the driving thread
  between operators (Python, GC, I/O) -> host_python;
* idle: neither the device nor the host does anything traced.

On a CPU-only rank the CPU computes: its operators are compute, the time between them on the
driving thread is host_python, the DataLoader's ``next()`` is data, CPU collectives (gloo) are
communication.

The breakdown says where the time goes; the what-if replay (analyzers/whatif/replay.py) says what
shortening a part gives back, which is less wherever another part hides under it.
"""

from __future__ import annotations

import numpy as np

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.breakdown import COMPONENTS, TOP_COMPONENTS, StepBreakdown

from .. import intervals as iv
from ..context import RankContext
from .graph import COMM, CPU_OP, HOST_GAP, LAUNCH, RUNTIME, SYNC_WAIT, Graph

COMM_NAME = r"nccl|rccl|hcom|hccl"


def device_kind(ctx: RankContext) -> str:
    tr = ctx.trace
    if tr.meta.format == "ascend":
        return "npu"
    return "gpu" if (len(tr.kernels) or len(tr.memcpy)) else "cpu"


def device_sets(ctx: RankContext) -> tuple[iv.Intervals, iv.Intervals]:
    """(compute, communication) activity of the device as interval sets: collectives are the
    collectives frame's kernels or kernels named like NCCL/RCCL/HCCL ones; compute is every other
    kernel and every copy."""
    tr = ctx.trace
    k, mc = tr.kernels, tr.memcpy
    comm = np.zeros(len(k), dtype=bool)
    if len(k):
        coll = tr.collectives
        if len(coll):
            ki = coll.loc[coll["source"] == "kernel", "kernel_idx"].to_numpy(np.int64)
            comm[ki[(ki >= 0) & (ki < len(k))]] = True
        names = k["name"].astype("category")
        by_name = names.cat.categories.astype(str).str.contains(COMM_NAME, case=False, regex=True)
        comm |= np.append(np.asarray(by_name, dtype=bool), False)[names.cat.codes.to_numpy()]
    ts, end = k["ts"].to_numpy(float), k["end"].to_numpy(float)
    other = ~h2d_mask(ctx)
    compute = iv.union(np.concatenate([ts[~comm], mc["ts"].to_numpy(float)[other]]),
                       np.concatenate([end[~comm], mc["end"].to_numpy(float)[other]]))  # fmt: skip
    return compute, iv.union(ts[comm], end[comm])


def h2d_mask(ctx: RankContext) -> np.ndarray:
    """Host-to-device copies among the rank's memcpy rows: the batch (or whatever the host hands
    over) arriving, not the device computing. While no kernel runs beside one, the step waits for
    its input: the breakdown counts that time as data, not compute."""
    mc = ctx.trace.memcpy
    if not len(mc) or "kind" not in mc:
        return np.zeros(len(mc), dtype=bool)
    return (mc["kind"] == "HtoD").to_numpy()


def h2d_set(ctx: RankContext) -> iv.Intervals:
    mc, m = ctx.trace.memcpy, h2d_mask(ctx)
    if not m.any():
        return iv.EMPTY
    return iv.union(mc["ts"].to_numpy(float)[m], mc["end"].to_numpy(float)[m])


def _annotation_union(ctx: RankContext, kind: str) -> iv.Intervals:
    ann = ctx.trace.annotations
    if not len(ann):
        return iv.EMPTY
    m = (ann["kind"] == kind).to_numpy()
    return iv.union(ann["ts"].to_numpy(float)[m], ann["end"].to_numpy(float)[m])


def _gc(ctx: RankContext) -> iv.Intervals:
    py = ctx.trace.python
    if not len(py):
        return iv.EMPTY
    m = (py["name"] == "Python GC").to_numpy()
    return iv.union(py["ts"].to_numpy(float)[m], py["end"].to_numpy(float)[m])


def _host_sets(g: Graph, main_tid: int) -> dict[str, iv.Intervals]:
    """The host threads' segments by what they do: launch (launch, other runtime calls, sync
    latency), op (CPU operators), comm (CPU collectives), gap (the driving thread between them)."""
    nS = g.n_host
    cat, s, e, tid = g.cat[:nS], g.start[:nS], g.end[:nS], g.tid[:nS]

    def u(m: np.ndarray) -> iv.Intervals:
        return iv.union(s[m], e[m])

    return {
        "launch": u(np.isin(cat, [LAUNCH, RUNTIME, SYNC_WAIT])),
        "op": u(cat == CPU_OP),
        "comm": u(cat == COMM),
        "gap": u((cat == HOST_GAP) & (tid == main_tid)),
    }


def _split(ws: np.ndarray, we: np.ndarray, free: iv.Intervals, ordered: list[tuple[str, iv.Intervals]]) -> dict[str, np.ndarray]:  # fmt: skip
    """Per window, how much of ``free`` each set claims, the earlier sets first; ``_rest`` is what
    none claims."""
    out: dict[str, np.ndarray] = {}
    left = free
    for name, a in ordered:
        take = iv.intersect(left, a) if len(a[0]) else iv.EMPTY
        out[name] = iv.overlap_length(ws, we, take)
        left = iv.subtract(left, a) if len(a[0]) else left
    out["_rest"] = iv.overlap_length(ws, we, left)
    return out


def components(ctx: RankContext, g: Graph, main_tid: int) -> tuple[dict[str, np.ndarray], np.ndarray, str]:
    """Per analysed window: each component's µs, the GC µs within host_python, and the device kind."""
    ws = np.array([w.start_us for w in ctx.windows])
    we = np.array([w.end_us for w in ctx.windows])
    span = iv.union(ws, we)
    device = device_kind(ctx)
    host = _host_sets(g, main_tid)
    dl = _annotation_union(ctx, "dataloader")
    gc = _gc(ctx)
    out = {c: np.zeros(len(ws)) for c in COMPONENTS}
    if device == "cpu":
        parts = _split(ws, we, span, [("data", dl), ("communication", host["comm"]), ("compute", host["op"]),
                                      ("host_launch", host["launch"]), ("host_python", host["gap"])])  # fmt: skip
        out.update({k: v for k, v in parts.items() if k in out})
        out["idle"] = parts["_rest"]
        free = iv.subtract(iv.intersect(span, host["gap"]), iv.union(np.concatenate([dl[0], host["op"][0]]),
                                                                    np.concatenate([dl[1], host["op"][1]])))  # fmt: skip
    else:
        comp, comm = device_sets(ctx)
        out["compute"] = iv.overlap_length(ws, we, comp)
        exposed = iv.subtract(comm, comp)
        out["communication"] = iv.overlap_length(ws, we, exposed)
        busy = iv.union(np.concatenate([comp[0], comm[0]]), np.concatenate([comp[1], comm[1]]))
        idle_dev = iv.subtract(span, busy)
        h2d = h2d_set(ctx)
        if len(h2d[0]):  # the device copying the input in with no kernel beside it: waiting for data
            dl = iv.union(np.concatenate([dl[0], h2d[0]]), np.concatenate([dl[1], h2d[1]]))
        parts = _split(ws, we, idle_dev, [("data", dl), ("host_launch", host["launch"]),
                                          ("host_dispatch", iv.union(np.concatenate([host["op"][0], host["comm"][0]]),
                                                                     np.concatenate([host["op"][1], host["comm"][1]]))),
                                          ("host_python", host["gap"])])  # fmt: skip
        for k in ("data", "host_launch", "host_dispatch", "host_python"):
            out[k] = parts[k]
        out["idle"] = parts["_rest"]
        claimed = iv.union(np.concatenate([dl[0], host["launch"][0], host["op"][0], host["comm"][0]]),
                           np.concatenate([dl[1], host["launch"][1], host["op"][1], host["comm"][1]]))  # fmt: skip
        free = iv.subtract(iv.intersect(idle_dev, host["gap"]), claimed)
    gc_us = iv.overlap_length(ws, we, iv.intersect(free, gc)) if len(gc[0]) else np.zeros(len(ws))
    return out, gc_us, device


def _fact(ctx: RankContext, step: int | None, comps: dict[str, float], duration: float, device: str,
          gc_us: float | None, n: int, ranges) -> StepBreakdown:  # fmt: skip
    comps = dict(comps)
    comps["idle"] += max(0.0, duration - sum(comps.values()))

    def r(x: float) -> float:
        return min(1.0, max(0.0, x / duration)) if duration > 0 else 0.0

    host = comps["host_launch"] + comps["host_dispatch"] + comps["host_python"]
    top = {"compute": comps["compute"], "communication": comps["communication"], "host": host,
           "data": comps["data"], "idle": comps["idle"]}  # fmt: skip
    crit = max(TOP_COMPONENTS, key=lambda k: top[k])
    per = n if step is None else 1
    return StepBreakdown(
        rank=ctx.rank, step=step, device=device, duration_us=duration / per,
        **{f"{k}_us": v / per for k, v in comps.items()},
        **{f"{k}_ratio": r(v) for k, v in comps.items()},
        host_ratio=r(host), gc_us=(gc_us / per) if gc_us is not None else None,
        critical_component=crit, critical_ratio=r(top[crit]), steps_count=n,
        evidence=Evidence(time_ranges_us=ranges[:5], note=(
            "exclusive multi-component overlap of the step windows (docs/analysis/breakdown.md)"
            + ("; the aggregate's times are means per step" if step is None else ""))),
    )  # fmt: skip


def per_rank(ctx: RankContext) -> list[Fact]:
    g = ctx.shared.get("graph")
    if not ctx.windows or g is None:
        return []
    comps, gc_us, device = components(ctx, g, ctx.shared.get("main_tid", -1))
    has_gc = bool(len(_gc(ctx)[0]))
    facts: list[Fact] = []
    for i, w in enumerate(ctx.windows):
        facts.append(_fact(ctx, w.step, {k: float(v[i]) for k, v in comps.items()}, w.duration_us, device,
                           float(gc_us[i]) if has_gc else None, 1, [(w.start_us, w.end_us)]))  # fmt: skip
    ranges = [(w.start_us, w.end_us) for w in ctx.windows]
    total = {k: float(v.sum()) for k, v in comps.items()}
    facts.append(_fact(ctx, None, total, ctx.windows_us, device, float(gc_us.sum()) if has_gc else None,
                       len(ctx.windows), ranges))  # fmt: skip
    return facts
