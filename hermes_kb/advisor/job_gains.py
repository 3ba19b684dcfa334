"""A finding's gain to the job: on a job of several ranks, its fix replayed on the ranks it was
found on, the ranks joined at their collectives (analysis/job.py; docs/advice.md, "Job-level
gains"). A fix on the slowest rank is credited with what the job gains, the other ranks' waits
included; a fix on a rank that waits for its peers, with nothing beyond what the job sees."""

from __future__ import annotations

import statistics

from ..analysis.job import JobState, job_removed
from .gains import MatchGain
from .report import JobGain, JobSummary, Removable, Speedup


def job_gain(gains: list[MatchGain], js: JobState | None, per_rank: Speedup) -> tuple[JobGain, float, float] | None:
    """The job-level gain of one finding's matches, with its removable low and high per step;
    None where no match replays a set on a rank of the join."""
    if js is None:
        return None
    mine = [g for g in gains if g.target and g.rank in js.forms and g.rank in js.states
            and g.target in js.states[g.rank].amounts]  # fmt: skip
    if not mine:
        return None
    try:
        return _job_gain(mine, js, per_rank)
    except Exception as exc:  # a bug in the join costs this finding its job-level gain, not the report
        js.errors.append(f"{type(exc).__name__}: {exc}")
        return None


def _job_gain(mine: list[MatchGain], js: JobState, per_rank: Speedup) -> tuple[JobGain, float, float]:
    def changes(end: int) -> dict:
        out: dict = {}
        for g in mine:
            st = js.states[g.rank]
            out.setdefault(g.rank, []).append((st.amounts[g.target], g.phi[end], g.target in st.drop_waits))
        return out

    n = js.steps

    def extra(end: int) -> float:
        return statistics.median(g.per_step(g.extra[end]) for g in mine)

    t = js.step_us
    lo = max(0.0, job_removed(js, changes(0))) / n + extra(0)
    hi = max(0.0, job_removed(js, changes(1))) / n + extra(1)
    hi = min(max(hi, 0.0), t)
    lo = min(max(lo, 0.0), hi)
    ranks = sorted({g.rank for g in mine})
    out = JobGain(step_time_us=round(t, 3), removable_us=Removable(low=round(lo, 3), high=round(hi, 3)),
                  speedup=Speedup(low=round(t / max(t - lo, 1e-9), 3), high=round(t / max(t - hi, 1e-9), 3)),
                  per_rank_speedup=per_rank, ranks_changed=ranks, ranks_joined=len(js.job.ranks))  # fmt: skip
    return out, lo, hi


def note_of(jg: JobGain, steps: int) -> str:
    """The assumption's sentence on the job-level gain."""
    rk = ", ".join(str(r) for r in jg.ranks_changed[:8]) + (" ..." if len(jg.ranks_changed) > 8 else "")
    return (f" Job-level (docs/advice.md#job-level-gains): the {jg.ranks_joined} ranks joined at their collectives and "
            f"replayed with the fix on rank(s) {rk}: the job's step ({jg.step_time_us / 1e3:,.2f} ms in the join"
            + (f", over {steps} analysed steps" if steps > 1 else "")
            + f") gets {jg.removable_us.low / 1e3:,.2f}-{jg.removable_us.high / 1e3:,.2f} ms shorter, "
            f"{jg.speedup.low:.2f}-{jg.speedup.high:.2f}x; the matched ranks alone would gain "
            f"{jg.per_rank_speedup.low:.2f}-{jg.per_rank_speedup.high:.2f}x, their waits for peers counted as their "
            "own work.")




def job_summary(facts) -> JobSummary | None:
    """The report's line on the job, from its job_replay fact."""
    f = next((f for f in facts if getattr(f, "kind", None) == "job_replay"), None)
    if f is None:
        return None
    cost_share = f.straggler_cost_us / f.modelled_step_us if f.modelled_step_us > 0 else 0.0
    text = (f"The job: its {f.ranks_count} ranks joined at their collectives take {f.modelled_step_us / 1e3:,.2f} ms a "
            f"step (the median rank's recorded step: {f.recorded_step_us / 1e3:,.2f} ms, {f.model_error:+.0%}). "
            f"Rank {f.slowest_rank} is the slowest ({f.slowest_free_us / 1e3:,.2f} ms a step had it never waited, "
            f"the median rank {f.median_free_us / 1e3:,.2f} ms): at the median rank's pace the job's step would be "
            f"{f.straggler_cost_us / 1e3:,.2f} ms shorter ({cost_share:.0%}; {f.gpu_hours_per_1000_steps:.3g} "
            f"device-hours per 1,000 steps). Rank {f.top_holder_rank} arrives last at "
            f"{f.top_holder_share_ratio:.0%} of the collectives.")
    if f.holding_stage is not None and f.stage_balance_gain_us is not None:
        text += (f" Pipeline: stage {f.holding_stage} holds the most collectives; with the slowest stage at the "
                 f"median stage's pace the step would be {f.stage_balance_gain_us / 1e3:,.2f} ms shorter.")
    return JobSummary(ranks=f.ranks_count, step_us=round(f.modelled_step_us, 3), recorded_step_us=round(f.recorded_step_us, 3),
                      model_error=round(f.model_error, 4), slowest_rank=f.slowest_rank,
                      slowest_free_us=round(f.slowest_free_us, 3), median_free_us=round(f.median_free_us, 3),
                      straggler_cost_us=round(f.straggler_cost_us, 3),
                      gpu_hours_per_1000_steps=round(f.gpu_hours_per_1000_steps, 6), top_holder_rank=f.top_holder_rank,
                      top_holder_share_ratio=round(f.top_holder_share_ratio, 4), holding_stage=f.holding_stage,
                      stage_balance_gain_us=None if f.stage_balance_gain_us is None else round(f.stage_balance_gain_us, 3),
                      statement=text)  # fmt: skip


__all__ = ["job_gain", "job_summary", "note_of"]
