"""The host's interval sets: H, the time the host is busy (top-level CPU ops, runtime calls,
data-loader waits, minus the time blocked in a synchronising call), and the communication it does
itself (gloo collectives) (analyzers/timeline/overlap.py, docs/analysis/overlap.md)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hermes_kb.trace.bundle import RankTrace

from .. import intervals as iv
from .device_events import per_name

# host-side collectives of the gloo backend (record_function spans on the gloo threads)
GLOO_PREFIX = "gloo:"


def _blocking_runtime(rt: pd.DataFrame) -> np.ndarray:
    """Runtime calls during which the host waits for the device: synchronize calls and the
    synchronous (non-Async) memcpy calls."""
    kind = rt["kind"].astype(str).to_numpy()
    is_async = per_name(rt["name"], lambda c: c.str.contains("async", case=False).to_numpy(bool)).astype(bool)
    return (kind == "sync") | ((kind == "memcpy") & ~is_async)


def host_busy(trace: RankTrace) -> tuple[iv.Intervals, dict[str, int]]:
    """H: top-level CPU ops, runtime/driver calls and data-loader waits on every CPU thread,
    minus the time blocked in synchronising runtime calls."""
    starts, ends = [], []
    counts = {}
    ops = trace.cpu_ops
    if len(ops):
        top = ops[ops["depth"].to_numpy() == 0]
        starts.append(top["ts"].to_numpy(dtype=np.float64))
        ends.append(top["end"].to_numpy(dtype=np.float64))
        counts["top_level_cpu_ops"] = len(top)
    rt = trace.runtime
    blocked = iv.EMPTY
    if len(rt):
        starts.append(rt["ts"].to_numpy(dtype=np.float64))
        ends.append(rt["end"].to_numpy(dtype=np.float64))
        counts["runtime_calls"] = len(rt)
        b = _blocking_runtime(rt)
        if b.any():
            blocked = iv.union(rt["ts"].to_numpy()[b], rt["end"].to_numpy()[b])
            counts["blocking_runtime_calls"] = int(b.sum())
    ann = trace.annotations
    if len(ann):
        dl = ann[ann["kind"].astype(str).to_numpy() == "dataloader"]
        if len(dl):
            starts.append(dl["ts"].to_numpy(dtype=np.float64))
            ends.append(dl["end"].to_numpy(dtype=np.float64))
            counts["dataloader_annotations"] = len(dl)
    if not starts:
        return iv.EMPTY, counts
    h = iv.union(np.concatenate(starts), np.concatenate(ends))
    return iv.subtract(h, blocked), counts


def host_comm(trace: RankTrace) -> tuple[iv.Intervals, int]:
    """Communication done by the host: gloo collectives (``gloo:*`` annotations, on the gloo
    worker threads)."""
    ann = trace.annotations
    if not len(ann):
        return iv.EMPTY, 0
    g = gloo_mask(ann)
    if not g.any():
        return iv.EMPTY, 0
    return iv.union(ann["ts"].to_numpy()[g], ann["end"].to_numpy()[g]), int(g.sum())


def gloo_mask(ann: pd.DataFrame) -> np.ndarray:
    """The annotations that are gloo collectives at work (``gloo:*``, recorded on gloo's worker
    threads while a collective runs)."""
    if not len(ann):
        return np.zeros(0, dtype=bool)
    return per_name(ann["name"], lambda c: c.str.startswith(GLOO_PREFIX).to_numpy(dtype=bool)).astype(bool)


def gloo_waits(trace: RankTrace, thread: int) -> tuple[iv.Intervals, list[str]]:
    """On a trace without device activity (CPU training), the stretches in which a gloo
    collective of this rank is at work on gloo's threads, as intervals for ``thread`` (the
    driving thread), each named after the first gloo annotation in it. A gloo collective is
    blocking for its caller (``dist.all_reduce`` waits for its work before returning) and DDP waits
    for its gloo buckets at the end of the backward pass, with no operator recorded on the caller's
    thread while it waits: what that thread does not spend in an operator there is waiting for
    communication, not Python. Empty on traces with kernels or copies (the device's collectives
    are read from its own activity) and when ``thread`` itself records the annotations."""
    ann = trace.annotations
    if len(trace.kernels) or len(trace.memcpy) or not len(ann):
        return iv.EMPTY, []
    g = gloo_mask(ann) & (ann["tid"].to_numpy() != thread) & (ann["end"].to_numpy() > ann["ts"].to_numpy())
    if not g.any():
        return iv.EMPTY, []
    ts, end = ann["ts"].to_numpy(np.float64)[g], ann["end"].to_numpy(np.float64)[g]
    u = iv.union(ts, end)
    order = np.argsort(ts, kind="stable")
    first = order[np.searchsorted(ts[order], u[0], side="left")]  # the earliest annotation of each piece
    names = ann["name"].astype(str).to_numpy()[g][first]
    return u, [str(n) for n in names]
