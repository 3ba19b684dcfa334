"""Each rank's summary row: its steps and its step breakdown."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from ..facts.base import Fact
from ..facts.breakdown import COMPONENTS, StepBreakdown
from ..facts.program import PHASES, ProgramPhases
from ..trace import TraceBundle
from .report import RankSummary, StepSummary


def breakdown_summary(f: StepBreakdown | None) -> dict[str, Any]:
    """RankSummary fields from a rank's aggregate step breakdown."""
    if f is None:
        return {}
    return {
        "breakdown_us": {f"{k}_us": round(float(getattr(f, f"{k}_us")), 3) for k in COMPONENTS},
        "critical_component": f.critical_component,
        "critical_ratio": round(f.critical_ratio, 4),
        "device_kind": f.device,
    }


def phases_summary(f: ProgramPhases | None, step_us: float | None = None) -> dict[str, Any]:
    """RankSummary fields from a rank's aggregate program phases: means per analysed step, or,
    given ``step_us`` (a monitor run's mean step, the capture's steps being a few profiled ones),
    the phases' shares of the captured steps applied to it."""
    if f is None or f.steps_count <= 0 or f.window_us <= 0:
        return {}
    step = float(step_us) if step_us else f.window_us / f.steps_count
    scale = step / f.window_us
    out: dict[str, Any] = {"phases_us": {f"{p}_us": round(float(getattr(f, f"{p}_us")) * scale, 3) for p in PHASES},
                           "phases_sources": list(f.sources) + (["shares of the captured steps"] if step_us else [])}  # fmt: skip
    if f.top_function:
        out.update(program_site=f.top_function, program_site_us=round(f.top_function_ratio * step, 3),
                   program_site_ratio=round(f.top_function_ratio, 4))  # fmt: skip
    return out


def rank_summaries(bundle: TraceBundle, facts: list[Fact]) -> list[RankSummary]:
    steps_of: dict[int | None, list[StepSummary]] = defaultdict(list)
    breakdown_of: dict[int | None, Fact] = {}
    phases_of: dict[int | None, Fact] = {}
    for f in facts:  # one pass: a job has thousands of ranks
        if f.kind == "step_time":
            steps_of[f.rank].append(StepSummary(step=f.step, duration_us=round(f.duration_us, 3)))
        elif f.kind == "step_breakdown" and f.step is None:
            breakdown_of.setdefault(f.rank, f)
        elif f.kind == "program_phases" and f.step is None:
            phases_of.setdefault(f.rank, f)
    out = []
    for t in bundle:
        steps = steps_of.get(t.rank, [])
        bd = breakdown_of.get(t.rank)
        out.append(
            RankSummary(
                rank=t.rank,
                device=t.meta.device_name,
                steps=steps,
                mean_step_us=round(statistics.fmean([s.duration_us for s in steps]), 3) if steps else None,
                **breakdown_summary(bd),
                **phases_summary(phases_of.get(t.rank)),
            )
        )
    return out


__all__ = ["breakdown_summary", "phases_summary", "rank_summaries"]
