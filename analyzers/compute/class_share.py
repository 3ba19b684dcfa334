"""Kernel class shares: the time each class takes on the device (kernels by name, memcpy/memset as
memory), or of the CPU operators' self time on a CPU-only trace, and the kernels too short to
amortise their launch."""

from __future__ import annotations

import numpy as np

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.compute.classes import KernelClassShare, ShortKernels

from .. import intervals as iv
from ..context import RankContext
from ..host.dispatch import ops_in_optimizer
from ..whatif.sets import WhatIfSet, register
from .activities import Acts, ratio, register_device, top_names
from .calltree import cat_apply, cpu_self_time, in_windows
from .fusion import FUSION_CLASSES
from .kernel_classes import CLASSES, CLS_INDEX, classify_cpu_op


# --- parameters (docs/analysis/compute.md says where each comes from) -----------------------
SHORT_KERNEL_US = 10.0  # kernels shorter than this are dominated by launch overhead


def _windows(ctx: RankContext) -> iv.Intervals:
    return iv.union([w.start_us for w in ctx.windows], [w.end_us for w in ctx.windows])


def class_facts(ctx: RankContext, act: Acts) -> list[Fact]:
    total = float(act.dur.sum())
    win = _windows(ctx)
    wtot = ctx.windows_us
    out: list[Fact] = []
    comm = CLS_INDEX["communication"]
    register_device(ctx, "device_compute", "every device activity but collectives", act.take(act.cls != comm))
    register_device(ctx, "fusable", "element-wise, reduction and normalisation kernels",
                    act.take(np.isin(act.cls, [CLS_INDEX[c] for c in FUSION_CLASSES])), launches=True)
    for ci, c in enumerate(CLASSES):
        m = act.cls == ci
        n = int(m.sum())
        if not n:
            continue
        if c != "communication":  # the comm analyzer's set holds the collectives
            register_device(ctx, f"class:{c}", f"{c} kernels", act.take(m))
        busy = iv.length(iv.intersect(iv.union(act.ts[m], act.end[m]), win))
        t = float(act.dur[m].sum())
        nk = int((m & act.kernel).sum())
        out.append(KernelClassShare(
            rank=ctx.rank, kernel_class=c, source="kernel", time_us=t, busy_us=busy, count=n,
            share_of_device_time_ratio=ratio(t / total) if total > 0 else 0.0,
            share_of_step_time_ratio=ratio(busy / wtot) if wtot > 0 else 0.0,
            mean_duration_us=t / n,
            evidence=Evidence(
                time_ranges_us=[ctx.span],
                events=top_names(act.name_id[m], act.dur[m], act.names),
                counts={"kernels": nk, "memcpy_memset": n - nk},
                note="time = sum of durations; busy = union of the class's intervals inside the step windows; "
                     "share of device time = time / time of all kernels and memcpy/memset; events = longest kernels",
            ),
        ))  # fmt: skip
    return out


def cpu_class_facts(ctx: RankContext) -> list[Fact]:
    ops = ctx.trace.cpu_ops
    if not len(ops):
        return []
    m = in_windows(ctx, ops["ts"].to_numpy())
    if not m.any():
        return []
    vals, codes = cat_apply(ops["name"], lambda n: CLS_INDEX[classify_cpu_op(n)], dtype=np.int64)
    table = np.array([str(c) for c in ops["name"].cat.categories] + [""], dtype=object)
    cls = vals[codes][m]
    st = cpu_self_time(ops)[m]
    opt = ops_in_optimizer(ctx)[m]
    codes = codes[m]
    total = float(st.sum())
    wtot = ctx.windows_us
    out: list[Fact] = []
    rows = np.flatnonzero(m)
    otid, ots, oend = (ops[c].to_numpy() for c in ("tid", "ts", "end"))
    for ci, c in enumerate(CLASSES):
        sel = cls == ci
        n = int(sel.sum())
        if not n:
            continue
        r = rows[sel & ~opt]
        if len(r):  # the operators' own intervals (children of another class included: an approximation)
            register(ctx, WhatIfSet.of_intervals(f"class:{c}", f"{c} operators on the CPU (outside the optimizer)",
                                                 otid[r], ots[r], oend[r]))  # fmt: skip
        t = float(st[sel].sum())
        t_opt = float(st[sel & opt].sum())
        out.append(KernelClassShare(
            rank=ctx.rank, kernel_class=c, source="cpu_op", time_us=t, busy_us=min(t, wtot), count=n,
            share_of_device_time_ratio=ratio(t / total) if total > 0 else 0.0,
            share_of_step_time_ratio=ratio(t / wtot) if wtot > 0 else 0.0,
            mean_duration_us=t / n, in_optimizer_us=t_opt, outside_optimizer_us=t - t_opt,
            outside_optimizer_share_ratio=ratio((t - t_opt) / total) if total > 0 else 0.0,
            evidence=Evidence(
                time_ranges_us=[ctx.span],
                events=top_names(codes[sel], st[sel], table),
                counts={"cpu_ops": n},
                note="CPU-only trace: ATen operators classified by name; time = self time (duration minus "
                     "nested operators); share of step time = time / window time, capped at 1",
            ),
        ))  # fmt: skip
    return out


def short_kernels(ctx: RankContext, k: Acts) -> list[Fact]:
    if not len(k):
        return []
    dur = k.dur
    short = dur < SHORT_KERNEL_US
    total = float(dur.sum())
    st = float(dur[short].sum())
    return [ShortKernels(
        rank=ctx.rank, threshold_us=SHORT_KERNEL_US, kernels_count=len(k), short_count=int(short.sum()),
        short_time_us=st, short_count_ratio=ratio(float(short.mean())),
        short_time_ratio=ratio(st / total) if total else 0.0,
        mean_duration_us=float(dur.mean()), median_duration_us=float(np.median(dur)),
        evidence=Evidence(
            time_ranges_us=[ctx.span],
            events=top_names(k.name_id[short], np.ones(int(short.sum())), k.names),
            counts={"kernels": len(k), "short_kernels": int(short.sum())},
            note=f"short = duration < {SHORT_KERNEL_US:g} µs; events = the most frequent short kernels",
        ),
    )]  # fmt: skip
