"""Steps and spikes from the monitor's logs, per rank: ``monitor_steps`` (step-time statistics
and where the step goes), ``monitor_page_faults`` (system time and page faults per step, inside
and outside optimizer.step()) and ``monitor_spikes`` (spikes against a centred rolling median /
MAD, their cost and period, and what they coincide with); ``step_series`` gives the HTML report's
step chart with the same spike test."""

from __future__ import annotations

import re

import numpy as np

from hermes_kb.facts.base import Evidence
from hermes_kb.facts.monitor import MonitorPageFaults, MonitorSpikes, MonitorSteps

from .series import OUTLIER_RATIO, Series, finite_num, mfu_note, nan_median, none_if_nan

ROLL = 33  # centred rolling window of the spike test, in steps
SPIKE_K = 5.0
MAD_SCALE = 1.4826
MIN_REL = 0.10  # a spike is at least 10% above its rolling median (MAD can be ~0 on regular loops)
ATTRIBUTE = 0.5  # a cause explains a spike when it accounts for half its excess
WITH = 0.25  # a spike "comes with" GC / data wait when that part is a quarter of its excess
REGULAR = 0.6  # spikes are periodic when 60% of the intervals are within max(1, 10%) of the median
PAGE_BYTES = 4096  # the log does not record the page size; 4 KiB on x86-64 and most arm64 Linux
CHECKPOINT_RE = re.compile(r"ckpt|checkpoint|save", re.IGNORECASE)


def steps_fact(rank: int, s: Series, notes: list[dict] | None = None) -> MonitorSteps:
    total = float(s.wall.sum())
    names = sorted({k for e in s.events.values() for k in e})
    comm_ok = ~np.isnan(s.comm)
    comm = float(np.median(s.comm[comm_ok])) if comm_ok.sum() >= max(3, len(s) // 2) else None
    mfu = nan_median(s.mfu)
    m = mfu_note(notes or [])
    source = None
    if m is not None:
        source = f"FLOPs: {m.get('source')}; peak: {m.get('peak_source')}"
    elif not np.isnan(mfu):
        source = "FLOPs and peak given (Monitor(flops_per_step=..., peak_flops=...))"
    return MonitorSteps(
        rank=rank,
        steps_count=len(s),
        warmup_steps_count=s.warmup,
        warmup_detected=s.detected,
        excluded_steps_count=s.excluded,
        outlier_steps_count=s.outliers,
        median_us=float(np.median(s.wall)),
        mean_us=float(s.wall.mean()),
        p95_us=float(np.percentile(s.wall, 95)),
        max_us=float(s.wall.max()),
        total_us=total,
        data_wait_us=float(s.dw.mean()),
        data_wait_ratio=min(float(s.dw.sum()) / total, 1.0) if total > 0 else 0.0,
        gc_us=float(s.gc.mean()),
        gc_ratio=min(float(s.gc.sum()) / total, 1.0) if total > 0 else 0.0,
        gc_gen2_count=int(s.gen2.sum()),
        compute_us=float(np.median(s.compute)),
        comm_us=comm,
        comm_ratio=min(float(s.comm[comm_ok].sum()) / float(s.wall[comm_ok].sum()), 1.0) if comm is not None else None,
        cpu_us=none_if_nan(nan_median(s.cpu)),
        device_us=none_if_nan(nan_median(s.device)) if len(s.device) else None,
        samples_per_s=none_if_nan(nan_median(s.sps)),
        mfu_ratio=none_if_nan(min(mfu, 1.0)) if not np.isnan(mfu) else None,
        step_flops=finite_num(m.get("flops_per_step")) if m else None,
        peak_flops_per_s=finite_num(m.get("peak_flops")) if m else None,
        mfu_source=source,
        events=names[:20],
        online_fluctuations_count=int(s.flags.sum()),
        evidence=Evidence(note=f"steps {int(s.step[0])}-{int(s.step[-1])} of the monitor log"
                          + (f" (warm-up detected: {s.warmup} steps)" if s.detected else "")
                          + (f"; {s.excluded - s.outliers} step(s) the monitor slowed left out"
                             if s.excluded - s.outliers else "")
                          + (f"; {s.outliers} step(s) over {OUTLIER_RATIO:,.0f}x the median left out (a pause or a "
                             "clock jump)" if s.outliers else "")),
    )


def fault_fact(rank: int, s: Series) -> MonitorPageFaults | None:
    """Means, not medians: an allocator that returns memory every few steps faults in bursts."""
    ok = ~np.isnan(s.sys) & ~np.isnan(s.flt)
    if ok.sum() < 3:
        return None
    wall, sys_us, flt = s.wall[ok], float(s.sys[ok].mean()), float(s.flt[ok].mean())
    step = float(wall.mean())
    hooked = not np.isnan(s.opt).all()  # NaN: no step() in that step (accumulation) or no hooks
    opt = float(np.nan_to_num(s.opt[ok]).mean()) if hooked else None
    opt_sys = float(np.nan_to_num(s.opt_sys[ok]).mean()) if hooked else None
    return MonitorPageFaults(
        rank=rank, steps_count=int(ok.sum()), mean_step_us=step, faults_per_step=flt,
        faulted_mb_per_step=flt * PAGE_BYTES / 1e6, sys_us=sys_us, sys_ratio=min(sys_us / step, 1.0) if step > 0 else 0.0,
        sys_us_per_fault=sys_us / flt if flt >= 1 else None,
        optimizer_us=opt, optimizer_ratio=min(opt / step, 1.0) if opt is not None and step > 0 else None,
        optimizer_sys_us=opt_sys,
        optimizer_faults_per_step=float(np.nan_to_num(s.opt_flt[ok]).mean()) if hooked else None,
        outside_optimizer_sys_us=max(sys_us - opt_sys, 0.0) if opt_sys is not None else None,
        evidence=Evidence(note=f"steps {int(s.step[ok][0])}-{int(s.step[ok][-1])} of the monitor log; getrusage per step"),
    )  # fmt: skip


def rolling_median_mad(x: np.ndarray, window: int = ROLL) -> tuple[np.ndarray, np.ndarray]:
    """Median and MAD of a centred window of ``window`` steps (shifted inside at the edges)."""
    n = len(x)
    if n <= window:
        m = float(np.median(x))
        return np.full(n, m), np.full(n, float(np.median(np.abs(x - m))))
    win = np.lib.stride_tricks.sliding_window_view(x, window)
    med = np.median(win, axis=1)
    mad = np.median(np.abs(win - med[:, None]), axis=1)
    idx = np.clip(np.arange(n) - window // 2, 0, n - window)
    return med[idx], mad[idx]


def _period(steps: np.ndarray) -> tuple[float | None, float | None]:
    if len(steps) < 3:
        return None, None
    gaps = np.diff(steps).astype(np.float64)
    p = float(np.median(gaps))
    regular = float(np.mean(np.abs(gaps - p) <= max(1.0, 0.1 * p)))
    return (p if regular >= REGULAR else None), regular


def spike_facts(rank: int, s: Series) -> list[MonitorSpikes]:
    n = len(s)
    if n < 3:
        return []
    med, mad = rolling_median_mad(s.wall)
    spike = s.wall > med + np.maximum(SPIKE_K * MAD_SCALE * mad, MIN_REL * med)
    excess = np.where(spike, s.wall - med, 0.0)
    idx = np.flatnonzero(spike)
    dw_med = float(np.median(s.dw))
    parts: dict[str, np.ndarray] = {
        "gc": np.minimum(s.gc, excess),
        "checkpoint": np.zeros(n),
        "marked_event": np.zeros(n),
        "data_wait": np.minimum(np.maximum(s.dw - dw_med, 0.0), excess),
    }
    pos = {int(st): i for i, st in enumerate(s.step)}
    for st, evs in s.events.items():
        i = pos.get(st)
        if i is None:
            continue
        for name, sec in evs.items():
            key = "checkpoint" if CHECKPOINT_RE.search(name) else "marked_event"
            parts[key][i] += (sec if not np.isnan(sec) else 0.0) * 1e6
    names = list(parts)
    stack = np.vstack([np.minimum(parts[k], excess) for k in names])
    best = np.argmax(stack, axis=0)
    best_val = stack[best, np.arange(n)]
    cause = np.where(best_val >= ATTRIBUTE * excess, best, len(names))  # len(names): unexplained
    total = float(s.wall.sum())
    mean = float(s.wall.mean())

    def fact(label: str, sel: np.ndarray) -> MonitorSpikes:
        ex = excess[sel]
        steps = s.step[sel]
        evs = sorted({k for st in steps for k in s.events.get(int(st), {})})
        cnt = len(sel)
        period, regular = _period(steps)
        order = sel[np.argsort(-excess[sel])][:5]
        return MonitorSpikes(
            rank=rank,
            cause=label,
            steps_count=n,
            spikes_count=cnt,
            spike_steps=[int(x) for x in steps[:10]],
            excess_us=float(ex.sum()),
            excess_per_step_us=float(ex.sum()) / n,
            excess_ratio=min(float(ex.sum()) / total, 1.0) if total > 0 else 0.0,
            mean_step_us=mean,
            largest_excess_us=float(ex.max()) if cnt else 0.0,
            period_steps=period,
            period_regularity_ratio=regular,
            with_gc_ratio=float(np.mean(s.gc[sel] >= WITH * ex)) if cnt else 0.0,
            with_gen2_ratio=float(np.mean(s.gen2[sel] > 0)) if cnt else 0.0,
            with_event_ratio=float(np.mean([int(st) in s.events for st in steps])) if cnt else 0.0,
            with_data_wait_ratio=float(np.mean(parts["data_wait"][sel] >= WITH * ex)) if cnt else 0.0,
            events=evs[:10],
            evidence=Evidence(note="largest spikes: " + ", ".join(
                f"step {int(s.step[i])} {s.wall[i] / 1e3:.1f} ms vs median {med[i] / 1e3:.1f} ms" for i in order)),
        )  # fmt: skip

    out = [fact("all", idx)]
    for c, label in enumerate([*names, "unexplained"]):
        sel = idx[cause[idx] == c]
        if len(sel):
            out.append(fact(label, sel))
    return out


def step_series(log) -> list[tuple[int, float, str | None, float | None]]:
    """A rank log's steps after warm-up as (step, µs, spike cause or None, excess µs or None):
    spikes by this analyzer's own test and attribution (rolling median and MAD, the largest of
    GC, checkpoint, marked events, data wait explaining half the excess). The HTML report's
    step chart."""
    s = Series(log)
    n = len(s)
    if n == 0:
        return []
    spike = np.zeros(n, dtype=bool)
    excess = np.zeros(n)
    cause = np.full(n, None, dtype=object)
    if n >= 3:
        med, mad = rolling_median_mad(s.wall)
        spike = s.wall > med + np.maximum(SPIKE_K * MAD_SCALE * mad, MIN_REL * med)
        excess = np.where(spike, s.wall - med, 0.0)
        dw_med = float(np.median(s.dw))
        parts = {"gc": np.minimum(s.gc, excess), "checkpoint": np.zeros(n), "marked_event": np.zeros(n),
                 "data_wait": np.minimum(np.maximum(s.dw - dw_med, 0.0), excess)}  # fmt: skip
        pos = {int(st): i for i, st in enumerate(s.step)}
        for st, evs in s.events.items():
            i = pos.get(st)
            if i is None:
                continue
            for name, sec in evs.items():
                key = "checkpoint" if CHECKPOINT_RE.search(name) else "marked_event"
                parts[key][i] += (sec if not np.isnan(sec) else 0.0) * 1e6
        names = list(parts)
        stack = np.vstack([np.minimum(parts[k], excess) for k in names])
        best = np.argmax(stack, axis=0)
        best_val = stack[best, np.arange(n)]
        for i in np.flatnonzero(spike):
            cause[i] = names[best[i]] if best_val[i] >= ATTRIBUTE * excess[i] else "unexplained"
    return [(int(s.step[i]), float(s.wall[i]), cause[i], float(excess[i]) if spike[i] else None) for i in range(n)]
