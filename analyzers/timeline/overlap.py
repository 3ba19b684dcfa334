"""Overlap: how host work, device compute and communication share each step.

Per rank:

* ``step_overlap`` per analysed step window and one aggregate (step = None): the Hermes paper's
  multi-component parallel analysis. Three interval sets, all clipped to the window:
  C = device compute (kernels that are not communication, plus memcpy/memset),
  M = communication kernels (NCCL/RCCL, symmetric-memory collectives),
  H = host busy (top-level CPU ops, runtime/driver calls and data-loader waits on every CPU
  thread, minus the time the host sits blocked in a synchronising call).
  The window is cut exactly into compute only, communication only (M \\ C), host only
  (H \\ (C ∪ M)), compute ∩ communication, compute ∩ host (no communication) and free time.
  The same fact carries HTA's temporal breakdown (idle / compute / non-compute) measured on the
  window.
* ``hta_temporal_breakdown``, ``hta_comm_comp_overlap`` and ``hta_idle_breakdown`` (one per
  stream, at most 10): HolisticTraceAnalysis 0.5.0's definitions over the whole trace minus the
  last ProfilerStep (by launch time), as docs/hta_definitions.md describes, for cross-checking.

Hands to later analyzers (``ctx.shared``), each a dict step -> (starts, ends) set clipped to
the step window: ``device_busy`` (C ∪ M), ``device_compute`` (C), ``device_comm`` (M),
``host_busy`` (H); and ``overlap_components``: step -> dict of the partition's µs values.
docs/analysis/overlap.md has the formulas. The device-event table is built in device_events.py,
H and the host's gloo communication in host_sets.py, the HTA definitions and their facts in
hta.py.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.overlap import StepOverlap

from .. import intervals as iv
from ..context import RankContext
from .device_events import COMPUTATION, SRC_KERNEL, SRC_MEMCPY, SRC_MEMSET, SRC_SYNC, device_events
from .host_sets import host_busy, host_comm
from .hta import KERNEL_WAIT_THRESHOLD_US, hta_facts, opt_ratio, ratio

# ctx.shared keys this analyzer fills (each a dict step -> value, see the module docstring)
SHARED_KEYS = ("device_busy", "device_compute", "device_comm", "host_busy", "overlap_components")

COMPONENTS = ("compute_only_us", "comm_only_us", "host_only_us", "compute_comm_overlap_us",
              "compute_host_overlap_us", "free_us")  # fmt: skip

# partition codes: bit 0 = compute, bit 1 = communication, bit 2 = host
_C, _M, _H = 1, 2, 4


def _slice(a: iv.Intervals, lo: float, hi: float) -> iv.Intervals:
    """The part of a sorted disjoint set inside [lo, hi] (binary search, then clip)."""
    s, e = a
    i0 = int(np.searchsorted(e, lo, side="right"))
    i1 = int(np.searchsorted(s, hi, side="left"))
    if i1 <= i0:
        return iv.EMPTY
    s = np.maximum(s[i0:i1], lo)
    e = np.minimum(e[i0:i1], hi)
    keep = e > s
    return s[keep], e[keep]


def partition(sets: list[iv.Intervals], lo: float, hi: float) -> np.ndarray:
    """Length of [lo, hi] covered by each membership pattern of the given sets.

    ``sets`` are disjoint sorted sets inside [lo, hi] (k of them); returns an array of 2**k
    lengths indexed by the bit pattern (bit j set = inside set j). The entries add up to
    hi - lo: one sweep over every boundary, the pattern after each point is the running sum of
    +2**j at starts and -2**j at ends of set j.
    """
    k = len(sets)
    pts = [np.array([lo, hi])]
    deltas = [np.zeros(2, dtype=np.int64)]
    for j, (s, e) in enumerate(sets):
        pts += [s, e]
        deltas += [np.full(len(s), 1 << j, dtype=np.int64), np.full(len(e), -(1 << j), dtype=np.int64)]
    p = np.concatenate(pts)
    d = np.concatenate(deltas)
    order = np.argsort(p, kind="stable")
    p = p[order]
    code = np.cumsum(d[order])[:-1]
    seg = np.diff(p)
    # zero-length segments at tied boundaries can carry a transient pattern: they weigh nothing
    code = np.clip(code, 0, (1 << k) - 1)
    return np.bincount(code, weights=seg, minlength=1 << k)


def _step_fact(rank: int, step: int | None, lo: float, hi: float, dur: float, part: np.ndarray,
               gpu: tuple[float, float] | None, memory: float, has_device: bool,
               evidence: Evidence) -> StepOverlap:  # fmt: skip
    free = part[0]
    compute_only = part[_C]
    comm_only = part[_M] + part[_M | _H]
    host_only = part[_H]
    cc = part[_C | _M] + part[_C | _M | _H]
    ch = part[_C | _H]
    compute = part[_C] + cc + ch
    comm = comm_only + cc
    host = part[_H] + part[_C | _H] + part[_M | _H] + part[_C | _M | _H]
    device = float(part[1:4].sum() + part[5:8].sum())  # any pattern with bit 0 or bit 1
    mh = float(part[2:8].sum())  # M ∪ H
    overlap = cc + ch
    gpu_fields: dict = {}
    if gpu is not None:
        gpu_busy, gpu_comp = gpu
        gpu_idle = max(dur - gpu_busy, 0.0)
        gpu_non = max(gpu_busy - gpu_comp, 0.0)
        gpu_fields = dict(
            gpu_idle_us=gpu_idle, gpu_compute_us=gpu_comp, gpu_non_compute_us=gpu_non,
            gpu_idle_ratio=ratio(gpu_idle, dur), gpu_compute_ratio=ratio(gpu_comp, dur),
            gpu_non_compute_ratio=ratio(gpu_non, dur),
        )  # fmt: skip
    return StepOverlap(
        rank=rank,
        step=step,
        start_us=lo,
        end_us=hi,
        duration_us=dur,
        compute_only_us=compute_only,
        comm_only_us=comm_only,
        host_only_us=host_only,
        compute_comm_overlap_us=cc,
        compute_host_overlap_us=ch,
        free_us=free,
        compute_only_ratio=ratio(compute_only, dur),
        comm_only_ratio=ratio(comm_only, dur),
        host_only_ratio=ratio(host_only, dur),
        compute_comm_overlap_ratio=ratio(cc, dur),
        compute_host_overlap_ratio=ratio(ch, dur),
        free_ratio=ratio(free, dur),
        compute_us=compute,
        memory_us=memory,
        comm_us=comm,
        host_us=host,
        device_busy_us=device,
        overlap_us=overlap,
        overlap_ratio=opt_ratio(overlap, mh) if has_device and device > 0 else None,
        comm_hidden_ratio=opt_ratio(cc, comm) if has_device else None,
        **gpu_fields,
        evidence=evidence,
    )


def _step_facts(ctx: RankContext, ev: pd.DataFrame) -> list[Fact]:
    trace = ctx.trace
    ts, end = ev["ts"].to_numpy(), ev["end"].to_numpy()
    src, comm_mask, hta = ev["src"].to_numpy(), ev["comm"].to_numpy(dtype=bool), ev["hta"].to_numpy()
    work = src != SRC_SYNC  # cuda_sync events are the device waiting, not work
    C = iv.union(ts[work & ~comm_mask], end[work & ~comm_mask])
    M = iv.union(ts[comm_mask], end[comm_mask])
    M_host, n_gloo = host_comm(trace)
    if n_gloo:
        M = iv.union(np.concatenate([M[0], M_host[0]]), np.concatenate([M[1], M_host[1]]))
    has_device = bool(work.any() or comm_mask.any())
    mem = (src == SRC_MEMCPY) | (src == SRC_MEMSET)
    MEM = iv.union(ts[mem], end[mem])
    H, host_counts = host_busy(trace)
    G_all = iv.union(ts, end)
    G_comp = iv.union(ts[hta == COMPUTATION], end[hta == COMPUTATION])

    # per-window counts for the evidence, without a loop over events
    win_of = ctx.step_of(ts) if len(ts) else np.zeros(0, dtype=np.int64)

    shared = {k: ctx.shared.setdefault(k, {}) for k in SHARED_KEYS}
    facts: list[Fact] = []
    total = np.zeros(8)
    tot_dur = tot_mem = tot_gbusy = tot_gcomp = 0.0
    n_comm_total = n_work_total = 0
    for w in ctx.windows:
        lo, hi = w.start_us, w.end_us
        if hi <= lo:
            continue
        c, m, h = _slice(C, lo, hi), _slice(M, lo, hi), _slice(H, lo, hi)
        part = partition([c, m, h], lo, hi)
        dur = hi - lo
        memory = iv.length(_slice(MEM, lo, hi))
        gbusy = iv.length(_slice(G_all, lo, hi))
        gcomp = iv.length(_slice(G_comp, lo, hi))
        in_w = win_of == w.step
        n_comm = int((in_w & comm_mask).sum())
        n_work = int((in_w & work & ~comm_mask).sum())
        shared["device_compute"][w.step] = c
        shared["device_comm"][w.step] = m
        shared["host_busy"][w.step] = h
        shared["device_busy"][w.step] = iv.union(np.concatenate([c[0], m[0]]), np.concatenate([c[1], m[1]]))
        f = _step_fact(
            ctx.rank, w.step, lo, hi, dur, part, (gbusy, gcomp) if len(ev) else None, memory, has_device,
            Evidence(
                time_ranges_us=[(lo, hi)],
                counts={"device_compute_events": n_work, "comm_kernels": n_comm},
                note="components: set algebra on C (compute kernels + memcpy/memset), M (communication kernels), "
                     "H (host busy) clipped to the step window; see docs/analysis/overlap.md",
            ),
        )  # fmt: skip
        shared["overlap_components"][w.step] = {
            k: getattr(f, k)
            for k in COMPONENTS
        }
        facts.append(f)
        total += part
        tot_dur += dur
        tot_mem += memory
        tot_gbusy += gbusy
        tot_gcomp += gcomp
        n_comm_total += n_comm
        n_work_total += n_work
    if facts:
        counts = {"steps": len(facts), "device_compute_events": n_work_total, "comm_kernels": n_comm_total}
        if n_gloo:
            counts["gloo_collectives"] = n_gloo
        counts.update(host_counts)
        events: list[str] = []
        ksel = (src == SRC_KERNEL) & comm_mask & (win_of >= 0)
        if ksel.any():
            # the communication kernels taking the most time in the analysed steps (top 5)
            names = trace.kernels["name"].to_numpy()[ev["row"].to_numpy()[ksel]]
            top = pd.Series((end - ts)[ksel]).groupby(pd.Series(names).astype(str).to_numpy()).sum()
            events = [str(n) for n in top.sort_values(ascending=False).index[:5]]
        facts.append(
            _step_fact(
                ctx.rank, None, facts[0].start_us, facts[-1].end_us, tot_dur, total,
                (tot_gbusy, tot_gcomp) if len(ev) else None, tot_mem, has_device,
                Evidence(time_ranges_us=[(facts[0].start_us, facts[-1].end_us)], events=events, counts=counts,
                         note="sum over the analysed step windows; ratios recomputed from the sums"),
            )
        )  # fmt: skip
    return facts


def per_rank(ctx: RankContext, threshold_us: float = KERNEL_WAIT_THRESHOLD_US) -> list[Fact]:
    ev = device_events(ctx.trace)
    facts = _step_facts(ctx, ev)
    if len(ev):
        facts.extend(hta_facts(ctx, ev, threshold_us))
    return facts
