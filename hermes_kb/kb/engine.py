"""Inference: facts in, matches of rules and cases out, by either engine.

Two phases, as in the paper's hierarchy: the rules derive Bottleneck facts from measured
facts, then the cases match bottlenecks plus detail facts. ``engine="durable"`` runs both
phases on durable-rules (hermes_kb.kb.durable_engine); ``engine="python"`` on the pure-Python
evaluator (hermes_kb.kb.conditions), which is the fallback where durable-rules cannot be
imported and the oracle the tests compare durable-rules against.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from ..facts.base import Fact
from ..facts.store import SpilledFacts
from .loader import KnowledgeBase
from .matches import Inference, derive_bottlenecks, prepare, python_matches

EngineName = Literal["auto", "durable", "python"]


def durable_available() -> bool:
    try:
        from . import durable_engine  # noqa: F401

        return durable_engine.available()
    except ImportError:
        return False


def infer(kb: KnowledgeBase, facts: Iterable[Fact | Mapping[str, Any]], engine: EngineName = "auto") -> Inference:
    """``facts``: typed or flat facts, or a streamed job's store (fact_store.SpilledFacts), whose
    flat copies are already prepared and whose typed facts are decoded only when asked for."""
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


__all__ = ["EngineName", "durable_available", "infer"]
