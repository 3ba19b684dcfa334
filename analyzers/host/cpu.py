"""cpu analyzer: launch and dispatch cost, synchronisations, GC, compilation, host vs device busy.

Facts (hermes_kb/facts/cpu.py; formulas in docs/analysis/cpu.md):

* ``launch_overhead`` (rank-level, host/launches.py): launch calls, kernels shorter than their
  launch call, host time per kernel, launch-to-start delay (p50/p95), kernels the device waited
  for (HTA host_wait).
* ``host_device_busy`` (per step, at most ``MAX_STEP_FACTS``, + aggregate; here): host threads
  busy in cpu ops vs device busy, and device idle while the host works.
* ``host_sync`` (per step with syncs, capped, + aggregate; host/syncs.py): sync runtime calls,
  blocking device-to-host copies, cuda_sync events, and (aggregate) the ops behind them (top 10).
* ``gc_pauses`` (rank-level, only when the trace records 'Python GC' events; host/gc_pauses.py).
* ``compilation`` (per step that compiles/autotunes + aggregate when any compile-related event
  exists; host/compilation.py): compile and autotune time, compiled-region runs, guard checks,
  recompilation ids, and the per-call cost of running compiled code (regions per step,
  graph-break resume frames, host time in the compiled calls outside their generated code).
* ``device_allocation`` (rank-level, Kineto): CUDA / HIP device and pinned-host allocation calls
  in the steps; ``graph_capture``: stream captures and graph instantiations in the steps;
  ``npu_task_queue`` (Ascend): who launches the operators (the task queue's second thread, or
  the Python thread when the queue is off) (host/runtime_calls.py).
"""

from __future__ import annotations

import numpy as np

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.cpu import HostDeviceBusy

from .. import intervals as iv
from ..context import RankContext
from ..selection import div, host_tids, on_tids, pick_steps, step_pos, top_ops_union, window_arrays
from .compilation import compilation
from .gc_pauses import gc_pauses
from .launches import launch_overhead, register_host_work
from .runtime_calls import device_allocation, graph_capture, npu_task_queue
from .syncs import blocked_union, host_sync


def _device_union(ctx: RankContext) -> iv.Intervals | None:
    tr = ctx.trace
    parts_s, parts_e = [], []
    for fr in (tr.kernels, tr.memcpy):
        if len(fr):
            parts_s.append(fr["ts"].to_numpy())
            parts_e.append(fr["end"].to_numpy())
    if not parts_s:
        return None
    return iv.union(np.concatenate(parts_s), np.concatenate(parts_e))


# ---------------------------------------------------------------- host vs device busy


def _host_device_busy(ctx: RankContext, host: iv.Intervals, device: iv.Intervals | None, tids: np.ndarray) -> list[Fact]:
    tr = ctx.trace
    if not len(tr.cpu_ops) and device is None:
        return []
    ws, we = window_arrays(ctx)
    steps = np.array([w.step for w in ctx.windows])
    win = we - ws
    hb = iv.overlap_length(ws, we, host)
    ann, py = tr.annotations, tr.python
    am = on_tids(ann, tids) & (ann["kind"] != "step").to_numpy() if len(ann) else np.zeros(0, bool)
    pm = on_tids(py, tids)
    act = iv.union(np.concatenate([host[0], ann["ts"].to_numpy()[am], py["ts"].to_numpy()[pm]]),
                   np.concatenate([host[1], ann["end"].to_numpy()[am], py["end"].to_numpy()[pm]]))  # fmt: skip
    ha = iv.overlap_length(ws, we, act)
    if device is not None:
        db = iv.overlap_length(ws, we, device)
        idle_host = hb - iv.overlap_length(ws, we, iv.intersect(host, device))
    launches = np.zeros(len(steps))
    if len(tr.runtime):
        rm = tr.runtime["kind"].isin(["launch", "graph_launch"]).to_numpy()
        pos, ok = step_pos(steps, ctx.step_of(tr.runtime["ts"].to_numpy()[rm]))
        np.add.at(launches, pos[ok], 1)

    def make(idx, step):
        w, h, a = float(win[idx].sum()), float(hb[idx].sum()), float(ha[idx].sum())
        d = float(db[idx].sum()) if device is not None else None
        ih = float(idle_host[idx].sum()) if device is not None else None
        return HostDeviceBusy(
            rank=tr.rank, step=step, window_us=w, host_busy_us=h, host_busy_ratio=div(h, w),
            host_active_us=a, host_active_ratio=div(a, w),
            device_busy_us=d, device_busy_ratio=div(d, w) if d is not None else None,
            device_idle_us=max(w - d, 0.0) if d is not None else None,
            device_idle_host_busy_us=ih, device_idle_host_busy_ratio=div(ih, w) if ih is not None else None,
            launches_count=int(launches[idx].sum()),
            evidence=Evidence(time_ranges_us=[(float(ws[i]), float(we[i])) for i in np.atleast_1d(idx)[:5]],
                              counts={"host_threads": len(tids)},
                              note=f"host = top-level cpu ops on threads {tids.tolist()[:6]}; device = kernels, memcpy, memset"),
        )  # fmt: skip

    keep = pick_steps(
        {int(s): float(win[i] - (db[i] if device is not None else 0.0)) for i, s in enumerate(steps)}
    )
    facts: list[Fact] = [make(np.array([i]), int(s)) for i, s in enumerate(steps) if int(s) in keep]
    facts.append(make(np.arange(len(steps)), None))
    return facts


# ---------------------------------------------------------------- entry point


def per_rank(ctx: RankContext) -> list[Fact]:
    if not ctx.windows:
        return []
    tr = ctx.trace
    tids = host_tids(tr)
    has_ops = bool(len(tr.cpu_ops))
    host = iv.subtract(top_ops_union(tr, tids), blocked_union(tr, tids))
    device = _device_union(ctx)
    register_host_work(ctx, host, tids)
    facts: list[Fact] = []
    facts.extend(launch_overhead(ctx, host, has_ops, device))
    if has_ops:
        facts.extend(_host_device_busy(ctx, host, device, tids))
    facts.extend(host_sync(ctx))
    facts.extend(gc_pauses(ctx))
    facts.extend(compilation(ctx, device))
    facts.extend(device_allocation(ctx))
    facts.extend(graph_capture(ctx))
    facts.extend(npu_task_queue(ctx))
    return facts
