"""From matches to ranked findings with expected gains, and the Report.

Expected gain of a finding: the per-step time R the case's optimization can remove (a field
the case names, taken from overlap / critical-path / exposed-time facts, never a raw total),
the step time T it is part of, and the case's fraction range [f_lo, f_hi] of R the fix
removes: speedup = T / (T - f * R). Severity is by the share of the step at stake, the most
the fix can remove, f_hi * R / T: high >= 10%, medium >= 3%, low below (docs/advice.md).
"""

from __future__ import annotations

import os
import statistics
import threading
from collections import defaultdict
from dataclasses import dataclass
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from . import __version__
from .analysis import analyze_with_replay
from .facts.base import Fact
from .facts.breakdown import COMPONENTS, StepBreakdown
from .kb.engine import EngineName, Inference, Match, infer
from .kb.loader import KnowledgeBase, load_kb, load_overrides
from .kb.models import Case
from .kb.templates import BoundedSandbox
from .analyzers.whatif import removed_at
from .fact_store import of_kinds
from .whatif_on_demand import replay_needed
from .report import (
    SEVERITY_ORDER,
    CombinedGain,
    EvidenceItem,
    Finding,
    Inputs,
    KbInfo,
    OptimizationAdvice,
    RankSummary,
    Removable,
    Report,
    Speedup,
    StepSummary,
    Unexplained,
)
from .trace import TraceBundle, load
from .unexplained import unexplained

HIGH_SHARE = 0.10
# findings below this speedup at their best are kept in JSON but left out of the text reports
# and of the combined gain: within the step-to-step noise of a real job
MIN_REPORTED_SPEEDUP = 1.02
MEDIUM_SHARE = 0.03
_KB_LOCK = threading.Lock()


def severity_of(share: float) -> str:
    return "high" if share >= HIGH_SHARE else "medium" if share >= MEDIUM_SHARE else "low"


@lru_cache(maxsize=8)
def _kb_cached(config: str | None) -> KnowledgeBase:
    overrides = load_overrides(Path(config)) if config else None
    return load_kb(overrides=overrides)


def knowledge_base(config: str | os.PathLike | None = None) -> KnowledgeBase:
    with _KB_LOCK:
        return _kb_cached(str(config) if config else None)


class _Obj(dict):
    """A flat fact as template variables: attribute access, missing fields render empty."""

    def __getattr__(self, name: str) -> Any:
        return self.get(name)


def _ms(v: Any) -> str:
    return f"{float(v) / 1e3:,.1f} ms" if isinstance(v, (int, float)) else "?"


def _pct(v: Any) -> str:
    return f"{float(v):.0%}" if isinstance(v, (int, float)) else "?"


def _mb(v: Any) -> str:
    return f"{float(v) / 1e6:,.1f} MB" if isinstance(v, (int, float)) else "?"


# jinja2's sandbox that also bounds repetition, padding and output size (kb/templates.py, issue 18)
_ENV = BoundedSandbox(undefined=jinja2.ChainableUndefined, autoescape=False)
_ENV.filters.update(ms=_ms, pct=_pct, mb=_mb, us=lambda v: f"{float(v):,.1f} µs" if isinstance(v, (int, float)) else "?")


def _explain(case: Case, m: Match, originals: dict | None = None) -> str:
    def fields(flat: dict) -> _Obj:
        # the engines see scalars only; the template also gets the fact's lists (e.g. spike steps)
        orig = (originals or {}).get(flat.get("_id"))
        full = orig.model_dump(exclude={"evidence"}) if orig is not None else {}
        return _Obj({**{k: v for k, v in full.items() if isinstance(v, list)}, **flat})

    try:
        return _ENV.from_string(case.explanation).render(**{k: fields(v) for k, v in m.bindings.items()}).strip()
    except jinja2.TemplateError as exc:
        return f"{case.title} ({exc})"


def _platform(bundle: TraceBundle) -> str:
    if any(t.meta.format == "ascend" for t in bundle):
        return "npu"
    if any(t.has_device for t in bundle):
        return "gpu"
    return "cpu"


def _how_to(case_opt, platform: str) -> str:
    h = case_opt.how_to
    if platform == "npu":
        return h.npu or h.any or h.gpu or ""
    return (h.gpu if platform == "gpu" else None) or h.any or h.gpu or h.npu or ""


def _windows(facts: list[dict[str, Any]]) -> dict[int | None, tuple[float, int]]:
    """Per rank: the analysed steps' total time and their number."""
    out: dict[int | None, list[float]] = defaultdict(list)
    for f in facts:
        if f.get("kind") == "step_time" and isinstance(f.get("duration_us"), (int, float)):
            out[f.get("rank")].append(float(f["duration_us"]))
    return {r: (sum(v), len(v)) for r, v in out.items()}


def _steps_spanned(t: float, rank: int | None, windows: dict[int | None, tuple[float, int]]) -> int:
    """How many steps a gain's step time T covers: rank-level facts and the replay measure the
    whole analysed window (the sum of n steps), per-step and monitor facts one step. Findings are
    reported per step, so amounts over the window are divided by n."""
    total, n = windows.get(rank, (0.0, 0))
    return n if n > 1 and abs(t - total) <= 0.02 * total else 1


def _mean_step(windows: dict[int | None, tuple[float, int]]) -> dict[int | None, float]:
    """Mean step time per rank, and over all ranks' steps (key None)."""
    out = {r: total / n for r, (total, n) in windows.items() if n}
    n_all = sum(n for _, n in windows.values())
    if n_all:
        out[None] = sum(total for total, _ in windows.values()) / n_all
    return out


def _value(m: Match, ref) -> float | None:
    """The number a case's field reference points at in one match (None when absent or not a number)."""
    v = m.bindings.get(ref.binding, {}).get(ref.field) if ref is not None else None
    return float(v) if isinstance(v, (int, float)) else None


# which breakdown components a case's category can shorten: without a replay, its removable time
# is bounded by their share of the step (exposed time: removing work the device waits on cannot
# save more than the wait); a CPU-only rank's operators are its compute, so there the host cases
# may also take the compute share
_CATEGORY_COMPONENTS = {
    "io": ("data",),
    "cpu": ("host_launch", "host_dispatch", "host_python", "data"),
    "computation": ("compute",),
    "communication": ("communication",),
}


@dataclass
class _MatchGain:
    step: float  # T: the analysed step time the removal is part of (µs)
    removes: float  # R: the case's measured time (µs)
    lo: float  # step time the fix removes at the low end of its fraction (µs)
    hi: float
    rank: int | None
    note: str  # how lo/hi were obtained
    target: str | None = None  # the replayed set, when the gain comes from a replay
    phi: tuple[float, float] = (0.0, 0.0)  # the set's fraction at the low and high end
    extra: tuple[float, float] = (0.0, 0.0)  # measured time beyond the set, counted one for one
    per: int = 1  # steps the amounts span: the whole analysed window (n steps) or one step

    def per_step(self, us: float) -> float:
        return us / self.per


class _Overlaps(Mapping):
    """A what-if fact's ``critical_overlaps_us``, read from the typed fact when first asked (a
    streamed job's typed facts are on disk, and only the findings' ranks are ever asked)."""

    def __init__(self, originals: Mapping, fact_id: Any) -> None:
        self._originals, self._id, self._got = originals, fact_id, None

    def _get(self) -> dict[str, float]:
        if self._got is None:
            orig = self._originals.get(self._id)
            self._got = dict(getattr(orig, "critical_overlaps_us", None) or {})
        return self._got

    def __getitem__(self, key: str) -> float:
        return self._get()[key]

    def __iter__(self):
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


def _whatif_index(inf: Inference, kb: KnowledgeBase | None = None) -> Mapping[tuple, dict[str, Any]]:
    """(rank, target) -> whatif fact; (rank, "*linked") -> one of the rank's facts when its graph
    is replayable (launch links, or no device). The engine's facts are flat (scalars only), so the
    shared critical-path time per other set comes from the original fact."""
    if inf.spilled is not None:
        return _SpilledWhatif(inf, kb)
    return _index_whatif(inf.facts, inf.originals)


def _index_whatif(facts: list[dict[str, Any]], originals: Mapping) -> dict[tuple, dict[str, Any]]:
    out: dict[tuple, dict[str, Any]] = {}
    for f in facts:
        if f.get("kind") == "whatif":
            f = {**f, "critical_overlaps_us": _Overlaps(originals, f.get("_id"))}
            out[(f.get("rank"), f.get("target"))] = f
            if f.get("linked", True):
                out[(f.get("rank"), "*linked")] = f
    return out


class _SpilledWhatif(Mapping):
    """``_whatif_index`` of a streamed job, a rank's entries read from the store when first
    asked (the matches' ranks), keeping only the sets a case's gain names (and the rank's
    "*linked" entry): a job can have thousands of ranks of ~30 what-if facts each."""

    def __init__(self, inf: Inference, kb: KnowledgeBase | None) -> None:
        self._inf = inf
        self._targets = None if kb is None else {e.item.gain.whatif.target for e in kb.cases if e.item.gain.whatif}
        self._ranks: dict[Any, dict[tuple, dict[str, Any]]] = {}

    def _of(self, rank: Any) -> dict[tuple, dict[str, Any]]:
        got = self._ranks.get(rank)
        if got is None:
            flats = [f for f in self._inf.spilled.rank_flats(rank) if f.get("kind") == "whatif"]
            full = _index_whatif(flats, self._inf.originals)
            keep = self._targets
            got = self._ranks[rank] = full if keep is None else {k: v for k, v in full.items()
                                                                if k[1] in keep or k[1] == "*linked"}  # fmt: skip
        return got

    def __getitem__(self, key: tuple) -> dict[str, Any]:
        return self._of(key[0])[key]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and len(key) == 2 and key in self._of(key[0])

    def __iter__(self):
        raise TypeError("a streamed job's what-if index is looked up by (rank, set), not listed")

    def __len__(self) -> int:  # only its truth is asked for (merge_findings)
        return self._inf.spilled.count("whatif")


def _breakdowns(facts: list[dict[str, Any]]) -> dict[int | None, dict[str, Any]]:
    return {f.get("rank"): f for f in facts if f.get("kind") == "step_breakdown" and f.get("step") is None}


def _component_cap(case: Case, bd: dict[str, Any] | None, t: float) -> tuple[float | None, str]:
    """At most the share of the step the case's breakdown components hold."""
    comps = _CATEGORY_COMPONENTS.get(case.category)
    if bd is None or not comps:
        return None, ""
    if case.category == "cpu" and bd.get("device") == "cpu":
        comps = (*comps, "compute")
    share = sum(float(bd.get(f"{c}_ratio") or 0.0) for c in comps)
    return share * t, "+".join(comps)


def _gain(case: Case, m: Match, step_means: dict, whatif: dict, bds: dict,
          windows: dict[int | None, tuple[float, int]]) -> _MatchGain | None:
    """What the case's fix removes from the analysed steps in one match: a replay of the rank's
    dependency graph when the case names its events (gain.whatif) and the rank has that set,
    else the case's fraction of its measured time, bounded by its components' critical time."""
    g = case.gain
    r = _value(m, g.removes)
    if r is None:
        return None
    rank = _gain_rank(case, m)
    lo_f, hi_f = g.fraction
    if g.fraction_from is not None:
        f_lo, f_hi = (_value(m, ref) for ref in g.fraction_from)
        if f_lo is not None and f_hi is not None:
            lo_f, hi_f = sorted((min(max(float(f_lo), 0.0), 1.0), min(max(float(f_hi), 0.0), 1.0)))
    r = max(r, 0.0)
    low = _value(m, g.removes_low)
    r_low = min(max(low, 0.0), r) if low is not None else r
    c = _value(m, g.at_most)
    w = whatif.get((rank, g.whatif.target)) if g.whatif is not None else None
    if w is not None and w.get("linked", True) is False:
        w = None  # device work not linked to its launches: the replay's dependencies are guesses
    if g.whatif is not None and w is None and (rank, "*linked") in whatif:
        # the rank's graph is replayable but holds none of the events this fix shortens (e.g. an
        # explicit-sync case where every sync is an implicit read-back): it removes nothing here
        t = float(whatif[(rank, "*linked")]["step_us"])
        return _MatchGain(step=t, removes=min(r, t), lo=0.0, hi=0.0, rank=rank, per=_steps_spanned(t, rank, windows),
                          note=f"The rank's trace holds none of the events this fix shortens ({g.whatif.target}).")
    if w is not None and float(w.get("own_us") or 0.0) > 0 and float(w.get("step_us") or 0.0) > 0:
        t = float(w["step_us"])
        own = float(w["own_us"])
        extra_lo = extra_hi = 0.0
        if g.whatif.scale == "set":
            phi_lo, phi_hi = lo_f, hi_f
        else:
            phi_lo, phi_hi = lo_f * min(1.0, r_low / own), hi_f * min(1.0, r / own)
            # measured time beyond the set's events (work around them that goes with the fix):
            # counted one for one, as nothing in the graph says what it overlaps
            extra_lo, extra_hi = lo_f * max(0.0, r_low - own), hi_f * max(0.0, r - own)
        half, full = float(w.get("removed_half_us") or 0.0), float(w.get("removed_all_us") or 0.0)
        rm_lo = removed_at(half, full, phi_lo) + extra_lo
        rm_hi = removed_at(half, full, phi_hi) + extra_hi
        note = (f"Replayed on rank {rank}'s dependency graph (docs/advice.md): the {g.whatif.target} events "
                f"({own / 1e3:,.2f} ms, {float(w.get('critical_us') or 0.0) / 1e3:,.2f} ms of it on the critical path) "
                f"shortened by {phi_lo:.0%}-{phi_hi:.0%}"
                + ("" if g.whatif.scale == "set" else
                   f" (the fix's {lo_f:.0%}-{hi_f:.0%} of the {r / 1e3:,.2f} ms measured as {g.removes.field})")
                + f" make the analysed steps {rm_lo / 1e3:,.2f}-{rm_hi / 1e3:,.2f} ms shorter;"
                  " what stays hidden under other work is not counted.")  # fmt: skip
        if extra_hi > 0:
            note += (f" Of that, {extra_lo / 1e3:,.2f}-{extra_hi / 1e3:,.2f} ms is measured time beyond the set's "
                     f"events ({(r - own) / 1e3:,.2f} ms), counted one for one.")  # fmt: skip
    else:
        t = _value(m, g.step)
        if t is None or t <= 0:
            t = step_means.get(rank, step_means.get(None))
        if not isinstance(t, (int, float)) or t <= 0:
            return None
        t = float(t)
        r, r_low = min(r, t), min(r_low, t)
        rm_lo, rm_hi = lo_f * r_low, hi_f * r
        note = f"The fix removes {lo_f:.0%}-{hi_f:.0%} of the {r / 1e3:,.2f} ms measured ({g.removes.field})."
        if r_low < r:
            note += (f" The measurement is itself a range: {r_low / 1e3:,.2f}-{r / 1e3:,.2f} ms "
                     f"({g.removes_low.field} to {g.removes.field}); the low end starts from the smaller one.")  # fmt: skip
        cap, comps = _component_cap(case, bds.get(rank), t) if g.within_component else (None, "")
        if cap is not None and cap < rm_hi:
            rm_lo, rm_hi = min(rm_lo, cap), cap
            note += (f" Bound: the step's {comps} time in the breakdown is {cap / 1e3:,.2f} ms "
                     f"({cap / t:.0%}); no more can go.")  # fmt: skip
    if c is not None:
        cap = min(max(c, 0.0), t)
        if cap < rm_hi:
            note += f" Bound: at most {cap / 1e3:,.2f} ms can go ({g.at_most.field}, {cap / t:.0%} of the step)."
        rm_lo, rm_hi = min(rm_lo, cap), min(rm_hi, cap)
    rm_hi = min(max(rm_hi, 0.0), t)
    rm_lo = min(max(rm_lo, 0.0), rm_hi)
    out = _MatchGain(step=t, removes=min(r, t), lo=rm_lo, hi=rm_hi, rank=rank, note=note,
                     per=_steps_spanned(t, rank, windows))
    if w is not None and "Replayed" in note:
        out.target, out.phi, out.extra = g.whatif.target, (phi_lo, phi_hi), (extra_lo, extra_hi)
    return out


def _evidence(m: Match, inf: Inference) -> list[EvidenceItem]:
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


def findings_from(inf: Inference, kb: KnowledgeBase, platform: str) -> list[Finding]:
    """Ranked findings; those claiming the same critical-path time as a better one nested in it."""
    findings, _ = _findings(inf, kb, platform)
    return merge_findings(findings, _whatif_index(inf, kb))


def _considered(inf: Inference, cases: dict[str, Case], platform: str) -> dict[str, list[Match]]:
    """The case matches the advisor turns into findings: per case, those for this platform."""
    by_case: dict[str, list[Match]] = defaultdict(list)
    for m in inf.cases:
        case = cases[m.item_id]
        if case.hardware != "any" and case.hardware != platform:
            continue
        by_case[m.item_id].append(m)
    return by_case


def _gain_rank(case: Case, m: Match) -> Any:
    """The rank a match's gain is computed on: that of the binding whose time the fix removes."""
    return m.bindings.get(case.gain.removes.binding, {}).get("rank")


def whatif_targets(inf: Inference, kb: KnowledgeBase, platform: str) -> set[tuple[Any, str]]:
    """(rank, what-if set) of every considered match whose gain replays a set (what
    whatif_on_demand.replay_needed replays); a job-wide match (no rank) names none, as _gain
    looks the set up by rank."""
    cases = {e.item.id: e.item for e in kb.cases}
    return {(_gain_rank(cases[cid], m), cases[cid].gain.whatif.target)
            for cid, ms in _considered(inf, cases, platform).items() if cases[cid].gain.whatif is not None
            for m in ms}  # fmt: skip


def _findings(inf: Inference, kb: KnowledgeBase, platform: str) -> tuple[list[Finding], dict[str, list[_MatchGain]]]:
    """One finding per case, and per case the gains of its matches (for the combined replay)."""
    cases = {e.item.id: e.item for e in kb.cases}
    windows = _windows(inf.facts)
    step_means = _mean_step(windows)
    whatif = _whatif_index(inf, kb)
    bds = _breakdowns(inf.facts)
    by_case = _considered(inf, cases, platform)
    findings: list[Finding] = []
    plans: dict[str, list[_MatchGain]] = {}
    for case_id, matches in by_case.items():
        case = cases[case_id]
        gains = [g for g in (_gain(case, m, step_means, whatif, bds, windows) for m in matches) if g is not None]
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
        share = r / t
        # at stake: what the fix can remove at best, as a share of the step
        severity = severity_of(rm_hi / t)
        if case.max_severity is not None and SEVERITY_ORDER[severity] > SEVERITY_ORDER[case.max_severity]:
            severity = case.max_severity
        ranks = sorted({v.get("rank") for m in matches for v in m.bindings.values() if v.get("rank") is not None})
        steps = sorted({v.get("step") for m in matches for v in m.bindings.values() if v.get("step") is not None})
        best = max(matches, key=lambda m: sum(1 for v in m.bindings.values() if v.get("step") is None))
        confidence = 0.8 if case.status == "stable" else 0.6
        if len(steps) >= 3 or any(v.get("step") is None for v in best.bindings.values()):
            confidence += 0.1
        typical = min(gains, key=lambda g: abs(g.per_step(g.hi) - rm_hi))
        window = (f" The amounts below are over the {typical.per} analysed steps; per step they are 1/{typical.per} of that."
                  if typical.per > 1 else "")  # fmt: skip
        assumption = (f"{case.gain.assumption.strip()} Measured: {r / 1e3:,.2f} ms per step ({share:.0%} of a "
                      f"{t / 1e3:,.2f} ms step; median over {len(gains)} match(es)).{window} {typical.note} Removable: "
                      f"{rm_lo / 1e3:,.2f}-{rm_hi / 1e3:,.2f} ms per step; speedup = step time / (step time - removed).")  # fmt: skip
        findings.append(
            Finding(
                case_id=case.id,
                title=case.title,
                category=case.category,
                cause=case.cause,
                severity=severity,
                confidence=round(min(confidence, 0.95), 2),
                expected_speedup=Speedup(low=round(sp_lo, 3), high=round(sp_hi, 3)),
                time_at_stake_us=round(r, 3),
                step_time_us=round(t, 3),
                share_of_step_ratio=round(min(share, 1.0), 4),
                removable_us=Removable(low=round(rm_lo, 3), high=round(rm_hi, 3)),
                replayed=case.gain.whatif is not None and "Replayed" in typical.note,
                profile_only=tuple(case.gain.fraction) == (0.0, 0.0),
                whatif_target=case.gain.whatif.target if case.gain.whatif is not None else None,
                component=_component_of(case),
                assumption=assumption,
                ranks=ranks,
                steps=steps,
                evidence=_evidence(best, inf),
                optimizations=[
                    OptimizationAdvice(title=o.title, how_to=_how_to(o, platform), snippet=o.snippet, cost=o.cost,
                                       risk=o.risk)  # fmt: skip
                    for o in case.optimizations
                ],
                explanation=_explain(case, best, inf.originals),
                references=list(case.references),
            )
        )
    return findings, plans


def _component_of(case: Case) -> str | None:
    """The breakdown component (compute / communication / host / data / idle) the finding sits in."""
    if case.category == "io":
        return "data"
    if case.category == "computation":
        return "compute"
    if case.category in ("communication", "parallel"):
        return "communication"
    return "host" if case.category == "cpu" else None


def _evidence_key(f: Finding) -> tuple:
    return tuple(sorted((e.fact, e.scope) for e in f.evidence if e.fact != "bottleneck"))


NEST_SHARE = 0.5  # a finding whose critical-path time is at least this much another's claims the same time


def _rank_key(f: Finding) -> tuple:
    """By severity (a case that names what bounds the step rather than a defect caps its own with
    max_severity, so an umbrella symptom never leads a defect's finding), then by what the fix
    removes from the step (the midpoint of the speedup range), then confidence."""
    removable = f.removable_us.low + f.removable_us.high if f.removable_us is not None else 0.0
    return (-SEVERITY_ORDER[f.severity], -(f.expected_speedup.low + f.expected_speedup.high), -removable,
            -f.confidence, f.case_id)  # fmt: skip


def _shared_time(a: Finding, b: Finding, whatif: dict) -> float:
    """Share of b's critical-path time that a's events also hold (max over their common ranks)."""
    if not a.whatif_target or not b.whatif_target:
        return 0.0
    best = 0.0
    for r in set(a.ranks) & set(b.ranks) or {None}:
        wb = whatif.get((r, b.whatif_target))
        if wb is None or not wb.get("critical_us"):
            continue
        crit = float(wb["critical_us"])
        if a.whatif_target == b.whatif_target:
            shared = crit
        else:
            wa = whatif.get((r, a.whatif_target))
            shared = float((wa or {}).get("critical_overlaps_us", {}).get(b.whatif_target, 0.0)) if wa else 0.0
        best = max(best, min(1.0, shared / crit))
    return best


def merge_findings(findings: list[Finding], whatif: dict | None = None) -> list[Finding]:
    """Rank by expected gain, then confidence. A finding resting on exactly the same evidence as a
    better one is folded into it (listed under ``related``); one whose replayed events lie mostly
    on the same critical-path time as a better one's (``NEST_SHARE``) is nested in it
    (``alternatives``): two explanations of one stretch of time, not two gains to add."""
    ranked = sorted(findings, key=_rank_key)
    kept: list[Finding] = []
    by_key: dict[tuple, Finding] = {}
    for f in ranked:
        key = _evidence_key(f)
        if key and key in by_key:
            by_key[key].related.append(f.case_id)
            continue
        parent = next((k for k in kept if whatif and _shared_time(k, f, whatif) >= NEST_SHARE), None)
        if parent is not None:
            parent.alternatives.append(f)
            parent.related.append(f.case_id)
            continue
        by_key[key] = f
        kept.append(f)
    return kept


def combined_gain(findings: list[Finding], plans: dict[str, list[_MatchGain]], replay: dict,
                  bds: dict, top: int = 3) -> CombinedGain | None:  # fmt: skip
    """The gain of applying the first ``top`` fixes together, per rank replayed with all their
    sets shortened at once (no event counted twice), then the median over ranks; findings without a
    replay add their removable time one for one. Never more than the critical-path time of the
    components those fixes act on."""
    from .analyzers.whatif import removed_together

    chosen = [f for f in findings if f.removable_us is not None and f.removable_us.high > 0
              and f.expected_speedup.high >= MIN_REPORTED_SPEEDUP][:top]  # fmt: skip
    if len(chosen) < 2:
        return None
    ranks = sorted({g.rank for f in chosen for g in plans.get(f.case_id, [])}, key=lambda r: (r is None, r))
    per_rank: list[tuple[float, float, float]] = []
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
        if parts_hi:
            lo += max(0.0, removed_together(state.model, parts_lo)) / per
            hi += max(0.0, removed_together(state.model, parts_hi)) / per
        bd = bds.get(r)
        if bd is not None:
            comps = {c for f in chosen for c in _CATEGORY_COMPONENTS.get(f.category, ("communication", "idle"))}
            if bd.get("device") == "cpu" and any(f.category == "cpu" for f in chosen):
                comps.add("compute")
            cap = t * sum(float(bd.get(f"{c}_ratio") or 0.0) for c in comps)
            lo, hi = min(lo, cap), min(hi, cap)
        hi = min(hi, t)
        per_rank.append((t, min(lo, hi), hi))
    if not per_rank:
        return None
    t = statistics.median(x[0] for x in per_rank)
    lo = statistics.median(x[1] for x in per_rank)
    hi = statistics.median(x[2] for x in per_rank)
    return CombinedGain(
        case_ids=[f.case_id for f in chosen],
        expected_speedup=Speedup(low=round(t / max(t - lo, 1e-9), 3), high=round(t / max(t - hi, 1e-9), 3)),
        removable_us=Removable(low=round(lo, 3), high=round(hi, 3)),
        step_time_us=round(t, 3),
        note=("the fixes applied together, replayed at once on each rank's dependency graph (an event two fixes act "
              "on is shortened once, the second fix taking its share of what the first left), median over ranks; "
              "fixes without a replay add their removable time; bounded by the critical-path time of the "
              "components they act on"),
    )


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


def _summary(bundle: TraceBundle, facts: list[Fact]) -> list[RankSummary]:
    steps_of: dict[int | None, list[StepSummary]] = defaultdict(list)
    breakdown_of: dict[int | None, Fact] = {}
    for f in facts:  # one pass: a job has thousands of ranks
        if f.kind == "step_time":
            steps_of[f.rank].append(StepSummary(step=f.step, duration_us=round(f.duration_us, 3)))
        elif f.kind == "step_breakdown" and f.step is None:
            breakdown_of.setdefault(f.rank, f)
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
            )
        )
    return out


@dataclass
class Advised:
    """A Report and what it was made from: the facts, the bundle, the monitor's run log (the
    HTML report, `hermes annotate` and `hermes diff` read them beside the report)."""

    report: Report
    facts: Sequence[Fact]  # a list, or a streamed job's fact_store.SpilledFacts
    bundle: TraceBundle | None = None
    run: Any = None  # monitor.reader.RunLog for a RUN_DIR


def _no_stage(what: str) -> None:
    return None


def advise_bundle_full(
    bundle: TraceBundle,
    *,
    config: str | os.PathLike | None = None,
    engine: EngineName = "auto",
    top: int | None = None,
    rank: int | None = None,
    facts: list[Fact] | None = None,
    stage=_no_stage,
    replay: Mapping[int, Any] | None = None,
) -> Advised:
    """``advise_bundle``, keeping the facts; ``stage(text)`` is told as the work advances.
    ``replay``: the ranks' what-if replay states when ``facts`` were made elsewhere (rank_stream)."""
    kb = knowledge_base(config)
    if facts is None:
        stage(f"analysing {len(bundle)} rank(s)")
        facts, replay = analyze_with_replay(bundle, defer_replays=True)
    elif replay is None:
        replay = {}
    stage("rules and cases")
    inf = infer(kb, facts, engine)
    stage("findings and gains")
    platform = _platform(bundle)
    facts = replay_needed(inf, facts, replay, whatif_targets(inf, kb, platform))
    findings, combined, left = diagnose(inf, kb, platform, replay, rank=rank, top=top)
    warnings = [f"skipped {p.message}" for p in bundle.problems] + list(bundle.warnings)
    warnings += [f"analyzer {f.analyzer} failed on rank {f.rank}: {f.message}"
                 for f in of_kinds(facts, ("analyzer_error",))]  # fmt: skip
    summary = _summary(bundle, of_kinds(facts, ("step_time", "step_breakdown")))
    if rank is not None:
        summary = [s for s in summary if s.rank == rank]
    report = Report(
        hermes_version=__version__,
        inputs=Inputs(sources=bundle.sources, ranks=bundle.rank_ids, skipped=[p.path for p in bundle.problems]),
        summary=summary,
        findings=findings,
        combined=combined,
        unexplained=left,
        kb=KbInfo(rules=len(kb.active_rules()), cases=len(kb.active_cases()), engine=inf.engine),
        warnings=warnings,
    )
    return Advised(report=report, facts=facts, bundle=bundle)


def advise_bundle(
    bundle: TraceBundle,
    *,
    config: str | os.PathLike | None = None,
    engine: EngineName = "auto",
    top: int | None = None,
    rank: int | None = None,
    facts: list[Fact] | None = None,
) -> Report:
    return advise_bundle_full(bundle, config=config, engine=engine, top=top, rank=rank, facts=facts).report


def diagnose(inf: Inference, kb: KnowledgeBase, platform: str, replay: dict, *, rank: int | None = None,
             top: int | None = None) -> tuple[list[Finding], CombinedGain | None, list[Unexplained]]:  # fmt: skip
    """Findings ranked, nested where they claim the same time, filtered to a rank and cut to the
    first ``top``; the gain of the first fixes together; the bottlenecks no finding explains."""
    findings, plans = _findings(inf, kb, platform)
    findings = merge_findings(findings, _whatif_index(inf, kb))
    if rank is not None:
        findings = [f for f in findings if not f.ranks or rank in f.ranks]
        plans = {k: [g for g in v if g.rank in (rank, None)] for k, v in plans.items()}
    combined = combined_gain(findings, plans, replay, _breakdowns(inf.facts))
    left = unexplained(inf, kb, findings, platform)
    if rank is not None:
        left = [u for u in left if not u.ranks or rank in u.ranks]
    if top is not None:
        findings = findings[:top]
    return findings, combined, left


def advise(
    path_or_bundle: TraceBundle | str | os.PathLike | Sequence,
    *,
    config: str | os.PathLike | None = None,
    engine: EngineName = "auto",
    top: int | None = None,
    rank: int | None = None,
) -> Report:
    """Diagnose a trace, or a monitor RUN_DIR (its rank<R>.jsonl logs and captured traces):
    findings ranked by expected gain. Safe to call repeatedly and from
    several threads (the KB is loaded once; the rules engine is used behind a lock)."""
    if not isinstance(path_or_bundle, TraceBundle):
        from .run_advice import advise_run_dir, as_run_dir

        if (run_dir := as_run_dir(path_or_bundle)) is not None:  # a monitor RUN_DIR (rank<R>.jsonl)
            return advise_run_dir(run_dir, config=config, engine=engine, top=top, rank=rank)
    bundle = path_or_bundle if isinstance(path_or_bundle, TraceBundle) else load(path_or_bundle)
    return advise_bundle(bundle, config=config, engine=engine, top=top, rank=rank)


__all__ = ["SEVERITY_ORDER", "advise", "advise_bundle", "diagnose", "findings_from", "knowledge_base", "severity_of"]
