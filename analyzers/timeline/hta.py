"""HolisticTraceAnalysis 0.5.0's definitions, for cross-checking (docs/hta_definitions.md): the
temporal breakdown, the communication/computation overlap and the per-stream idle breakdown over
the whole trace minus the last ProfilerStep, and their facts (``hta_temporal_breakdown``,
``hta_comm_comp_overlap``, ``hta_idle_breakdown``: analyzers/timeline/overlap.py runs them)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.overlap import HtaCommCompOverlap, HtaIdleBreakdown, HtaTemporalBreakdown
from hermes_kb.trace.bundle import RankTrace

from .. import intervals as iv
from ..context import RankContext
from .device_events import COMMUNICATION, COMPUTATION, SRC_SYNC, per_name

# HTA's consecutive_kernel_delay default is "30"; HTA's docs say nanoseconds but it is compared
# with gaps in trace units (µs), so the threshold that reproduces HTA is 30 µs.
KERNEL_WAIT_THRESHOLD_US = 30.0
MAX_STREAMS = 10


def ratio(x: float, d: float) -> float:
    """x / d clipped to [0, 1]; 0 when d <= 0."""
    if d <= 0:
        return 0.0
    return float(min(max(x / d, 0.0), 1.0))


def opt_ratio(x: float, d: float) -> float | None:
    """ratio, or None when d <= 0."""
    return None if d <= 0 else ratio(x, d)


def hta_last_step_start(trace: RankTrace) -> float | None:
    """HTA's step filter bound: start of the last ProfilerStep when the rank's events carry at
    least two distinct names containing "ProfilerStep" (else None: HTA keeps everything)."""
    names: set[str] = set()
    last = -np.inf
    for df in (trace.annotations, trace.gpu_annotations):
        if not len(df):
            continue
        hit = per_name(df["name"], lambda c: c.str.contains("ProfilerStep", regex=False).to_numpy(bool))
        hit = hit.astype(bool)
        if hit.any():
            names.update(df["name"][hit].astype(str).unique())
            last = max(last, float(df["ts"].to_numpy()[hit].max()))
    if len(names) < 2:
        return None
    return last


def hta_keep_mask(ev: pd.DataFrame, last_step_start: float | None) -> np.ndarray:
    """Which device events HTA 0.5.0 keeps: those launched before the last ProfilerStep (a
    correlated event whose launch is not in the trace is dropped; an uncorrelated one is kept
    when it starts before that step)."""
    if last_step_start is None:
        return np.ones(len(ev), dtype=bool)
    corr = ev["correlation"].to_numpy()
    launch = ev["launch_ts"].to_numpy()
    ts = ev["ts"].to_numpy()
    with np.errstate(invalid="ignore"):
        return np.where(corr >= 0, launch < last_step_start, ts < last_step_start)


def hta_temporal(ev: pd.DataFrame) -> dict | None:
    """HTA temporal breakdown of the kept device events (µs), or None when there are none."""
    if not len(ev):
        return None
    ts, end = ev["ts"].to_numpy(), ev["end"].to_numpy()
    lo, hi = float(ts.min()), float(end.max())
    if hi <= lo:
        return None
    busy = iv.length(iv.union(ts, end))
    comp = ev["hta"].to_numpy() == COMPUTATION
    compute = iv.length(iv.union(ts[comp], end[comp]))
    kt = hi - lo
    idle = kt - busy
    return {"start": lo, "end": hi, "kernel_time": kt, "idle": idle, "compute": compute,
            "non_compute": busy - compute}  # fmt: skip


def hta_comm_overlap(ev: pd.DataFrame) -> dict | None:
    """HTA comm/comp overlap: |U(COMPUTATION) ∩ U(COMMUNICATION)| / |U(COMMUNICATION)|."""
    t = ev["hta"].to_numpy()
    ts, end = ev["ts"].to_numpy(), ev["end"].to_numpy()
    cm = t == COMMUNICATION
    comm = iv.union(ts[cm], end[cm])
    comm_len = iv.length(comm)
    if comm_len <= 0:
        return None
    cp = t == COMPUTATION
    comp = iv.union(ts[cp], end[cp])
    ov = iv.length(iv.intersect(comp, comm))
    return {"comm": comm_len, "compute": iv.length(comp), "overlap": ov, "ratio": ov / comm_len,
            "n_comm": int(cm.sum())}  # fmt: skip


def hta_idle_breakdown(ev: pd.DataFrame, threshold_us: float = KERNEL_WAIT_THRESHOLD_US) -> pd.DataFrame:
    """HTA idle-time breakdown per stream of the kept device events.

    Only kernels, memcpy and memset count (no cuda_sync). Per stream, events in start order;
    each gap = start - end of the previous event in that order. host_wait when the event was
    launched after the previous one ended, else kernel_wait when gap < threshold_us, else other.
    ``threshold_us`` is in µs (HTA's 30, documented as ns, is compared against µs).
    Returns one row per stream: stream, device, host_wait, kernel_wait, other, idle (µs),
    the three counts, events.
    """
    e = ev[ev["src"].to_numpy() != SRC_SYNC]
    cols = ["stream", "device", "host_wait", "kernel_wait", "other", "idle",
            "host_wait_n", "kernel_wait_n", "other_n", "events", "start", "end"]  # fmt: skip
    if not len(e):
        return pd.DataFrame({c: [] for c in cols})
    stream = e["stream"].to_numpy()
    ts = e["ts"].to_numpy()
    end = e["end"].to_numpy()
    order = np.lexsort((np.arange(len(e)), ts, stream))
    stream, ts, end = stream[order], ts[order], end[order]
    launch = e["launch_ts"].to_numpy()[order]
    device = e["device"].to_numpy()[order]
    first = np.ones(len(e), dtype=bool)
    first[1:] = stream[1:] != stream[:-1]
    prev_end = np.empty(len(e))
    prev_end[0] = np.nan
    prev_end[1:] = end[:-1]
    prev_end[first] = np.nan
    gap = ts - prev_end
    with np.errstate(invalid="ignore"):
        host = launch > prev_end
        kernel = ~host & (gap < threshold_us)
    other = ~host & ~kernel & ~first
    gap0 = np.nan_to_num(gap, nan=0.0)
    grp, uniq = pd.factorize(stream, sort=False)
    n = len(uniq)

    def sums(mask):
        return np.bincount(grp, weights=np.where(mask, gap0, 0.0), minlength=n)

    def cnt(mask):
        return np.bincount(grp, weights=mask.astype(float), minlength=n).astype(int)

    firsts = np.flatnonzero(first)
    out = pd.DataFrame(
        {
            "stream": uniq.astype(np.int64),
            "device": device[firsts],
            "host_wait": sums(host),
            "kernel_wait": sums(kernel),
            "other": sums(other),
            "host_wait_n": cnt(host),
            "kernel_wait_n": cnt(kernel),
            "other_n": cnt(other),
            "events": np.bincount(grp, minlength=n),
            "start": ts[firsts],
            "end": np.maximum.reduceat(end, firsts),
        }
    )
    out["idle"] = out["host_wait"] + out["kernel_wait"] + out["other"]
    return out[cols]


def hta_facts(ctx: RankContext, ev: pd.DataFrame, threshold_us: float) -> list[Fact]:
    trace = ctx.trace
    last = hta_last_step_start(trace)
    kept = ev[hta_keep_mask(ev, last)]
    facts: list[Fact] = []
    t = hta_temporal(kept)
    if t is None:
        return facts
    note_filter = (
        f"HTA 0.5.0 event set: GPU events launched before the last ProfilerStep (starts at {last:.1f} µs)"
        if last is not None else "HTA 0.5.0 event set: all GPU events (fewer than two ProfilerStep names: no filter)"
    )  # fmt: skip
    kt = t["kernel_time"]
    facts.append(
        HtaTemporalBreakdown(
            rank=ctx.rank,
            interval_start_us=t["start"],
            interval_end_us=t["end"],
            kernel_time_us=kt,
            idle_us=t["idle"],
            compute_us=t["compute"],
            non_compute_us=t["non_compute"],
            idle_ratio=ratio(t["idle"], kt),
            compute_ratio=ratio(t["compute"], kt),
            non_compute_ratio=ratio(t["non_compute"], kt),
            last_step_filter=last is not None,
            last_step_start_us=last,
            events_count=len(kept),
            evidence=Evidence(
                time_ranges_us=[(t["start"], t["end"])],
                counts={"kept_gpu_events": len(kept), "gpu_events": len(ev)},
                note=note_filter + "; interval = first start .. last end of those events",
            ),
        )
    )
    o = hta_comm_overlap(kept)
    if o is not None:
        facts.append(
            HtaCommCompOverlap(
                rank=ctx.rank,
                comm_us=o["comm"],
                compute_us=o["compute"],
                overlap_us=o["overlap"],
                overlap_ratio=ratio(o["overlap"], o["comm"]),
                comm_kernels_count=o["n_comm"],
                evidence=Evidence(
                    time_ranges_us=[(t["start"], t["end"])],
                    counts={"comm_kernels": o["n_comm"]},
                    note=note_filter + "; ratio = |U(COMPUTATION) ∩ U(COMMUNICATION)| / |U(COMMUNICATION)|",
                ),
            )
        )
    idle = hta_idle_breakdown(kept, threshold_us)
    if len(idle):
        idle = idle.sort_values(["idle", "stream"], ascending=[False, True])
        left_out = max(len(idle) - MAX_STREAMS, 0)
        for row in idle.head(MAX_STREAMS).itertuples(index=False):
            tot = float(row.idle)
            note = (f"gaps between consecutive kernels/memcpy/memset of stream {int(row.stream)}; "
                    f"threshold {threshold_us:g} µs")  # fmt: skip
            if left_out:
                note += f"; {left_out} stream(s) with less idle time left out"
            facts.append(
                HtaIdleBreakdown(
                    rank=ctx.rank,
                    stream=int(row.stream),
                    device=int(row.device),
                    threshold_us=threshold_us,
                    host_wait_us=float(row.host_wait),
                    kernel_wait_us=float(row.kernel_wait),
                    other_us=float(row.other),
                    idle_us=tot,
                    host_wait_ratio=opt_ratio(float(row.host_wait), tot),
                    kernel_wait_ratio=opt_ratio(float(row.kernel_wait), tot),
                    other_ratio=opt_ratio(float(row.other), tot),
                    host_wait_count=int(row.host_wait_n),
                    kernel_wait_count=int(row.kernel_wait_n),
                    other_count=int(row.other_n),
                    events_count=int(row.events),
                    evidence=Evidence(time_ranges_us=[(float(row.start), float(row.end))],
                                      counts={"events": int(row.events)}, note=note),
                )
            )  # fmt: skip
    return facts
