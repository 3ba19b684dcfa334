"""Findings in order of what they remove, and folded where two explain the same time."""

from __future__ import annotations

from ..kb.matches import Inference  # noqa: F401
from .report import SEVERITY_ORDER, Finding


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


def _lead_specific(kept: list[Finding], generic: set[str], whatif: dict) -> list[Finding]:
    """A generic finding (it names where the time goes, not the mechanism) that claims the same
    time as a specific one is listed under it, the specific one taking its place."""
    for g in [k for k in kept if k.case_id in generic]:
        s = next((k for k in kept if k.case_id not in generic
                  and max(_shared_time(k, g, whatif), _shared_time(g, k, whatif)) >= NEST_SHARE), None)  # fmt: skip
        if s is None:
            continue
        at = kept.index(g)
        kept.remove(g)
        if kept.index(s) > at:
            kept.remove(s)
            kept.insert(at, s)
        s.alternatives.append(g)
        s.related.append(g.case_id)
    return kept


def merge_findings(findings: list[Finding], whatif: dict | None = None, generic: set[str] | None = None) -> list[Finding]:
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
        if parent is not None and generic and parent.case_id in generic and f.case_id not in generic:
            # the mechanism leads, the generic finding (where the time goes) is listed under it
            kept[kept.index(parent)] = f
            by_key[key] = f
            f.alternatives.append(parent)
            f.related.append(parent.case_id)
            continue
        if parent is not None:
            parent.alternatives.append(f)
            parent.related.append(f.case_id)
            continue
        by_key[key] = f
        kept.append(f)
    if generic and whatif:
        kept = _lead_specific(kept, generic, whatif)
    return kept


__all__ = ["NEST_SHARE", "merge_findings"]
