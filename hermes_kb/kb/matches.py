"""What inference produces, whichever engine ran it: matches of rules and cases, the derived
Bottleneck facts, and the inference's record (the flat facts as the engines saw them)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..facts.base import Fact
from ..facts.bottleneck import Bottleneck
from ..facts.flat import flatten, sanitize_number
from .conditions import compile_patterns, match_all
from .loader import KnowledgeBase

# a large job's rank-local rules and cases run this many ranks at a time (durable_engine.py,
# spilled_inference.py)
PARTITION_RANKS = 64


@dataclass
class Match:
    item_id: str
    bindings: dict[str, dict[str, Any]]  # binding name -> flat fact (with "_id")

    def key(self) -> tuple:
        return (self.item_id, tuple(sorted((k, v["_id"]) for k, v in self.bindings.items())))


@dataclass
class Inference:
    facts: list[dict[str, Any]]  # flat facts as the engines saw them (incl. derived bottlenecks)
    originals: Any = field(default_factory=dict)  # _id -> the typed fact (a mapping)
    bottlenecks: list[Match] = field(default_factory=list)  # rule matches
    cases: list[Match] = field(default_factory=list)  # case matches
    engine: str = "python"
    # a streamed job's store (fact_store.SpilledFacts): ``facts`` then holds only the kinds read
    # for every rank (kb/spilled_inference.py); a rank's facts and the rest are read from here
    spilled: Any = None

    def rank_facts(self, rank: Any) -> list[dict[str, Any]]:
        """The flat facts of one rank and those without a rank (derived bottlenecks included)."""
        if self.spilled is None:
            return [f for f in self.facts if f.get("rank") in (rank, None)]
        mine = {f["_id"]: f for r in {rank, None} for f in self.spilled.rank_flats(r)}
        for f in self.facts:
            if f.get("rank") in (rank, None):
                mine.setdefault(f["_id"], f)
        return [mine[i] for i in sorted(mine)]


def prepare(facts: Iterable[Fact | Mapping[str, Any]], originals: dict | None = None) -> list[dict[str, Any]]:
    """Flatten, de-duplicate (identical facts once), number them with ``_id``."""
    seen: set = set()
    out = []
    for f in facts:
        flat = flatten(f)
        key = tuple(sorted(flat.items()))
        if key in seen:
            continue
        seen.add(key)
        flat["_id"] = len(out)
        if originals is not None and isinstance(f, Fact):
            originals[flat["_id"]] = f
        out.append(flat)
    return out


def facts_by_kind(facts: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for f in facts:
        out[f.get("kind", "")].append(f)
    return out


def python_matches(items: list, facts: list[dict[str, Any]], kb: KnowledgeBase, attr: str) -> list[Match]:
    by_kind = facts_by_kind(facts)
    out = []
    for entry in items:
        item = entry.item
        patterns = compile_patterns(getattr(item, attr))
        params = {k: sanitize_number(v) for k, v in kb.params[item.id].items()}
        for bound in match_all(patterns, by_kind, params):
            out.append(Match(item.id, {k: dict(v) for k, v in bound.items()}))
    return sorted(out, key=Match.key)


def derive_bottlenecks(kb: KnowledgeBase, matches: list[Match], start_id: int,
                       originals: dict | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Turn rule matches into Bottleneck facts (flat, numbered after the measured facts)."""
    rules = {e.item.id: e.item for e in kb.rules}
    out = []
    for m in matches:
        rule = rules[m.item_id]
        share_src = m.bindings[rule.emit.share.binding]
        share = share_src.get(rule.emit.share.field)
        if share is None:
            continue
        time = None
        if rule.emit.time is not None:
            time = m.bindings[rule.emit.time.binding].get(rule.emit.time.field)
        first = next(iter(m.bindings.values()))
        b = Bottleneck(
            rank=first.get("rank"),
            step=first.get("step"),
            category=rule.emit.category,
            component=rule.emit.component,
            share_ratio=min(max(float(share), 0.0), 1.0),
            time_us=None if time is None else float(time),
            rule_id=rule.id,
        )
        out.append(b)
    local: dict = {}
    flat = prepare(out, local)
    for i, f in enumerate(flat):
        f["_id"] = start_id + i
        if originals is not None:
            originals[start_id + i] = local[i]
    return flat


__all__ = ["PARTITION_RANKS", "Inference", "Match", "facts_by_kind", "derive_bottlenecks", "prepare", "python_matches"]
