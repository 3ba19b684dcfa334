"""Inference: facts in, matches of rules and cases out, by either engine.

Two phases, as in the paper's hierarchy: the rules derive Bottleneck facts from measured
facts, then the cases match bottlenecks plus detail facts. ``engine="durable"`` runs both
phases on durable-rules (hermes_kb.kb.durable_engine); ``engine="python"`` on the pure-Python
evaluator (hermes_kb.kb.conditions), which is the fallback where durable-rules cannot be
imported and the oracle the tests compare durable-rules against.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..facts.base import Fact
from ..facts.bottleneck import Bottleneck
from .conditions import compile_patterns, match_all, sanitize_number
from .loader import KnowledgeBase

EngineName = Literal["auto", "durable", "python"]


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


def scalars(fact: Fact | Mapping[str, Any]) -> dict[str, Any]:
    """The scalar fields of a fact as they are (``flatten`` before its numbers are sanitised)."""
    data = fact.model_dump(exclude={"evidence"}) if isinstance(fact, Fact) else dict(fact)
    return {k: v for k, v in data.items() if isinstance(v, (bool, str, int, float))}


def flatten(fact: Fact | Mapping[str, Any]) -> dict[str, Any]:
    """The scalar fields of a fact, numbers sanitised, nulls dropped (missing = null)."""
    out = {}
    for k, v in scalars(fact).items():
        if not isinstance(v, (bool, str)):
            v = sanitize_number(v)
            if v is None:
                continue
        out[k] = v
    return out


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


def _by_kind(facts: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for f in facts:
        out[f.get("kind", "")].append(f)
    return out


def python_matches(items: list, facts: list[dict[str, Any]], kb: KnowledgeBase, attr: str) -> list[Match]:
    by_kind = _by_kind(facts)
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


def durable_available() -> bool:
    try:
        from . import durable_engine  # noqa: F401

        return durable_engine.available()
    except ImportError:
        return False


def infer(kb: KnowledgeBase, facts: Iterable[Fact | Mapping[str, Any]], engine: EngineName = "auto") -> Inference:
    """``facts``: typed or flat facts, or a streamed job's store (fact_store.SpilledFacts), whose
    flat copies are already prepared and whose typed facts are decoded only when asked for."""
    from ..fact_store import SpilledFacts

    use = engine
    if engine == "auto":
        use = "durable" if durable_available() else "python"
    if use == "durable":
        from . import durable_engine

        run = durable_engine.run
    else:

        def run(kb_, items, facts_, attr):
            return python_matches(items, facts_, kb_, attr)

    if isinstance(facts, SpilledFacts):
        from .spilled_inference import infer_spilled

        return infer_spilled(kb, facts, run, use)
    originals: dict[int, Fact] = {}
    flat = prepare(facts, originals)
    rule_matches = run(kb, kb.active_rules(), flat, "when")
    derived = derive_bottlenecks(kb, rule_matches, len(flat), originals)
    all_facts = flat + derived
    case_matches = run(kb, kb.active_cases(), all_facts, "conditions")
    return Inference(facts=all_facts, originals=originals, bottlenecks=rule_matches, cases=case_matches, engine=use)
