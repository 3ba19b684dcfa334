"""The analysis of a monitor RUN_DIR: the rank<R>.jsonl logs of the whole run, plus the newest
rank<R>.capture<ID>.json.gz trace (or torch_npu ``*_ascend_pt`` directory) of each rank when the
run has some (analysed with the normal trace pipeline; their facts join the monitor's). The
environment the monitor recorded fills in what a rank's trace did not record (torch_npu records a
handful of variables, not HCCL_INTRA_*; the monitor every HCCL_*, NCCL_*, ASCEND_*, ... one)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import HermesError, NoTracesError
from ..facts.base import Fact
from ..monitor.reader import RunLog, is_run_dir, read_run
from ..trace import TraceBundle


MONITOR_WARN_SHARE = 0.05  # the monitor's own sampling above this share of the captured steps is worth a warning


@dataclass
class RunAnalysis:
    run: RunLog
    facts: list[Fact]
    bundle: TraceBundle | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # informational: what the monitor did (Report.notes)
    replay: dict = field(default_factory=dict)  # rank -> analysis.ReplayState of the captures
    left_out: list[str] = field(default_factory=list)  # captures not of this run (foreign_captures)


def as_run_dir(paths) -> Path | None:
    """The run directory when the input is exactly one directory holding monitor logs."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if len(items) == 1 and is_run_dir(items[0]):
        return Path(items[0])
    return None


def analyze_run_dir(run_dir: str | os.PathLike, *, max_workers: int | None = None) -> RunAnalysis:
    from ..analyzers.monitor.loader_cores import with_core_bounds
    from ..analyzers.monitor.notes import warnings_and_notes
    from ..analyzers.monitor.profiler_overhead import with_profiler_overhead
    from ..analyzers.monitor.run_log import monitor_facts
    from ..trace import load
    from .run import analyze_with_replay, excluded_step_warnings

    run = read_run(run_dir)
    if not run.ranks:
        raise NoTracesError("no monitor step records in any rank<R>.jsonl", str(run_dir))
    warnings = list(run.warnings)
    facts = monitor_facts(run)
    bundle = None
    replay: dict = {}
    left_out: list[str] = []
    newest = [ps[-1] for _, ps in sorted(run.captures.items())]
    if newest:
        try:
            bundle = load([str(p) for p in newest], max_workers=max_workers)
            left_out = foreign_captures(bundle, run)
            warnings += left_out
            if bundle.ranks:
                merge_monitor_env(bundle, run)
                trace_facts, replay = analyze_with_replay(bundle, max_workers=max_workers)
                facts.extend(trace_facts)
                warnings += [f"skipped {p.message}" for p in bundle.problems] + list(bundle.warnings)
            else:
                bundle = None
        except HermesError as err:
            warnings.append(f"captured traces not analysed: {err}")
    if bundle is not None:
        origins = {r: t.meta.origin_us for r, t in bundle.ranks.items()}
        facts = with_profiler_overhead(facts, run.ranks, origins, {r: t.meta.source for r, t in bundle.ranks.items()})
    facts = with_core_bounds(facts)
    warnings += [f"rank {f.rank}: profiling slowed the captured steps {f.inflation_factor:.2f}x ({f.profiled_step_us / 1e3:,.2f} ms "
                 f"against {f.unprofiled_step_us / 1e3:,.2f} ms unprofiled); operator and Python times in the capture "
                 f"include that overhead" for f in facts if f.kind == "profiler_overhead" and f.inflation_factor >= 1.2]
    warnings += [f"rank {f.rank}: hermes' own monitor took {f.monitor_us / f.window_us:.0%} of the captured steps "
                 f"({f.monitor_us / 1e3:,.2f} ms of {f.window_us / 1e3:,.2f} ms, not counted as the loop's Python); "
                 f"sample less often (Monitor(sample_every=..., procs_every_s=...))"
                 for f in facts if f.kind == "untraced_host_time" and f.step is None and f.window_us > 0
                 and f.monitor_us >= MONITOR_WARN_SHARE * f.window_us]  # fmt: skip
    warnings += [f"rank {f.rank}: {f.outlier_steps_count} monitored step(s) over 1,000x the median step left out "
                 "(a suspended process or a clock jump, not work)" for f in facts
                 if f.kind == "monitor_steps" and f.outlier_steps_count]  # fmt: skip
    warnings += [f"analyzer {f.analyzer} failed on rank {f.rank}: {f.message}"
                 for f in facts if f.kind == "analyzer_error"]  # fmt: skip
    warnings += excluded_step_warnings(facts)
    # the monitor's automatic captures and their reasons, MFU's source, the domains: mostly notes
    monitor_warnings, notes = warnings_and_notes(run)
    warnings += monitor_warnings
    warnings = list(dict.fromkeys(warnings))  # each warning once
    return RunAnalysis(run=run, facts=facts, bundle=bundle, warnings=warnings, notes=notes, replay=replay,
                       left_out=left_out)


def foreign_captures(bundle: TraceBundle, run: RunLog) -> list[str]:
    """Leave out of ``bundle`` the captures another process made: the rank's log records the pid of
    the training process, and a capture of that run holds host events of that pid (a trace copied
    in from another job, a twin run or another machine does not). A rank whose log records no pid,
    or whose capture holds no host event, is kept."""
    out = []
    for rank in sorted(bundle.ranks):
        trace = bundle.ranks[rank]
        log = run.ranks.get(rank)
        pid = (log.environment or {}).get("pid") if log is not None else None
        ops = trace.cpu_ops
        why = None
        if isinstance(pid, int) and len(ops) and "pid" in ops.columns:
            pids = set(ops["pid"].astype("int64").unique().tolist())
            if pid not in pids:
                shown = ", ".join(str(p) for p in sorted(pids)[:3])
                why = f"its host events are of process {shown}, rank {rank}'s log is of process {pid}"
        if why is None and log is not None:
            why = _outside_the_log(trace, log)
        if why is not None:
            del bundle.ranks[rank]
            out.append(f"{trace.meta.source}: not a capture of this run ({why}): left out")
    return out


def _outside_the_log(trace, log) -> str | None:
    """Why the capture's wall-clock time cannot be a stretch of the steps this log recorded (the
    same process can profile two runs, e.g. a scenario's bad variant and then its fixed twin), or
    None. Needs the trace's absolute clock (baseTimeNanoseconds) and the steps' end times."""
    import numpy as np

    ends = np.asarray(log.end_s, dtype=np.float64)
    walls = np.asarray(log.wall_s, dtype=np.float64)
    ok = np.isfinite(ends) & np.isfinite(walls)
    origin = trace.meta.origin_us / 1e6 if trace.meta.origin_us else 0.0
    if ok.sum() < 2 or origin < EPOCH_2001_S:  # no absolute clock on one side
        return None
    lo, hi = float((ends[ok] - walls[ok]).min()), float(ends[ok].max())
    slack = max(1.0, 10.0 * float(np.median(walls[ok])))
    span = trace.time_span()  # on the bundle's clock, whose zero is origin_us
    start, end = origin + span[0] / 1e6, origin + span[1] / 1e6
    if end < lo - slack or start > hi + slack:
        return (f"it was recorded {_when(start - hi if start > hi else lo - end)} "
                f"{'after' if start > hi else 'before'} the steps the log holds")
    return None


EPOCH_2001_S = 978307200.0  # a trace clock below this is relative, not the wall clock


def _when(s: float) -> str:
    return f"{s:,.1f} s" if s < 3600 else f"{s / 3600:,.1f} h"


def merge_monitor_env(bundle: TraceBundle, run: RunLog) -> None:
    """Add the variables the monitor recorded for a rank to that rank's trace environment, where
    the trace did not record them (the trace's own values win), the host CPU and torch threads
    it recorded, and what the profiler added to the host's time (profiler_overhead.profiler_host_scale)."""
    from ..analyzers.monitor.profiler_overhead import profiler_host_scale

    for rank, trace in bundle.ranks.items():
        log = run.ranks.get(rank)
        rec = (log.environment if log is not None else None) or {}
        for k, v in (rec.get("env") or {}).items():
            trace.meta.env.setdefault(str(k), str(v))
        if isinstance(rec.get("cpu"), dict):
            trace.meta.host_cpu = dict(rec["cpu"])
            if isinstance(rec.get("affinity"), list) and rec["affinity"]:
                trace.meta.host_cpu["usable_cores"] = len(rec["affinity"])
        if isinstance(rec.get("torch_threads"), int):
            trace.meta.torch_threads = rec["torch_threads"]
        if log is not None:
            trace.meta.profiler_host_scale = profiler_host_scale(log, trace)


def run_platform(ra: RunAnalysis) -> str:
    """The run's platform: from the monitor's device records, refined by the captures."""
    from ..analyzers.monitor.run_log import platform_of as run_log_platform
    from ..trace.bundle import platform_of

    platform = run_log_platform(ra.run)
    if ra.bundle is not None and platform == "cpu":
        platform = platform_of(ra.bundle)
    return platform


def run_summary(ra: RunAnalysis) -> list[dict]:
    """Per rank: steps, mean step and its breakdown over the whole run (RankSummary fields)."""
    from ..analyzers.monitor.run_log import summary_of

    captured = {f.rank: f for f in ra.facts if f.kind == "step_breakdown" and f.step is None}
    return summary_of(ra.run, captured)


def step_series(log) -> list[tuple[int, float, str | None, float | None]]:
    """A monitor rank log's steps as (step, µs, spike cause, excess µs) with the monitor
    analyzer's own spike test (the HTML report's step chart)."""
    from ..analyzers.monitor.steps import step_series as series

    return series(log)

