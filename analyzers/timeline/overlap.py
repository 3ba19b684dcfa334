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
docs/analysis/overlap.md has the formulas.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.overlap import HtaCommCompOverlap, HtaIdleBreakdown, HtaTemporalBreakdown, StepOverlap
from hermes_kb.trace.bundle import RankTrace

from .. import intervals as iv
from ..context import RankContext

# HTA's consecutive_kernel_delay default is "30"; HTA's docs say nanoseconds but it is compared
# with gaps in trace units (µs), so the threshold that reproduces HTA is 30 µs.
KERNEL_WAIT_THRESHOLD_US = 30.0
MAX_STREAMS = 10

# ctx.shared keys this analyzer fills (each a dict step -> value, see the module docstring)
SHARED_KEYS = ("device_busy", "device_compute", "device_comm", "host_busy", "overlap_components")

COMPONENTS = ("compute_only_us", "comm_only_us", "host_only_us", "compute_comm_overlap_us",
              "compute_host_overlap_us", "free_us")  # fmt: skip

# HTA 0.5.0 kernel types (utils.get_kernel_type; Python re.match, i.e. anchored at the start)
HTA_COMM_RE = r"nccl.*Kernel"
HTA_MEMORY_RE = r"Memcpy|Memset|dma"
HTA_NOT_COMPUTE_RE = r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)"
COMPUTATION, COMMUNICATION, MEMORY, OTHER = 0, 1, 2, 3

# hermes: communication kernels are the collectives frame's kernels plus anything named nccl/rccl
COMM_NAME_RE = r"(?i)^(?:void\s+)?(?:nccl|rccl)"
# host-side collectives of the gloo backend (record_function spans on the gloo threads)
GLOO_PREFIX = "gloo:"

# event sources in the device-event table
SRC_KERNEL, SRC_MEMCPY, SRC_MEMSET, SRC_SYNC = 0, 1, 2, 3

EVENT_COLUMNS = ("ts", "end", "stream", "device", "correlation", "src", "hta", "comm", "launch_ts", "row")

# partition codes: bit 0 = compute, bit 1 = communication, bit 2 = host
_C, _M, _H = 1, 2, 4


# --------------------------------------------------------------------------- helpers


def _per_name(names: pd.Series, fn) -> np.ndarray:
    """Apply a vectorised classifier (Series of str -> array) once per distinct name."""
    if not len(names):
        return np.zeros(0)
    if isinstance(names.dtype, pd.CategoricalDtype):
        codes = names.cat.codes.to_numpy()
        cats = pd.Series(np.append(names.cat.categories.astype(str).to_numpy(), ""))
    else:
        codes, uniq = pd.factorize(names.astype(str))
        cats = pd.Series(np.append(np.asarray(uniq, dtype=object), ""))
    vals = np.asarray(fn(cats))
    return vals[np.where(codes < 0, len(cats) - 1, codes)]


def _hta_type_of(cats: pd.Series) -> np.ndarray:
    comm = cats.str.match(HTA_COMM_RE).to_numpy(dtype=bool)
    mem = cats.str.match(HTA_MEMORY_RE).to_numpy(dtype=bool)
    not_comp = cats.str.match(HTA_NOT_COMPUTE_RE).to_numpy(dtype=bool)
    return np.where(comm, COMMUNICATION, np.where(mem, MEMORY, np.where(~not_comp, COMPUTATION, OTHER)))


def hta_kernel_type(names: pd.Series) -> np.ndarray:
    """HTA 0.5.0's kernel type of each name: COMPUTATION 0, COMMUNICATION 1, MEMORY 2, OTHER 3."""
    return _per_name(names, _hta_type_of).astype(np.int8)


def _launch_ts(trace: RankTrace, kind: str, n: int) -> np.ndarray:
    """Start of the runtime call that launched each row of the frame (NaN when not linked)."""
    out = np.full(n, np.nan)
    links = trace.links
    if n and len(links):
        sel = links[links["gpu_kind"] == kind]
        if len(sel):
            idx = sel["gpu_idx"].to_numpy()
            ok = (idx >= 0) & (idx < n)
            # read the launch time from the runtime frame (links.launch_ts is not moved when the
            # bundle puts ranks on a common origin)
            rt_idx = sel["runtime_idx"].to_numpy()
            rt_ts = trace.runtime["ts"].to_numpy(dtype=np.float64)
            ok &= (rt_idx >= 0) & (rt_idx < len(rt_ts))
            out[idx[ok]] = rt_ts[rt_idx[ok]]
    return out


def device_events(trace: RankTrace) -> pd.DataFrame:
    """Every device activity with a stream (kernels, memcpy, memset, cuda_sync) in one table:
    ts, end, stream, device, correlation, src, hta (HTA kernel type), comm (hermes), launch_ts,
    row (row index in the source frame)."""
    parts = []
    k = trace.kernels
    if len(k):
        comm = np.zeros(len(k), dtype=bool)
        coll = trace.collectives
        if len(coll):
            idx = coll.loc[coll["source"] == "kernel", "kernel_idx"].to_numpy()
            idx = idx[(idx >= 0) & (idx < len(k))]
            comm[idx] = True
        comm |= _per_name(k["name"], lambda c: c.str.contains(COMM_NAME_RE).to_numpy(dtype=bool)).astype(bool)
        parts.append((k, np.full(len(k), SRC_KERNEL), comm, _launch_ts(trace, "kernel", len(k))))
    m = trace.memcpy
    if len(m):
        src = np.where(m["op"].astype(str).to_numpy() == "memset", SRC_MEMSET, SRC_MEMCPY)
        parts.append((m, src, np.zeros(len(m), dtype=bool), _launch_ts(trace, "memcpy", len(m))))
    s = trace.syncs
    if len(s):
        no_comm = np.zeros(len(s), dtype=bool)
        parts.append((s, np.full(len(s), SRC_SYNC), no_comm, _launch_ts(trace, "sync", len(s))))
    if not parts:
        return pd.DataFrame({c: np.zeros(0) for c in EVENT_COLUMNS})
    out = pd.DataFrame(
        {
            "ts": np.concatenate([f["ts"].to_numpy(dtype=np.float64) for f, *_ in parts]),
            "end": np.concatenate([f["end"].to_numpy(dtype=np.float64) for f, *_ in parts]),
            "stream": np.concatenate([f["stream"].to_numpy(dtype=np.int64) for f, *_ in parts]),
            "device": np.concatenate([f["device"].to_numpy(dtype=np.int64) for f, *_ in parts]),
            "correlation": np.concatenate([f["correlation"].to_numpy(dtype=np.int64) for f, *_ in parts]),
            "src": np.concatenate([p[1] for p in parts]).astype(np.int8),
            "hta": np.concatenate([hta_kernel_type(f["name"]) for f, *_ in parts]),
            "comm": np.concatenate([p[2] for p in parts]),
            "launch_ts": np.concatenate([p[3] for p in parts]),
            "row": np.concatenate([np.arange(len(f)) for f, *_ in parts]),
        }
    )
    # HTA: a GPU event is one whose stream is not -1
    return out[out["stream"].to_numpy() != -1].reset_index(drop=True)


def hta_last_step_start(trace: RankTrace) -> float | None:
    """HTA's step filter bound: start of the last ProfilerStep when the rank's events carry at
    least two distinct names containing "ProfilerStep" (else None: HTA keeps everything)."""
    names: set[str] = set()
    last = -np.inf
    for df in (trace.annotations, trace.gpu_annotations):
        if not len(df):
            continue
        hit = _per_name(df["name"], lambda c: c.str.contains("ProfilerStep", regex=False).to_numpy(bool))
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


def _ratio(x: float, d: float) -> float:
    if d <= 0:
        return 0.0
    return float(min(max(x / d, 0.0), 1.0))


def _opt_ratio(x: float, d: float) -> float | None:
    return None if d <= 0 else _ratio(x, d)


# --------------------------------------------------------------------------- the sets


def _blocking_runtime(rt: pd.DataFrame) -> np.ndarray:
    """Runtime calls during which the host waits for the device: synchronize calls and the
    synchronous (non-Async) memcpy calls."""
    kind = rt["kind"].astype(str).to_numpy()
    is_async = _per_name(rt["name"], lambda c: c.str.contains("async", case=False).to_numpy(bool)).astype(bool)
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
    return _per_name(ann["name"], lambda c: c.str.startswith(GLOO_PREFIX).to_numpy(dtype=bool)).astype(bool)


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


# --------------------------------------------------------------------------- HTA definitions


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


# --------------------------------------------------------------------------- the analyzer


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
            gpu_idle_ratio=_ratio(gpu_idle, dur), gpu_compute_ratio=_ratio(gpu_comp, dur),
            gpu_non_compute_ratio=_ratio(gpu_non, dur),
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
        compute_only_ratio=_ratio(compute_only, dur),
        comm_only_ratio=_ratio(comm_only, dur),
        host_only_ratio=_ratio(host_only, dur),
        compute_comm_overlap_ratio=_ratio(cc, dur),
        compute_host_overlap_ratio=_ratio(ch, dur),
        free_ratio=_ratio(free, dur),
        compute_us=compute,
        memory_us=memory,
        comm_us=comm,
        host_us=host,
        device_busy_us=device,
        overlap_us=overlap,
        overlap_ratio=_opt_ratio(overlap, mh) if has_device and device > 0 else None,
        comm_hidden_ratio=_opt_ratio(cc, comm) if has_device else None,
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


def _hta_facts(ctx: RankContext, ev: pd.DataFrame, threshold_us: float) -> list[Fact]:
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
            idle_ratio=_ratio(t["idle"], kt),
            compute_ratio=_ratio(t["compute"], kt),
            non_compute_ratio=_ratio(t["non_compute"], kt),
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
                overlap_ratio=_ratio(o["overlap"], o["comm"]),
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
                    host_wait_ratio=_opt_ratio(float(row.host_wait), tot),
                    kernel_wait_ratio=_opt_ratio(float(row.kernel_wait), tot),
                    other_ratio=_opt_ratio(float(row.other), tot),
                    host_wait_count=int(row.host_wait_n),
                    kernel_wait_count=int(row.kernel_wait_n),
                    other_count=int(row.other_n),
                    events_count=int(row.events),
                    evidence=Evidence(time_ranges_us=[(float(row.start), float(row.end))],
                                      counts={"events": int(row.events)}, note=note),
                )
            )  # fmt: skip
    return facts


def per_rank(ctx: RankContext, threshold_us: float = KERNEL_WAIT_THRESHOLD_US) -> list[Fact]:
    ev = device_events(ctx.trace)
    facts = _step_facts(ctx, ev)
    if len(ev):
        facts.extend(_hta_facts(ctx, ev, threshold_us))
    return facts
