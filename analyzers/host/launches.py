"""Launches (``launch_overhead``, rank-level): launch calls, kernels shorter than their launch call,
host time per kernel, launch-to-start delay (p50/p95), kernels the device waited for (HTA
host_wait), launch calls that stall for milliseconds; and the what-if sets of the host work that
issues device work (``launch_calls``, ``host_work``, ``host_step``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.cpu import LaunchOverhead

from .. import intervals as iv
from ..context import RankContext
from ..selection import div, host_window_arrays, main_tid
from ..whatif.sets import WhatIfSet, register
from .syncs import blocked_union

LONG_KERNEL_US = 50.0  # longer than an asynchronous launch call takes (3-30 us)
STALL_MIN_US = 1000.0  # a launch call this long is not launching any more ...
STALL_FACTOR = 50.0  # ... when it also takes this many times the median launch call


def _pctl(a: np.ndarray, q: float) -> float | None:
    return float(np.percentile(a, q)) if len(a) else None


def _launched_kernels(tr, launch: np.ndarray, rdur: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:  # fmt: skip
    """Kernels started by a plain launch call in the steps: (kernel durations, their launch calls'
    durations, launch delays, kernels of LONG_KERNEL_US or more, those whose launch call returned
    only after them)."""
    rt, kn, lk = tr.runtime, tr.kernels, tr.links
    kdur = np.zeros(0)
    ldur = np.zeros(0)
    queue = np.zeros(0)
    if len(lk):
        ri = lk["runtime_idx"].to_numpy()
        gi = lk["gpu_idx"].to_numpy()
        m = (lk["gpu_kind"] == "kernel").to_numpy() & (ri >= 0) & (ri < len(rt)) & (gi >= 0) & (gi < len(kn))
        m[m] &= launch[ri[m]]
        ri, gi = ri[m], gi[m]
        kdur = kn["dur"].to_numpy()[gi]
        ldur = rdur[ri]
        queue = kn["ts"].to_numpy()[gi] - rt["end"].to_numpy()[ri]  # HTA launch delay
        # a launch call that returns only after its kernel has finished: with asynchronous
        # launches impossible for a kernel that runs longer than any launch call takes
        k_end, r_end = kn["end"].to_numpy()[gi], rt["end"].to_numpy()[ri]
        long_k = kdur >= LONG_KERNEL_US
        n_long = int(long_k.sum())
        n_waited = int((long_k & (r_end >= k_end)).sum())
    else:
        n_long = n_waited = 0
    return kdur, ldur, queue, n_long, n_waited


def _host_wait(ctx: RankContext) -> tuple[int, int]:
    """HTA host_wait, per stream: (device activities in the steps launched after the previous
    activity on their stream ended, activities checked)."""
    tr = ctx.trace
    kn, lk = tr.kernels, tr.links
    hw_count, hw_total = 0, 0
    if len(lk):
        cols: dict[str, list[np.ndarray]] = {"stream": [], "device": [], "ts": [], "end": [], "launch": []}
        for kind, fr in (("kernel", kn), ("memcpy", tr.memcpy)):
            if not len(fr):
                continue
            lm = (lk["gpu_kind"] == kind).to_numpy()
            launch_ts = np.full(len(fr), np.nan)
            gi = lk["gpu_idx"].to_numpy()[lm]
            ok = (gi >= 0) & (gi < len(fr))
            launch_ts[gi[ok]] = lk["launch_ts"].to_numpy()[lm][ok]
            for c in ("stream", "device", "ts", "end"):
                cols[c].append(fr[c].to_numpy())
            cols["launch"].append(launch_ts)
        if cols["ts"]:
            st, dv, ts, en, lts = (
                np.concatenate(cols[c]) for c in ("stream", "device", "ts", "end", "launch")
            )
            o = np.lexsort((ts, st, dv))
            st, dv, ts, en, lts = st[o], dv[o], ts[o], en[o], lts[o]
            prev_end = np.full(len(ts), np.nan)
            same = (st[1:] == st[:-1]) & (dv[1:] == dv[:-1])
            prev_end[1:][same] = en[:-1][same]
            valid = (ctx.step_of(ts) >= 0) & ~np.isnan(lts) & ~np.isnan(prev_end)
            hw_total = int(valid.sum())
            hw_count = int((valid & (lts > prev_end)).sum())
    return hw_count, hw_total


def launch_overhead(ctx: RankContext, host: iv.Intervals, has_ops: bool, device: iv.Intervals | None) -> list[Fact]:
    """The ``launch_overhead`` fact of the rank (none without launches in the steps)."""
    tr = ctx.trace
    rt, kn = tr.runtime, tr.kernels
    if not len(rt) or not len(kn):
        return []
    rstep = ctx.step_of(rt["ts"].to_numpy())
    rkind = rt["kind"].to_numpy()
    launch = (rkind == "launch") & (rstep >= 0)
    graph = (rkind == "graph_launch") & (rstep >= 0)
    if not launch.any() and not graph.any():
        return []
    rdur = rt["dur"].to_numpy()
    kdur, ldur, queue, n_long, n_waited = _launched_kernels(tr, launch, rdur)
    nk = len(kdur)
    short = int((kdur < ldur).sum())
    hs, he = host_window_arrays(ctx)
    host_us = float(iv.overlap_length(hs, he, host).sum()) if has_ops else None
    hw_count, hw_total = _host_wait(ctx)

    lsel = rdur[launch]
    stall = _stalled_launches(tr, launch, rdur, lsel, device)
    names = rt["name"][launch].value_counts().head(5)
    names = names[names > 0]
    return [LaunchOverhead(
        rank=tr.rank, launches_count=int(launch.sum()), graph_launches_count=int(graph.sum()), kernels_count=nk,
        launch_call_mean_us=float(lsel.mean()) if len(lsel) else None, launch_call_p50_us=_pctl(lsel, 50),
        kernel_mean_us=float(kdur.mean()) if nk else None, kernel_p50_us=_pctl(kdur, 50),
        short_kernels_count=short, short_kernels_ratio=div(short, nk),
        long_kernels_count=n_long, launch_waited_long_kernels_ratio=div(n_waited, n_long),
        host_us_per_kernel=(host_us / nk) if (host_us is not None and nk) else None,
        queue_p50_us=_pctl(queue, 50), queue_p95_us=_pctl(queue, 95),
        host_wait_kernels_count=hw_count, host_wait_kernels_ratio=div(hw_count, hw_total),
        stalled_launches_count=stall["count"], stalled_launch_us=stall["us"],
        stalled_launch_ratio=div(stall["us"], float(np.sum(he - hs))) if len(hs) else 0.0,
        stalled_device_idle_ratio=stall["idle_ratio"], stalled_first_use_count=stall["first_use"],
        stalled_first_use_ratio=div(stall["first_use"], stall["count"]) if stall["count"] else None,
        stalled_kernels=stall["kernels"],
        evidence=Evidence(
            time_ranges_us=[ctx.span], events=[str(n) for n in names.index],
            counts={str(k): int(v) for k, v in names.items()} | {"kernels_linked": nk, "device_activities_checked": hw_total},
            note="short kernel: kernel duration < its launch call's duration; queue: kernel start - launch call end; "
                 "host_wait: launch call start > end of the previous activity on the same stream (HTA idle breakdown)",
        ),
    )]  # fmt: skip


def _stalled_launches(tr, launch: np.ndarray, rdur: np.ndarray, lsel: np.ndarray, device: iv.Intervals | None) -> dict:
    """Launch calls in the steps that take milliseconds (>= STALL_MIN_US and >= STALL_FACTOR x the
    median launch call): their time, the share of it the device sat idle, and how many started
    the first kernel of its name in the trace (a first use: the driver loading the kernel's
    module or code object, CUDA's lazy loading)."""
    out = {"count": 0, "us": 0.0, "idle_ratio": None, "first_use": 0, "kernels": []}
    if not len(lsel):
        return out
    bound = max(STALL_MIN_US, STALL_FACTOR * float(np.median(lsel)))
    rows = np.flatnonzero(launch & (rdur >= bound))
    if not len(rows):
        return out
    rt, kn, lk = tr.runtime, tr.kernels, tr.links
    ts, end = rt["ts"].to_numpy()[rows], rt["end"].to_numpy()[rows]
    busy = float(iv.overlap_length(ts, end, device).sum()) if device is not None else 0.0
    total = float((end - ts).sum())
    first_use, kernels = 0, []
    if len(lk) and len(kn):
        km = (lk["gpu_kind"] == "kernel").to_numpy()
        by_runtime = dict(zip(lk["runtime_idx"].to_numpy()[km].tolist(), lk["gpu_idx"].to_numpy()[km].tolist()))
        names = kn["name"].astype(str).to_numpy()
        first = pd.Series(kn["ts"].to_numpy()).groupby(names).transform("min").to_numpy()
        for r in rows.tolist():
            g = by_runtime.get(r)
            if g is None or not 0 <= g < len(kn):
                continue
            base = names[g].split("(")[0]  # the kernel's name without its parameter list ...
            kernels.append((base[: base.index("<")] + "<...>" if "<" in base else base)[:100])  # ... and template
            first_use += int(kn["ts"].to_numpy()[g] <= first[g])
    return {"count": len(rows), "us": total, "idle_ratio": 1.0 - busy / total if total > 0 else None,
            "first_use": first_use, "kernels": kernels[:3]}  # fmt: skip


# ---------------------------------------------------------------- the host work that issues device work


def register_host_work(ctx: RankContext, host: iv.Intervals, tids: np.ndarray) -> None:
    """The host work that issues device work: operators and runtime calls on the threads that
    launch, outside synchronising waits and the DataLoader (sets ``host_work`` and ``launch_calls``)."""
    tr = ctx.trace
    rt = tr.runtime
    if not len(rt) or not (len(tr.kernels) or len(tr.memcpy)):
        return
    launch = rt["kind"].isin(["launch", "graph_launch"]).to_numpy()
    if not launch.any():
        return
    rtid = rt["tid"].to_numpy(np.int64)
    register(ctx, WhatIfSet.of_intervals("launch_calls", "kernel and graph launch calls", rtid[launch],
                                         rt["ts"].to_numpy()[launch], rt["end"].to_numpy()[launch]))  # fmt: skip
    ltids = np.intersect1d(np.unique(rtid[launch]), tids)
    ops = tr.cpu_ops
    ann = tr.annotations
    dl = ann[(ann["kind"] == "dataloader").to_numpy()] if len(ann) else ann
    DL = iv.union(dl["ts"].to_numpy(), dl["end"].to_numpy()) if len(dl) else iv.EMPTY
    blocked = blocked_union(tr, tids)
    steps_s = []
    mt = main_tid(tr)
    if mt is not None:
        # the driving thread's whole step (forward, backward, optimizer, the Python between them),
        # without its waits and its data loading: what a captured graph of the step replays at once
        hs, he = host_window_arrays(ctx)
        w = iv.subtract(iv.subtract(iv.union(hs, he), blocked), DL)
        if len(w[0]):
            steps_s.append((int(mt), w[0], w[1]))
    for t in ltids:
        om = (ops["tid"].to_numpy() == t) & (ops["depth"].to_numpy() == 0) if len(ops) else np.zeros(0, bool)
        rm = (rtid == t) & (rt["kind"] != "sync").to_numpy()
        w = iv.union(np.concatenate([ops["ts"].to_numpy()[om], rt["ts"].to_numpy()[rm]]),
                     np.concatenate([ops["end"].to_numpy()[om], rt["end"].to_numpy()[rm]]))  # fmt: skip
        w = iv.subtract(iv.subtract(w, blocked), DL)
        if len(w[0]):
            register(ctx, WhatIfSet.of_intervals("host_work", "operators and runtime calls on the launching threads "
                                                 "(no syncs, no DataLoader)", int(t), w[0], w[1]))  # fmt: skip
            if t != mt:
                steps_s.append((int(t), w[0], w[1]))
    if steps_s:
        register(ctx, WhatIfSet(
            "host_step", "the driving thread's steps and the other launching threads' work, without waits or "
            "data loading (what a captured graph replays in one launch)",
            host_tid=np.concatenate([np.full(len(a), t, np.int64) for t, a, _ in steps_s]),
            host_start=np.concatenate([a for _, a, _ in steps_s]), host_end=np.concatenate([b for _, _, b in steps_s])))

