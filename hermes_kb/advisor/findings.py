"""From matches to ranked findings with expected gains, and the Report.

Expected gain of a finding: the per-step time R the case's optimization can remove (a field
the case names, taken from overlap / critical-path / exposed-time facts, never a raw total),
the step time T it is part of, and the case's fraction range [f_lo, f_hi] of R the fix
removes: speedup = T / (T - f * R). Severity is by the share of the step at stake, the most
the fix can remove, f_hi * R / T: high >= 10%, medium >= 3%, low below (docs/advice.md)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from ..facts.base import Fact
from ..kb.matches import Inference, Match
from ..kb.loader import KnowledgeBase
from ..kb.models import Case
from ..trace.kineto.reader import LINKED_SHARE
from .calibration import Calibrated, Calibration, calibrate
from .calibration import load as load_calibration
from ..analysis.job import JobState
from .explain import explain
from .job_gains import job_gain, note_of
from .gains import MatchGain, breakdowns, gain_rank, match_gain, mean_steps, step_windows
from .ranking import merge_findings
from .report import SEVERITY_ORDER, EvidenceItem, Finding, OptimizationAdvice, Removable, Speedup
from .whatif_index import whatif_index


HIGH_SHARE = 0.10

# findings below this speedup at their best are kept in JSON but left out of the text reports
# and of the combined gain: within the step-to-step noise of a real job
MIN_REPORTED_SPEEDUP = 1.02

MEDIUM_SHARE = 0.03



def unlinked_ranks(whatif: dict) -> set:
    """Ranks whose dependency graph links none of their device work to a launch call (their
    what-if facts say ``linked: false``): a GPU trace without its runtime events, or whose
    kernels' correlations match no runtime call. Not known for a streamed job (none lowered)."""
    if not isinstance(whatif, dict):  # a streamed job's index is looked up per rank, never listed
        return set()
    have = {r for r, t in whatif if t != "*linked"}
    return have - {r for r, t in whatif if t == "*linked"}


def partly_linked_ranks(whatif: dict) -> set:
    """Ranks whose graph links some of their device work to launch calls but less than
    LINKED_SHARE of it (the reader warns of the same): the host's side is read from a minority
    of the kernels. Not known for a streamed job."""
    if not isinstance(whatif, dict):
        return set()
    low = {r for (r, t), f in whatif.items() if t != "*linked" and float(f.get("linked_ratio", 1.0)) < LINKED_SHARE}
    return low - unlinked_ranks(whatif)

def severity_of(share: float) -> str:
    return "high" if share >= HIGH_SHARE else "medium" if share >= MEDIUM_SHARE else "low"


def _how_to(case_opt, platform: str) -> str:
    h = case_opt.how_to
    if platform == "npu":
        return h.npu or h.any or h.gpu or ""
    return (h.gpu if platform == "gpu" else None) or h.any or h.gpu or h.npu or ""


def evidence_of(m: Match, inf: Inference) -> list[EvidenceItem]:
    out = []
    for name, flat in m.bindings.items():
        fact: Fact | None = inf.originals.get(flat["_id"])
        values = {k: v for k, v in flat.items() if k not in ("_id", "kind", "rank", "step", "sid")}
        ev = fact.evidence if fact is not None else None
        out.append(
            EvidenceItem(
                fact=flat.get("kind", "?"),
                scope=fact.scope() if fact is not None else "",
                values=values,
                time_ranges_us=list(ev.time_ranges_us[:5]) if ev else [],
                events=list(ev.events[:10]) if ev else [],
                note=ev.note if ev else None,
            )
        )
    return out


def best_match(matches: list[Match]) -> Match:
    """The match whose evidence a finding shows: the one with the most whole-window (step-less)
    bindings, the first of equals."""
    return max(matches, key=lambda m: sum(1 for v in m.bindings.values() if v.get("step") is None))


def evidence_by_rank(inf: Inference, kb: KnowledgeBase, platform: str, case_ids) -> dict[str, dict[int, list[EvidenceItem]]]:
    """Per case, per rank its matches bind: the evidence of that rank's best match (best_match
    among the matches binding a fact of the rank). A finding keeps one match's evidence (one
    rank's); ``hermes annotate`` writes every rank's own evidence windows into that rank's trace."""
    cases = {e.item.id: e.item for e in kb.cases}
    wanted = set(case_ids)
    out: dict[str, dict[int, list[EvidenceItem]]] = {}
    for case_id, matches in considered(inf, cases, platform).items():
        if case_id not in wanted:
            continue
        by_rank: dict[int, list[Match]] = defaultdict(list)
        for m in matches:
            for r in {v.get("rank") for v in m.bindings.values() if v.get("rank") is not None}:
                by_rank[r].append(m)
        out[case_id] = {r: evidence_of(best_match(ms), inf) for r, ms in sorted(by_rank.items())}
    return out


def findings_from(inf: Inference, kb: KnowledgeBase, platform: str) -> list[Finding]:
    """Ranked findings; those claiming the same critical-path time as a better one nested in it."""
    findings, _ = findings_and_plans(inf, kb, platform)
    return merge_findings(findings, whatif_index(inf, kb), explains_of(kb))


def explains_of(kb: KnowledgeBase) -> dict[str, str]:
    """What each case says about the time it claims (``Case.explains``), for the nesting of findings."""
    return {e.item.id: e.item.explains for e in kb.cases}


def considered(inf: Inference, cases: dict[str, Case], platform: str) -> dict[str, list[Match]]:
    """The case matches the advisor turns into findings: per case, those for this platform."""
    by_case: dict[str, list[Match]] = defaultdict(list)
    for m in inf.cases:
        case = cases[m.item_id]
        if case.hardware != "any" and case.hardware != platform:
            continue
        by_case[m.item_id].append(m)
    return by_case


def whatif_targets(inf: Inference, kb: KnowledgeBase, platform: str) -> set[tuple[Any, str]]:
    """(rank, what-if set) of every considered match whose gain replays a set (what
    whatif_on_demand.replay_needed replays); a job-wide match (no rank) names none, as match_gain
    looks the set up by rank."""
    cases = {e.item.id: e.item for e in kb.cases}
    return {(gain_rank(cases[cid], m), cases[cid].gain.whatif.target)
            for cid, ms in considered(inf, cases, platform).items() if cases[cid].gain.whatif is not None
            for m in ms}  # fmt: skip


def findings_and_plans(inf: Inference, kb: KnowledgeBase, platform: str, job: JobState | None = None
                       ) -> tuple[list[Finding], dict[str, list[MatchGain]]]:  # fmt: skip
    """One finding per case, and per case the gains of its matches (for the combined replay).
    ``job``: the ranks joined at their collectives; a replayed finding then states the job's gain."""
    cases = {e.item.id: e.item for e in kb.cases}
    windows = step_windows(inf.facts)
    step_means = mean_steps(windows)
    whatif = whatif_index(inf, kb)
    bds = breakdowns(inf.facts)
    by_case = considered(inf, cases, platform)
    unlinked = unlinked_ranks(whatif)
    partly = partly_linked_ranks(whatif)
    findings: list[Finding] = []
    plans: dict[str, list[MatchGain]] = {}
    cal = load_calibration()
    for case_id, matches in by_case.items():
        case = cases[case_id]
        gains = [g for g in (match_gain(case, m, step_means, whatif, bds, windows) for m in matches) if g is not None]
        if not gains:
            continue
        plans[case_id] = gains
        # several matches (ranks, steps) of one case become one finding: the median of each
        # quantity across them (data-parallel ranks wait for each other, so one rank's gain is not
        # the job's; the median is the typical rank)
        # per step: a match over the whole analysed window and one over a single step compare
        t = statistics.median(g.per_step(g.step) for g in gains)
        r = statistics.median(g.per_step(g.removes) for g in gains)
        rm_lo = statistics.median(g.per_step(g.lo) for g in gains)
        rm_hi = statistics.median(g.per_step(g.hi) for g in gains)
        sp_lo = t / max(t - rm_lo, 1e-9)
        sp_hi = t / max(t - rm_hi, 1e-9)
        jg = job_gain(gains, job, Speedup(low=round(sp_lo, 3), high=round(sp_hi, 3)))
        job_note = ""
        if jg is not None:
            # the job's step and what the fix removes from it replace the median rank's
            jgain, rm_lo, rm_hi = jg
            t = jgain.step_time_us
            sp_lo, sp_hi = t / max(t - rm_lo, 1e-9), t / max(t - rm_hi, 1e-9)
            job_note = note_of(jgain, job.steps)
        share = r / t
        # at stake: what the fix can remove at best, as a share of the step
        severity = severity_of(rm_hi / t)
        if case.max_severity is not None and SEVERITY_ORDER[severity] > SEVERITY_ORDER[case.max_severity]:
            severity = case.max_severity
        ranks = sorted({v.get("rank") for m in matches for v in m.bindings.values() if v.get("rank") is not None})
        steps = sorted({v.get("step") for m in matches for v in m.bindings.values() if v.get("step") is not None})
        best = best_match(matches)
        unlinked_note = ""
        if case.category == "cpu" and ranks and all(r in unlinked for r in ranks):
            # the host's side of the device rests on launch calls this trace does not have
            severity = "low" if SEVERITY_ORDER[severity] > SEVERITY_ORDER["low"] else severity
            unlinked_note = (" Lowered: the trace links none of its kernels to a launch call (runtime events missing "
                             "or correlations pointing nowhere), so the host's share of the device's time is a guess.")
        elif case.category == "cpu" and ranks and all(r in partly for r in ranks):
            # most of them: the host's share is read from the minority of kernels that are linked
            severity = {"high": "medium", "medium": "low"}.get(severity, severity)
            unlinked_note = (f" Lowered one level: the trace links fewer than {LINKED_SHARE:.0%} of the rank's device "
                             "work to a launch call (runtime events partly missing, or correlations pointing nowhere), "
                             "so the host's share of the device's time is read from a minority of the kernels.")
        typical = min(gains, key=lambda g: abs(g.per_step(g.hi) - rm_hi))
        window = (f" The amounts below are over the {typical.per} analysed steps; per step they are 1/{typical.per} of that."
                  if typical.per > 1 else "")  # fmt: skip
        assumption = (f"{case.gain.assumption.strip()} Measured: {r / 1e3:,.2f} ms per step ({share:.0%} of a "
                      f"{t / 1e3:,.2f} ms step; median over {len(gains)} match(es)).{window} {typical.note} Removable: "
                      f"{rm_lo / 1e3:,.2f}-{rm_hi / 1e3:,.2f} ms per step; speedup = step time / (step time - removed)."
                      f"{job_note}{unlinked_note}")  # fmt: skip
        speedup = Speedup(low=round(sp_lo, 3), high=round(sp_hi, 3))
        removable = Removable(low=round(rm_lo, 3), high=round(rm_hi, 3))
        profile_only = tuple(case.gain.fraction) == (0.0, 0.0)  # about the profile itself: nothing to calibrate
        stated = None if profile_only else calibrate(speedup.low, speedup.high, cal, platform)
        if stated is not None:
            speedup, removable = calibrated(speedup, removable, t, stated)
            assumption += stated.note
        confidence, runs = measured_confidence(case.id, cal)
        findings.append(
            Finding(
                case_id=case.id,
                title=case.title,
                category=case.category,
                cause=case.cause,
                severity=severity,
                confidence=confidence,
                confidence_runs=runs,
                expected_speedup=speedup,
                time_at_stake_us=round(r, 3),
                step_time_us=round(t, 3),
                share_of_step_ratio=round(min(share, 1.0), 4),
                removable_us=removable,
                replayed=case.gain.whatif is not None and "Replayed" in typical.note,
                job=jg[0] if jg is not None else None,
                profile_only=profile_only,
                whatif_target=case.gain.whatif.target if case.gain.whatif is not None else None,
                component=component_of(case),
                assumption=assumption,
                ranks=ranks,
                steps=steps,
                evidence=evidence_of(best, inf),
                optimizations=[
                    OptimizationAdvice(title=o.title, how_to=_how_to(o, platform), snippet=o.snippet, cost=o.cost,
                                       risk=o.risk)  # fmt: skip
                    for o in case.optimizations
                ],
                explanation=explain(case, best, inf.originals),
                references=list(case.references),
            )
        )
    return findings, plans


def calibrated(model: Speedup, rm: Removable, step_us: float, c: Calibrated) -> tuple[Speedup, Removable]:
    """The stated range (calibration.calibrate) with the model's own kept beside it; the
    removable time follows the stated speedups (removed = T - T / S), so the two never disagree."""
    sp = Speedup(low=round(c.low, 3), high=round(c.high, 3), coverage=c.coverage, point=round(c.point, 3),
                 model_low=model.low, model_high=model.high)  # fmt: skip
    out = Removable(low=round(step_us - step_us / c.low, 3), high=round(step_us - step_us / c.high, 3),
                    model_low=rm.low, model_high=rm.high)  # fmt: skip
    return sp, out


def measured_confidence(case_id: str, cal: Calibration | None) -> tuple[float | None, int]:
    """The case's hit rate on the zoo and the number of runs it was measured on (None, 0: not yet measured)."""
    if cal is None:
        return None, 0
    hits, runs = cal.case_record(case_id)
    return (round(hits / runs, 2) if runs else None), runs


def component_of(case: Case) -> str | None:
    """The breakdown component (compute / communication / host / data / idle) the finding sits in."""
    if case.category == "io":
        return "data"
    if case.category == "computation":
        return "compute"
    if case.category in ("communication", "parallel"):
        return "communication"
    return "host" if case.category == "cpu" else None


__all__ = ["HIGH_SHARE", "best_match", "evidence_by_rank", "MEDIUM_SHARE", "calibrated", "measured_confidence", "MIN_REPORTED_SPEEDUP", "component_of", "considered", "evidence_of", "findings_and_plans", "findings_from", "explains_of", "severity_of", "whatif_targets"]
