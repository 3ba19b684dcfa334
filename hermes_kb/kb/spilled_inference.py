"""Inference on a streamed job whose facts are on disk (fact_store.SpilledFacts), a group of
ranks at a time, with the same matches as ``engine.infer`` on the whole fact list.

A rule or case whose bindings all join on rank (conditions.rank_local) can only match facts
of one rank: it runs on each group of ``matches.PARTITION_RANKS`` ranks read back from the
file, as durable_engine already does for a large job in memory. What a group alone cannot show
is given to every group: the facts of the kinds that such an item's absent patterns look for
without joining on rank. A match found there on a rank outside the group is left to that rank's
own group. The other items (bindings on several ranks) run once on the facts of the kinds their
patterns name, which are kept in memory with the kinds the advisor reads for every rank (step
times and breakdowns): ``Inference.facts`` holds those, not every fact, and ``Inference.spilled``
the store, from which the advisor reads a rank's facts (unexplained.why_not) and what-if facts
when it needs them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .conditions import compile_patterns, rank_local
from .loader import KnowledgeBase

# kinds the advisor reads for every rank from Inference.facts (advisor._windows, _breakdowns,
# unexplained's step counts); derived bottlenecks are always there
ADVISOR_KINDS = frozenset({"step_time", "step_breakdown"})


def _rank_local(item: Any, attr: str) -> bool:
    return rank_local(getattr(item, attr))


def _kinds(items: list, attr: str, *, absent_off_rank_only: bool = False) -> set[str]:
    out: set[str] = set()
    for e in items:
        for p in compile_patterns(getattr(e.item, attr)):
            if absent_off_rank_only:
                if p.absent and "rank" not in p.join:
                    out.add(p.kind)
            else:
                out.add(p.kind)
    return out


def _ranks_of(m: Any) -> set:
    return {v.get("rank") for v in m.bindings.values()}


def infer_spilled(kb: KnowledgeBase, store: Any, run: Callable, engine: str) -> Any:
    """``engine.infer`` for a SpilledFacts store; ``run(kb, items, facts, attr)`` is the engine's."""
    from . import matches
    from .matches import Inference, Match, derive_bottlenecks

    rules, cases = kb.active_rules(), kb.active_cases()
    local_rules = [e for e in rules if _rank_local(e.item, "when")]
    spread_rules = [e for e in rules if not _rank_local(e.item, "when")]
    local_cases = [e for e in cases if _rank_local(e.item, "conditions")]
    spread_cases = [e for e in cases if not _rank_local(e.item, "conditions")]
    off_rank = (_kinds(local_rules, "when", absent_off_rank_only=True)
                | _kinds(local_cases, "conditions", absent_off_rank_only=True))  # fmt: skip
    spread_kinds = _kinds(spread_rules, "when") | _kinds(spread_cases, "conditions")
    kept = store.flats_of(spread_kinds | off_rank | ADVISOR_KINDS)

    def on_groups(items: list, attr: str, derived: list[dict[str, Any]]) -> list:
        found: list = []
        if not items:
            return found
        by_rank: dict[Any, list[dict[str, Any]]] = {}
        for b in derived:
            by_rank.setdefault(b.get("rank"), []).append(b)
        given = [f for f in kept + derived if f.get("kind") in off_rank]
        for ranks, flats in store.flat_groups(matches.PARTITION_RANKS):
            group = flats + [b for r in ranks for b in by_rank.get(r, [])]
            ids = {f["_id"] for f in group}
            group += [f for f in given if f["_id"] not in ids]
            found.extend(m for m in run(kb, items, group, attr) if _ranks_of(m) <= ranks)
        return found

    def merged(*lists: list) -> list:
        out = {m.key(): m for ms in lists for m in ms}
        return sorted(out.values(), key=Match.key)

    originals = store.by_id()
    rule_matches = merged(on_groups(local_rules, "when", []), run(kb, spread_rules, kept, "when") if spread_rules else [])
    derived = derive_bottlenecks(kb, rule_matches, store.n_ids, originals)
    case_matches = merged(on_groups(local_cases, "conditions", derived),
                          run(kb, spread_cases, kept + derived, "conditions") if spread_cases else [])  # fmt: skip
    return Inference(facts=kept + derived, originals=originals, bottlenecks=rule_matches, cases=case_matches,
                     engine=engine, spilled=store)  # fmt: skip


__all__ = ["ADVISOR_KINDS", "infer_spilled"]
