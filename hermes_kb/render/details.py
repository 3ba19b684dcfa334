"""Data the HTML report (and ``--format json`` from the CLI) shows besides the findings, taken
from the facts of the same analysis and from the monitor's run log: each rank's step-time series
with its spikes and their causes, the critical path's top operators, the slow rank of each
communication domain. Nothing here measures anew; it selects and reshapes."""

from __future__ import annotations

from typing import Any

from ..analysis.run_dir import step_series
from ..facts.store import of_kinds
from ..facts.base import Fact
from ..advisor.report import PathOp, Report, SlowRank, StepPoint

MAX_POINTS = 2000
# the fact kinds read here
DETAIL_KINDS = ("critical_path", "step_time_series", "monitor_slow_rank", "rank_imbalance", "comm_sync_wait")


def _downsample(points: list[StepPoint], limit: int = MAX_POINTS) -> list[StepPoint]:
    """At most ``limit`` points: per bucket of consecutive steps the longest (spikes survive)."""
    if len(points) <= limit:
        return points
    size = -(-len(points) // limit)
    return [max(points[i : i + size], key=lambda p: (p.spike is not None, p.duration_us))
            for i in range(0, len(points), size)]  # fmt: skip


def _run_series(log) -> list[StepPoint]:
    """A monitor rank log's steps after warm-up, with the monitor analyzer's spikes and causes."""
    return [StepPoint(step=st, duration_us=round(d, 3), spike=cause, excess_us=round(ex, 3) if ex is not None else None)
            for st, d, cause, ex in step_series(log)]  # fmt: skip


def _spike_steps(facts: list[Fact]) -> dict[int | None, set[int]]:
    """Per rank, the steps its window series calls spikes (one pass: jobs have thousands of ranks)."""
    out: dict[int | None, set[int]] = {}
    for f in facts:
        if f.kind == "step_time_series" and f.series == "window":
            out.setdefault(f.rank, set()).update(f.spike_steps)
    return out


def _trace_series(summary, spikes: set[int]) -> list[StepPoint]:
    return [StepPoint(step=s.step, duration_us=s.duration_us, spike="spike" if s.step in spikes else None)
            for s in summary.steps]  # fmt: skip


def slow_ranks(facts: list[Fact]) -> list[SlowRank]:
    """The rank each communication domain waits for: the monitor's slow rank per domain; from a
    trace, the rank with the most work of its own (rank_imbalance non_communication, else step
    time) per process group, and per collective the rank most often last to arrive."""
    out: list[SlowRank] = []
    for f in facts:
        if f.kind == "monitor_slow_rank":
            out.append(SlowRank(domain=f.group, rank=f.rank, source=f.kind, measure=f"median step ({f.cause} excess)",
                                value_us=f.per_rank_step_us.get(f.rank), excess_us=f.excess_us,
                                note=f"{f.ranks_count} ranks; {'synchronised' if f.synchronized else 'not synchronised'}; "
                                     f"{f.data_share_ratio:.0%} of the excess is data wait"))  # fmt: skip
    imb = [f for f in facts if f.kind == "rank_imbalance" and f.component in ("non_communication", "step_time")]
    by_group: dict[Any, Fact] = {}
    for f in imb:
        g = f.process_group
        if g not in by_group or (by_group[g].component == "step_time" and f.component == "non_communication"):
            by_group[g] = f
    for g, f in by_group.items():
        if f.ranks_count < 2:
            continue
        what = "own work per step (step minus communication)" if f.component == "non_communication" else "step time"
        out.append(SlowRank(domain=g or "all", rank=f.max_rank, source=f.kind, measure=what,
                            value_us=f.per_rank_us.get(f.max_rank, f.max_us), excess_us=f.max_excess_us,
                            note=f"{f.ranks_count} ranks; imbalance {f.imbalance_ratio:.0%} (1 - mean/max)"))  # fmt: skip
    for f in facts:
        if f.kind == "comm_sync_wait" and len(f.group_ranks) > 1 and f.instances_count:
            out.append(SlowRank(domain=f"{f.process_group} ({f.collective})", rank=f.slowest_rank, source=f.kind,
                                measure="last to arrive at the collective",
                                note=f"last in {f.slowest_rank_share_ratio:.0%} of {f.instances_count} instances; "
                                     f"R_wait {f.r_wait_weighted_ratio:.0%}"))  # fmt: skip
    return out


def with_details(report: Report, facts: list[Fact], run=None) -> Report:
    """A copy of ``report`` with the optional fields filled: per rank ``series``,
    ``critical_path_us`` and ``critical_path_ops``; ``slow_ranks``."""
    r = report.model_copy(deep=True)
    facts = of_kinds(facts, DETAIL_KINDS)  # a streamed job's store decodes only these
    paths = {f.rank: f for f in facts if f.kind == "critical_path"}
    spikes = _spike_steps(facts)
    for s in r.summary:
        if run is not None and s.rank in run.ranks:
            s.series = _downsample(_run_series(run.ranks[s.rank]))
        else:
            s.series = _downsample(_trace_series(s, spikes.get(s.rank, set())))
        cp = paths.get(s.rank)
        if cp is not None and cp.steps_count:
            n = cp.steps_count
            s.critical_path_us = round(cp.path_length_us / n, 3)
            s.critical_path_ops = [PathOp(name=o.name, category=o.category, time_us=round(o.time_us / n, 3),
                                          share_ratio=o.share_ratio) for o in cp.top_ops]  # fmt: skip
    r.slow_ranks = slow_ranks(facts)
    return r


__all__ = ["MAX_POINTS", "slow_ranks", "with_details"]
