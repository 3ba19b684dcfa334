"""What profiling cost the captured steps: the monitor's step records (wall clock at each step's
end, and its length) matched to the capture's step windows on the same clock.

A Kineto capture with Python stacks records every Python call and every operator, and the time
that takes lands inside the trace's own operators and Python frames. The monitor times every
step, profiled or not, so for a run directory hermes can say how much longer the profiled steps
took (``profiler_overhead``) and keep that time from being read as a cost of the real run. The
same holds for time the training thread spent runnable but waiting for a CPU (the monitor's
run-queue share): the trace shows it as whatever frame was active. ``untraced_host_time`` gets
``python_own_us`` = its Python time minus both (all of them assumed to sit in Python frames, the
cautious choice for a case whose only evidence is Python time). Formulas and doubts:
docs/analysis/monitor.md.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.io import UntracedHostTime
from hermes_kb.facts.monitor import MonitorCpu, ProfilerOverhead
from hermes_kb.facts.steps import StepTime
from hermes_kb.monitor.reader import RankLog

WARMUP = 2  # the monitor's first steps are left out of the unprofiled steps, as in analyzers/monitor/series.py
MIN_UNPROFILED = 3
QUANTILE = 25  # percent: the step time compared between profiled and unprofiled steps
OVERLAP = 0.5  # a monitor step is profiled when half of it lies inside the capture's step windows


HOST_AHEAD = 1.1  # a step whose device time exceeds its wall time by this: the host ran ahead
MIN_PACE_STEPS = 3


def device_times(log: RankLog) -> np.ndarray:
    """Each monitor step's device time (s; NaN where the monitor read none back)."""
    return np.array([log.device_s.get(int(s), np.nan) for s in log.step], dtype=np.float64)


def _host_pace(wall: np.ndarray, dev: np.ndarray) -> float | None:
    """The host's own time per step among these monitor steps: where the device lagged behind
    (its time over HOST_AHEAD x the wall time: the launch queue was not full and the host never
    waited), the wall time is the host's pace (median); else the host set the pace itself, or the
    device hid it, and the lower quartile of max(wall, device) is an upper bound of it."""
    ahead = np.isfinite(dev) & (dev > HOST_AHEAD * wall)
    if ahead.sum() >= MIN_PACE_STEPS:
        return float(np.median(wall[ahead]))
    eff = np.fmax(wall, np.where(np.isfinite(dev), dev, wall))
    return float(np.percentile(eff, QUANTILE)) if len(eff) >= MIN_PACE_STEPS else None


def profiler_host_scale(log: RankLog, trace) -> float | None:
    """How much of the host's time in the captured steps the profiler added, from the monitor's
    records: the host's pace (``_host_pace``) in the steps outside the capture over its pace in the
    steps inside it (the profiler drains the device when it starts, so a host faster than its
    device runs ahead there and shows its own pace). 1 or more: the profiler added nothing
    measurable. None when the clocks do not meet or too few steps remain."""
    wall = np.asarray(log.wall_s, dtype=np.float64)
    end = np.asarray(log.end_s, dtype=np.float64)
    marks = trace.steps
    if len(wall) < WARMUP + 2 * MIN_PACE_STEPS or len(end) != len(wall) or not len(marks) \
            or not trace.meta.base_time_ns:  # fmt: skip
        return None
    dev = device_times(log)
    lo = (trace.meta.origin_us + float(marks["ts"].min())) / 1e6
    hi = (trace.meta.origin_us + float(marks["end"].max())) / 1e6
    inside = (end >= lo) & (end - wall <= hi)
    if not inside.any():
        return None
    first = int(np.flatnonzero(inside)[0])
    inside[first] = False  # the profiler's start drained the device inside it
    after = int(np.flatnonzero(inside)[-1]) + 1 if inside.any() else first + 1
    keep = ~inside & np.isfinite(end)
    keep[first:after + 2] = False  # the capture's start, export and drain
    keep[:WARMUP] = False
    p, u = _host_pace(wall[inside], dev[inside]), _host_pace(wall[keep], dev[keep])
    return u / p if p and u and p > 0 else None


def overhead_of(rank: int, log: RankLog, windows_abs_us: list[tuple[float, float]],
                captured: tuple[int, int] | None = None) -> ProfilerOverhead | None:  # fmt: skip
    """The fact for one rank, or None when no step is found profiled or too few unprofiled steps
    remain. Profiled steps are found on the wall clock; when the clocks do not meet (a trace
    without baseTimeNanoseconds), ``captured`` (first, last step of the monitor's own capture
    record) names them instead."""
    if not len(log.wall_s):
        return None
    steps = np.asarray(log.step)
    # a step lasts the longer of the host's wall time and the device's (CUDA events at the step
    # boundaries): a host running ahead of a device-bound GPU ends its steps early
    wall = np.fmax(np.asarray(log.wall_s, dtype=np.float64), device_times(log)) * 1e6
    end = np.asarray(log.end_s, dtype=np.float64) * 1e6 if len(log.end_s) == len(wall) else np.full(len(wall), np.nan)
    covered = np.zeros(len(wall))
    for a, b in windows_abs_us:
        covered += np.clip(np.minimum(end, b) - np.maximum(end - wall, a), 0.0, None)
    known = np.isfinite(end)
    profiled = known & (covered >= OVERLAP * np.maximum(wall, 1e-9))
    unprofiled = known & (covered == 0)
    if profiled.any():
        after = int(np.flatnonzero(profiled)[-1]) + 1  # the step after the capture pays for writing the trace
        unprofiled[after:after + 1] = False
    elif captured is not None:
        near = (steps >= captured[0]) & (steps <= captured[1] + 1)  # the step after also pays for the export
        profiled, unprofiled = near & (steps <= captured[1]), ~near
    unprofiled[:WARMUP] = False
    if not profiled.any() or unprofiled.sum() < MIN_UNPROFILED:
        return None
    # the lower quartiles, not the medians: a job that stalls every other step (a checkpoint every
    # 2 steps) has half its steps in each mode, and the median of 5-6 profiled steps lands in
    # either (a recorded run read 25.4 ms profiled against 6.2 ms unprofiled: "4.1x"); the regular
    # steps of both sets are what can be compared
    p, u = float(np.percentile(wall[profiled], QUANTILE)), float(np.percentile(wall[unprofiled], QUANTILE))
    if p <= 0 or u <= 0:
        return None
    added = max(p - u, 0.0)
    return ProfilerOverhead(
        rank=rank, profiled_steps_count=int(profiled.sum()), unprofiled_steps_count=int(unprofiled.sum()),
        profiled_step_us=p, unprofiled_step_us=u, added_per_step_us=added, added_ratio=min(added / p, 1.0),
        inflation_factor=p / u,
        evidence=Evidence(
            counts={"monitor_steps": len(end), "capture_windows": len(windows_abs_us)},
            note=f"profiled monitor steps {int(steps[profiled].min())}-{int(steps[profiled].max())}",
        ),
    )  # fmt: skip


def _captured(log: RankLog, source: str | None) -> tuple[int, int] | None:
    """(first, last) profiled step from the monitor's record of the capture written to ``source``."""
    for rec in reversed(log.captures):
        last, n = rec.get("step"), rec.get("steps")
        if source and str(rec.get("trace", "")).endswith(Path(source).name) and isinstance(last, int) and isinstance(n, int):
            return last - n + 1, last
    return None


def with_profiler_overhead(facts: list[Fact], logs: dict[int, RankLog], origins_us: dict[int, float],
                           sources: dict[int, str] | None = None) -> list[Fact]:  # fmt: skip
    """The facts plus one ``profiler_overhead`` per rank whose capture the monitor timed, with each
    of the rank's ``untraced_host_time`` facts told what the profiler added to its window and how
    long the thread waited for a CPU in it (from the rank's ``monitor_cpu``)."""
    sources = sources or {}
    windows: dict[int, list[tuple[float, float]]] = {}
    for f in facts:
        if isinstance(f, StepTime) and f.rank in origins_us:
            o = origins_us[f.rank]
            windows.setdefault(f.rank, []).append((o + f.start_us, o + f.end_us))
    found = {}
    for rank, ws in windows.items():
        log = logs.get(rank)
        if log is not None and (oh := overhead_of(rank, log, ws, _captured(log, sources.get(rank)))) is not None:
            found[rank] = oh
    cpus = {f.rank: f for f in facts if isinstance(f, MonitorCpu)}
    out: list[Fact] = []
    for f in facts:
        if isinstance(f, UntracedHostTime) and (f.rank in found or f.rank in cpus):
            added = f.window_us * (found[f.rank].added_ratio if f.rank in found else 0.0)
            rq = cpus[f.rank].runqueue_wait_ratio if f.rank in cpus else None
            waited = f.window_us * (rq or 0.0)
            own = max(f.python_us - added - waited, 0.0)
            f = f.model_copy(update={
                "profiler_added_us": added, "cpu_wait_us": waited, "python_own_us": own,
                "python_own_ratio": min(own / f.window_us, 1.0) if f.window_us > 0 else 0.0,
            })  # fmt: skip
        out.append(f)
    return out + list(found.values())


__all__ = ["overhead_of", "with_profiler_overhead"]
