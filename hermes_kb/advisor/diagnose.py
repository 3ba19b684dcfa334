"""Matches to the report's findings: ranked, nested where they claim the same time, the first
fixes' combined gain, and the bottlenecks no finding explains."""

from __future__ import annotations

from collections.abc import Sequence

from ..analysis.job import job_state
from ..kb.matches import Inference
from ..kb.loader import KnowledgeBase
from .combined import combined_gain
from .findings import explains_of, findings_and_plans, whatif_targets
from .gains import breakdowns
from .ranking import merge_findings
from .report import CombinedGain, Finding, RankSummary, Unexplained
from .unexplained import unexplained
from .whatif_index import whatif_index

JOB_GAIN_MAX_RANKS = 256


def diagnose(inf: Inference, kb: KnowledgeBase, platform: str, replay: dict, *, rank: int | None = None,
             top: int | None = None, summary: Sequence[RankSummary] = (), warnings: list[str] | None = None
             ) -> tuple[list[Finding], CombinedGain | None, list[Unexplained]]:  # fmt: skip
    """Findings ranked, nested where they claim the same time, filtered to a rank and cut to the
    first ``top``; the gain of the first fixes together; the bottlenecks no finding explains, each
    with its component's share as ``summary`` (the report's breakdown rows) gives it. A job-level
    gain that could not be computed is said in ``warnings``."""
    # the job's replay reads every rank's replay state back and replays the changed ones per finding:
    # past this many ranks findings keep the median rank's gain (the job_replay fact has no limit)
    job = None
    targets = {t for _, t in whatif_targets(inf, kb, platform)} if 1 < len(replay) <= JOB_GAIN_MAX_RANKS else set()
    if targets:  # no matched case replays a set: nothing would ask the join
        try:
            job = job_state(replay, targets)
        except Exception as exc:  # a bug in the join must cost the job-level gains only, not the report
            job = None
            if warnings is not None:
                warnings.append(f"the ranks could not be joined at their collectives ({type(exc).__name__}: {exc}); "
                                "findings give the median rank's gain")
    findings, plans = findings_and_plans(inf, kb, platform, job)
    findings = merge_findings(findings, whatif_index(inf, kb), explains_of(kb))
    if rank is not None:
        findings = [f for f in findings if not f.ranks or rank in f.ranks]
        plans = {k: [g for g in v if g.rank in (rank, None)] for k, v in plans.items()}
    combined = combined_gain(findings, plans, replay, breakdowns(inf.facts), job=job)
    left = unexplained(inf, kb, findings, platform, summary)
    if rank is not None:
        left = [u for u in left if not u.ranks or rank in u.ranks]
    if top is not None:
        findings = findings[:top]
    if job is not None and job.errors and warnings is not None:
        warnings.append(f"job-level gains failed for {len(job.errors)} finding(s) ({job.errors[0]}); "
                        "those give the median rank's gain")
    return findings, combined, left


__all__ = ["diagnose"]
