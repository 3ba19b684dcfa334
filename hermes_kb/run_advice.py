"""Advice on a monitor RUN_DIR: the rank<R>.jsonl logs of the whole run, plus the newest
rank<R>.capture<ID>.json.gz trace (or torch_npu ``*_ascend_pt`` directory) of each rank when the
run has some (analysed with the normal trace pipeline; their facts join the monitor's). The
environment the monitor recorded fills in what a rank's trace did not record (torch_npu records a
handful of variables, not HCCL_INTRA_*; the monitor every HCCL_*, NCCL_*, ASCEND_*, ... one)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import HermesError, NoTracesError
from .facts.base import Fact
from .monitor.reader import RunLog, is_run_dir, read_run
from .trace import TraceBundle


MONITOR_WARN_SHARE = 0.05  # the monitor's own sampling above this share of the captured steps is worth a warning


@dataclass
class RunAnalysis:
    run: RunLog
    facts: list[Fact]
    bundle: TraceBundle | None = None
    warnings: list[str] = field(default_factory=list)
    replay: dict = field(default_factory=dict)  # rank -> analysis.ReplayState of the captures


def as_run_dir(paths) -> Path | None:
    """The run directory when the input is exactly one directory holding monitor logs."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if len(items) == 1 and is_run_dir(items[0]):
        return Path(items[0])
    return None


def analyze_run_dir(run_dir: str | os.PathLike, *, max_workers: int | None = None) -> RunAnalysis:
    from .analysis import analyze_with_replay
    from .analyzers.loader_cores import with_core_bounds
    from .analyzers.monitor_log import monitor_facts, notes_warnings
    from .analyzers.profiler_overhead import with_profiler_overhead
    from .trace import load

    run = read_run(run_dir)
    if not run.ranks:
        raise NoTracesError("no monitor step records in any rank<R>.jsonl", str(run_dir))
    warnings = list(run.warnings)
    facts = monitor_facts(run)
    bundle = None
    replay: dict = {}
    newest = [ps[-1] for _, ps in sorted(run.captures.items())]
    if newest:
        try:
            bundle = load([str(p) for p in newest], max_workers=max_workers)
            merge_monitor_env(bundle, run)
            trace_facts, replay = analyze_with_replay(bundle, max_workers=max_workers)
            facts.extend(trace_facts)
            warnings += [f"skipped {p.message}" for p in bundle.problems] + list(bundle.warnings)
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
    warnings += [f"analyzer {f.analyzer} failed on rank {f.rank}: {f.message}"
                 for f in facts if f.kind == "analyzer_error"]  # fmt: skip
    warnings += notes_warnings(run)  # the monitor's automatic captures and their reasons
    warnings = list(dict.fromkeys(warnings))  # each warning once
    return RunAnalysis(run=run, facts=facts, bundle=bundle, warnings=warnings, replay=replay)


def merge_monitor_env(bundle: TraceBundle, run: RunLog) -> None:
    """Add the variables the monitor recorded for a rank to that rank's trace environment, where
    the trace did not record them (the trace's own values win), the host CPU and torch threads
    it recorded, and what the profiler added to the host's time (profiler_overhead.profiler_host_scale)."""
    from .analyzers.profiler_overhead import profiler_host_scale

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


def advise_run_dir(run_dir: str | os.PathLike, *, config=None, engine="auto", top: int | None = None,
                   rank: int | None = None):  # fmt: skip
    return advise_run_dir_full(run_dir, config=config, engine=engine, top=top, rank=rank).report


def advise_run_dir_full(run_dir: str | os.PathLike, *, config=None, engine="auto", top: int | None = None,
                        rank: int | None = None, stage=lambda what: None):  # fmt: skip
    """``advise_run_dir``, keeping the facts and the run log (an ``advisor.Advised``)."""
    from . import __version__
    from .advisor import Advised, _platform, diagnose, knowledge_base
    from .analyzers.monitor_log import platform_of, summary_of
    from .kb.engine import infer
    from .report import Inputs, KbInfo, RankSummary, Report

    stage(f"reading the monitor logs and captures of {Path(run_dir).name}")
    ra = analyze_run_dir(run_dir)
    kb = knowledge_base(config)
    stage("rules and cases")
    inf = infer(kb, ra.facts, engine)
    platform = platform_of(ra.run)
    if ra.bundle is not None and platform == "cpu":
        platform = _platform(ra.bundle)
    stage("findings and gains")
    findings, combined, left = diagnose(inf, kb, platform, ra.replay, rank=rank, top=top)
    captured = {f.rank: f for f in ra.facts if f.kind == "step_breakdown" and f.step is None}
    summary = [RankSummary(steps=[], **s) for s in summary_of(ra.run, captured)]
    if rank is not None:
        summary = [s for s in summary if s.rank == rank]
    skipped = [p.path for p in ra.bundle.problems] if ra.bundle is not None else []
    report = Report(
        hermes_version=__version__,
        inputs=Inputs(sources=ra.run.sources, ranks=sorted(ra.run.ranks), skipped=skipped),
        summary=summary,
        findings=findings,
        combined=combined,
        unexplained=left,
        kb=KbInfo(rules=len(kb.active_rules()), cases=len(kb.active_cases()), engine=inf.engine),
        warnings=ra.warnings,
    )
    return Advised(report=report, facts=ra.facts, bundle=ra.bundle, run=ra.run)
