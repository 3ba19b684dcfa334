"""The gain of the first fixes applied together, replayed at once on each rank."""

from __future__ import annotations

import dataclasses
import statistics

from ..analysis.job import JobState, job_removed
from ..analysis.replay import removed_together
from .calibration import calibrate
from .calibration import load as load_calibration
from .findings import MIN_REPORTED_SPEEDUP, calibrated
from .gains import CATEGORY_COMPONENTS, MatchGain
from .report import CombinedGain, Finding, Removable, Speedup


# The fixes together never remove the whole step: when the findings' high ends add up to (nearly)
# all of it (their components cover the step and each high end is optimistic), the estimate says
# only that they account for nearly everything, so the high end stops at 20x (fuzzing found
# 7.8e13x: three high ends summing to the step).
MIN_LEFT_SHARE = 0.05


def combined_gain(findings: list[Finding], plans: dict[str, list[MatchGain]], replay: dict,
                  bds: dict, top: int = 3, job: JobState | None = None) -> CombinedGain | None:  # fmt: skip
    """The gain of applying the first ``top`` fixes together, per rank replayed with all their
    sets shortened at once (no event counted twice), then the median over ranks; findings without a
    replay add their removable time one for one. Never more than the critical-path time of the
    components those fixes act on."""
    chosen = [f for f in findings if f.removable_us is not None and f.removable_us.high > 0
              and f.expected_speedup.high >= MIN_REPORTED_SPEEDUP][:top]  # fmt: skip
    if len(chosen) < 2:
        return None
    ranks = sorted({g.rank for f in chosen for g in plans.get(f.case_id, [])}, key=lambda r: (r is None, r))
    per_rank: list[tuple[float, float, float]] = []
    job_parts: tuple[dict, dict] = ({}, {})
    job_extra: list[tuple[float, float]] = []
    cap_shares: list[float] = []
    for r in ranks:
        mine = [(f, next((g for g in plans.get(f.case_id, []) if g.rank == r), None)) for f in chosen]
        mine = [(f, g) for f, g in mine if g is not None]
        if not mine:
            continue
        # per step, as the findings are (a replay spans the rank's whole analysed window)
        t = max(g.per_step(g.step) for _, g in mine)
        state = replay.get(r)
        lo = hi = 0.0
        parts_lo, parts_hi = [], []
        per = 1
        for f, g in mine:
            amounts = state.amounts.get(g.target) if (state is not None and g.target) else None
            if amounts is None:
                lo, hi = lo + g.per_step(g.lo), hi + g.per_step(g.hi)
                continue
            drops = g.target in state.drop_waits
            parts_lo.append((amounts, g.phi[0], drops))
            parts_hi.append((amounts, g.phi[1], drops))
            lo, hi = lo + g.per_step(g.extra[0]), hi + g.per_step(g.extra[1])
            per = g.per
        if job is not None and r in job.forms:
            job_extra.append((lo, hi))
            if parts_hi:
                job_parts[0][r], job_parts[1][r] = parts_lo, parts_hi
        if parts_hi:
            lo += max(0.0, removed_together(state.model, parts_lo)) / per
            hi += max(0.0, removed_together(state.model, parts_hi)) / per
        bd = bds.get(r)
        if bd is not None:
            comps = {c for f in chosen for c in CATEGORY_COMPONENTS.get(f.category, ("communication", "idle"))}
            if bd.get("device") == "cpu" and any(f.category == "cpu" for f in chosen):
                comps.add("compute")
            cap = t * sum(float(bd.get(f"{c}_ratio") or 0.0) for c in comps)
            lo, hi = min(lo, cap), min(hi, cap)
            cap_shares.append(cap / t if t > 0 else 1.0)
        hi = min(hi, (1.0 - MIN_LEFT_SHARE) * t)
        per_rank.append((t, min(lo, hi), hi))
    if not per_rank:
        return None
    t = statistics.median(x[0] for x in per_rank)
    lo = statistics.median(x[1] for x in per_rank)
    hi = statistics.median(x[2] for x in per_rank)
    where = "on each rank's dependency graph"
    how = "median over ranks"
    joined = None
    if job is not None and job_parts[1]:
        try:
            joined = (job_removed(job, job_parts[0]), job_removed(job, job_parts[1]))
        except Exception as exc:  # a bug in the join costs the combined gain its job view, not the report
            job.errors.append(f"{type(exc).__name__}: {exc}")
    if job is not None and joined is not None:
        # the job: every rank's sets shortened at once, the ranks joined at their collectives
        t = job.step_us
        lo = max(0.0, joined[0]) / job.steps + statistics.median(x[0] for x in job_extra)
        hi = max(0.0, joined[1]) / job.steps + statistics.median(x[1] for x in job_extra)
        # the components' bound is read off the ranks' own breakdowns, which count their waits for
        # peers as communication; together the fixes still remove at least what the best one does
        best = max((f.job.removable_us.high for f in chosen if f.job is not None), default=0.0)
        cap = max(statistics.median(cap_shares) * t if cap_shares else t, best)
        hi = min(hi, cap, (1.0 - MIN_LEFT_SHARE) * t)
        lo = min(lo, hi)
        where = f"on each rank's dependency graph, the {len(job.job.ranks)} ranks joined at their collectives"
        how = "the job's step in the join (docs/advice.md#job-level-gains)"
    speedup = Speedup(low=round(t / max(t - lo, 1e-9), 3), high=round(t / max(t - hi, 1e-9), 3))
    removable = Removable(low=round(lo, 3), high=round(hi, 3))
    note = (f"the fixes applied together, replayed at once {where} (an event two fixes act "
            f"on is shortened once, the second fix taking its share of what the first left), {how}; "
            "fixes without a replay add their removable time; bounded by the critical-path time of the "
            "components they act on, and leaving at least 5% of the step")
    stated = calibrate(speedup.low, speedup.high, load_calibration())
    if stated is not None:
        top = 1.0 / MIN_LEFT_SHARE
        stated = dataclasses.replace(stated, low=min(stated.low, top), point=min(stated.point, top), high=min(stated.high, top))
        speedup, removable = calibrated(speedup, removable, t, stated)
        note += ("; the range is calibrated as a single fix's is (docs/advice.md#calibrated-ranges), its coverage "
                 "measured on single fixes only")
    return CombinedGain(case_ids=[f.case_id for f in chosen], expected_speedup=speedup, removable_us=removable,
                        step_time_us=round(t, 3), note=note)


__all__ = ["combined_gain"]
