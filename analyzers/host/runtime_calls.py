"""Runtime calls in the steps besides launches and syncs: ``device_allocation`` (Kineto: CUDA / HIP
device and pinned-host allocation calls), ``graph_capture`` (stream captures and graph
instantiations) and ``npu_task_queue`` (Ascend: who launches the operators, the task queue's second
thread or the Python thread when the queue is off)."""

from __future__ import annotations

import re

import numpy as np

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.cpu import DeviceAllocation, GraphCapture, NpuTaskQueue

from .. import intervals as iv
from ..context import RankContext
from ..selection import div, main_tid, name_mask, python_stacks
from ..whatif.sets import WhatIfSet, register

# pinned host memory: allocation, registration and release (the rest of kind malloc / free is device memory)
HOST_ALLOC_RE = re.compile(r"HostAlloc|MallocHost|FreeHost|HostRegister|HostUnregister|hipHostMalloc|hipHostFree", re.I)
EMPTY_CACHE_RE = re.compile(r"^<built-in function _cuda_emptyCache>$|^<built-in method _cuda_emptyCache\b|"
                            r"^torch/cuda/memory\.py\(\d+\): empty_cache$")  # fmt: skip
CAPTURE_BEGIN_RE = re.compile(r"^(cuda|hip)StreamBeginCapture|^cuStreamBeginCapture")
CAPTURE_END_RE = re.compile(r"^(cuda|hip)StreamEndCapture|^cuStreamEndCapture")
INSTANTIATE_RE = re.compile(r"^(cuda|hip)GraphInstantiate|^cuGraphInstantiate")


def device_allocation(ctx: RankContext) -> list[Fact]:
    """CUDA / HIP memory allocation calls in the steps (Ascend: analyzers/npu/npu.py's npu_allocation)."""
    tr = ctx.trace
    rt = tr.runtime
    if tr.meta.format == "ascend" or not len(rt):
        return []
    kind = rt["kind"].to_numpy()
    st = ctx.step_of(rt["ts"].to_numpy())
    am = ((kind == "malloc") | (kind == "free")) & (st >= 0)
    if not am.any():
        return []
    host = am & name_mask(rt["name"], HOST_ALLOC_RE)
    dev = am & ~host
    dur = rt["dur"].to_numpy()
    if dev.any():
        tid = rt["tid"].to_numpy(np.int64)
        register(ctx, WhatIfSet.of_intervals("device_alloc", "device memory allocation and free calls", tid[dev],
                                             rt["ts"].to_numpy()[dev], rt["end"].to_numpy()[dev]))  # fmt: skip
    window = ctx.windows_us
    steps = np.array([w.step for w in ctx.windows])
    with_alloc = len(np.intersect1d(np.unique(st[dev]), steps))
    empty = None
    if python_stacks(tr):
        py = tr.python
        empty = int((name_mask(py["name"], EMPTY_CACHE_RE) & (ctx.step_of(py["ts"].to_numpy()) >= 0)).sum())
    a_us, h_us = float(dur[dev].sum()), float(dur[host].sum())
    names = rt["name"][am].value_counts()
    names = names[names > 0].head(6)
    top = np.flatnonzero(am)[np.argsort(-dur[am])[:3]]
    return [DeviceAllocation(
        rank=tr.rank, steps_count=len(ctx.windows), window_us=window,
        malloc_count=int((dev & (kind == "malloc")).sum()), free_count=int((dev & (kind == "free")).sum()),
        alloc_us=a_us, alloc_ratio=div(a_us, window), steps_with_alloc_ratio=div(with_alloc, len(steps)),
        host_alloc_count=int(host.sum()), host_alloc_us=h_us, host_alloc_ratio=div(h_us, window),
        empty_cache_calls_count=empty,
        evidence=Evidence(time_ranges_us=[(float(rt["ts"].iat[i]), float(rt["end"].iat[i])) for i in top],
                          events=[str(k) for k in names.index], counts={str(k): int(v) for k, v in names.items()}),
    )]  # fmt: skip


def graph_capture(ctx: RankContext) -> list[Fact]:
    """CUDA / HIP graph capture and instantiation inside the steps."""
    tr = ctx.trace
    rt = tr.runtime
    if not len(rt):
        return []
    st = ctx.step_of(rt["ts"].to_numpy())
    begin = name_mask(rt["name"], CAPTURE_BEGIN_RE)
    inst = name_mask(rt["name"], INSTANTIATE_RE) & (st >= 0)
    if not (begin & (st >= 0)).any() and not inst.any():
        return []
    end_m = name_mask(rt["name"], CAPTURE_END_RE)
    ts, en, tid = rt["ts"].to_numpy(), rt["end"].to_numpy(), rt["tid"].to_numpy(np.int64)
    spans = []
    for i in np.flatnonzero(begin & (st >= 0)):
        later = np.flatnonzero(end_m & (tid == tid[i]) & (ts >= ts[i]))
        spans.append((tid[i], ts[i], en[later[0]] if len(later) else en[i]))
    parts = spans + [(tid[i], ts[i], en[i]) for i in np.flatnonzero(inst)]
    t, s, e = (np.array(x) for x in zip(*parts))
    register(ctx, WhatIfSet.of_intervals("graph_capture", "graph capture and instantiation in the steps",
                                         t.astype(np.int64), s.astype(float), e.astype(float)))  # fmt: skip
    cap = float(sum(b - a for _, a, b in spans))
    ins = float((en - ts)[inst].sum())
    window = ctx.windows_us
    launches = int(((rt["kind"] == "graph_launch").to_numpy() & (st >= 0)).sum())
    return [GraphCapture(
        rank=tr.rank, steps_count=len(ctx.windows), window_us=window, captures_count=len(spans), capture_us=cap,
        instantiations_count=int(inst.sum()), instantiate_us=ins, graph_launches_count=launches,
        capture_total_us=cap + ins, capture_ratio=div(cap + ins, window),
        evidence=Evidence(time_ranges_us=[(float(a), float(b)) for _, a, b in parts[:3]],
                          events=sorted({str(n) for n in rt["name"].to_numpy()[(begin | inst) & (st >= 0)]})[:5],
                          counts={"captures": len(spans), "instantiations": int(inst.sum())}),
    )]  # fmt: skip


def npu_task_queue(ctx: RankContext) -> list[Fact]:
    """torch_npu's task queue: who launches the operators (Ascend traces with a CANN API layer)."""
    tr = ctx.trace
    rt = tr.runtime
    if tr.meta.format != "ascend" or not len(rt):
        return []
    st = ctx.step_of(rt["ts"].to_numpy())
    launch = (rt["kind"] == "launch").to_numpy() & (st >= 0)
    if not launch.any():
        return []
    tid = main_tid(tr)
    tq = tr.extras.get("task_queue")
    enq = deq = 0
    if tq is not None and len(tq):
        tq_in = ctx.step_of(tq["ts"].to_numpy()) >= 0
        k = tq["kind"].astype(str).to_numpy()
        enq, deq = int(((k == "enqueue") & tq_in).sum()), int(((k == "dequeue") & tq_in).sum())
    on_main = rt["tid"].to_numpy() == tid
    n_main = int((launch & on_main).sum())
    cann_main = (st >= 0) & on_main & ~(rt["kind"] == "sync").to_numpy()
    cu = iv.length(iv.union(rt["ts"].to_numpy()[cann_main], rt["end"].to_numpy()[cann_main]))
    window = ctx.windows_us
    return [NpuTaskQueue(
        rank=tr.rank, steps_count=len(ctx.windows), window_us=window, enqueue_count=enq, dequeue_count=deq,
        queue_enabled=(enq + deq) > 0, launches_count=int(launch.sum()), main_thread_launches_count=n_main,
        main_thread_launch_ratio=div(n_main, int(launch.sum())), main_thread_cann_us=cu,
        main_thread_cann_ratio=div(cu, window),
        evidence=Evidence(counts={"Enqueue": enq, "Dequeue": deq, "launches": int(launch.sum()),
                                  "launches_on_training_thread": n_main},
                          note=f"training thread {tid}; CANN calls other than synchronisation on it"),
    )]  # fmt: skip
