"""Findings in order of what they remove, and folded where two explain the same time."""

from __future__ import annotations

from ..kb.matches import Inference  # noqa: F401
from .report import SEVERITY_ORDER, Finding, model_ends


def _evidence_key(f: Finding) -> tuple:
    return tuple(sorted((e.fact, e.scope) for e in f.evidence if e.fact != "bottleneck"))


NEST_SHARE = 0.5  # a finding whose critical-path time is at least this much another's claims the same time


def _rank_key(f: Finding) -> tuple:
    """By severity (a case that names what bounds the step rather than a defect caps its own with
    max_severity, so an umbrella symptom never leads a defect's finding), then by what the fix
    removes from the step (the midpoint of the model's speedup range: the calibrated one is a
    monotone map of the model's point, and ranking on the model keeps ties the model breaks), then
    the case's measured hit rate."""
    removable = sum(model_ends(f.removable_us)) if f.removable_us is not None else 0.0
    return (-SEVERITY_ORDER[f.severity], -sum(model_ends(f.expected_speedup)), -removable, -(f.confidence or 0.0),
            f.case_id)  # fmt: skip


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


PRECEDENCE = {"mechanism": 2, "place": 1, "overhead": 0}


def _explains_most_of(b: Finding, a: Finding, whatif: dict) -> bool:
    """b's events hold most of the critical-path time a claims (b can speak for a's time)."""
    return _shared_time(b, a, whatif) >= NEST_SHARE


def _nest(parent: Finding, child: Finding, whatif: dict) -> None:
    parent.alternatives.append(child)
    parent.related.append(child.case_id)
    child.within = not _explains_most_of(child, parent, whatif)


def _by_precedence(kept: list[Finding], explains: dict[str, str], whatif: dict) -> list[Finding]:
    """Of two findings, one that says more about the time (a mechanism before a place, a place
    before an overhead; ``Case.explains``) and holds most of the time the other claims takes
    the other's place in the order, the other listed under it."""
    def rank(f: Finding) -> int:
        return PRECEDENCE.get(explains.get(f.case_id, "mechanism"), 2)

    i = 0
    while i < len(kept):
        a = kept[i]
        b = next((k for k in kept[i + 1:] if rank(k) > rank(a) and _explains_most_of(k, a, whatif)), None)
        if b is None:
            i += 1
            continue
        kept.remove(b)
        kept[i] = b
        _nest(b, a, whatif)
    return kept


def merge_findings(findings: list[Finding], whatif: dict | None = None,
                   explains: dict[str, str] | None = None) -> list[Finding]:
    """Rank by expected gain, then confidence. A finding resting on exactly the same evidence as a
    better one is folded into it (listed under ``related``); one whose replayed events lie mostly
    on the same critical-path time as a better one's (``NEST_SHARE``) is nested in it
    (``alternatives``): two explanations of one stretch of time, or a narrower fix inside it
    (``within``: its own events hold less than half of the other's time), not two gains to add."""
    ranked = sorted(findings, key=_rank_key)
    kept: list[Finding] = []
    by_key: dict[tuple, Finding] = {}
    for f in ranked:
        key = _evidence_key(f)
        if key and key in by_key:
            by_key[key].related.append(f.case_id)
            continue
        parent = next((k for k in kept if whatif and _shared_time(k, f, whatif) >= NEST_SHARE), None)
        if parent is not None and explains and PRECEDENCE.get(explains.get(f.case_id, "mechanism"), 2) > \
                PRECEDENCE.get(explains.get(parent.case_id, "mechanism"), 2) and _explains_most_of(f, parent, whatif):
            # the one that says more about the time leads, the other is listed under it
            kept[kept.index(parent)] = f
            by_key[key] = f
            _nest(f, parent, whatif)
            continue
        if parent is not None:
            _nest(parent, f, whatif)
            continue
        by_key[key] = f
        kept.append(f)
    if explains and whatif:
        kept = _by_precedence(kept, explains, whatif)
    return kept


__all__ = ["NEST_SHARE", "merge_findings"]
