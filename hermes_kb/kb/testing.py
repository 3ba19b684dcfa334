"""`hermes kb test`: every example of every rule and case, through both engines.

For each item: its ``fire`` examples must match and its ``no_fire`` examples must not, on the
pure-Python evaluator and on durable-rules (when importable), with identical match sets.
On top, every threshold is probed automatically: for each leaf that compares a field with a
named parameter, the first ``fire`` example is re-run with that field set just inside and
just outside the threshold; the first must fire and the second must not.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from ..facts.flat import sanitize_number
from .conditions import compile_patterns, leaves
from .engine import durable_available
from .matches import Match, prepare, python_matches
from .loader import Entry, KnowledgeBase

EPS_REL = 1e-3


@dataclass
class ExampleResult:
    item_id: str
    name: str
    expect_fire: bool
    fired: dict[str, bool]  # engine -> fired
    agree: bool
    path: str

    @property
    def ok(self) -> bool:
        return self.agree and all(v == self.expect_fire for v in self.fired.values())


@dataclass
class TestReport:
    results: list[ExampleResult] = field(default_factory=list)

    @property
    def failures(self) -> list[ExampleResult]:
        return [r for r in self.results if not r.ok]


def _attr(entry: Entry) -> str:
    return "when" if entry.item.id.startswith("R-") else "conditions"


def _run(kb: KnowledgeBase, entry: Entry, facts: list[dict[str, Any]], params: dict[str, Any], engines: list[str]):
    sub = KnowledgeBase(rules=[], cases=[], params={entry.item.id: {**kb.params[entry.item.id], **params}})
    flat = prepare(facts)
    out: dict[str, list[Match]] = {}
    for eng in engines:
        if eng == "python":
            out[eng] = python_matches([entry], flat, sub, _attr(entry))
        else:
            from . import durable_engine

            out[eng] = durable_engine.run(sub, [entry], flat, _attr(entry))
    return out


def _probe_value(threshold: Any, op: str, inside: bool) -> Any:
    if not isinstance(threshold, (int, float)) or isinstance(threshold, bool):
        return None
    step = max(abs(threshold) * EPS_REL, 1e-3)
    if op in (">", ">="):
        return threshold + step if inside else threshold - step
    if op in ("<", "<="):
        return threshold - step if inside else threshold + step
    return None


def probes(kb: KnowledgeBase, entry: Entry) -> list[tuple[str, list[dict[str, Any]], bool]]:
    """(name, facts, expect_fire) pairs that try each parameter threshold just inside and outside."""
    item = entry.item
    fire = item.examples.fire[0]
    patterns = compile_patterns(getattr(item, _attr(entry)))
    params = {**kb.params[item.id], **fire.params}
    out = []
    for p in patterns:
        if p.absent:
            continue
        targets = [i for i, f in enumerate(fire.facts) if f.get("kind") == p.kind]
        if len(targets) != 1:
            continue  # ambiguous which example fact the pattern binds: the author's examples cover it
        for leaf in leaves(p.where):
            if leaf.param is None or leaf.op not in (">", ">=", "<", "<="):
                continue
            thr = sanitize_number(params[leaf.param])
            for inside in (True, False):
                v = _probe_value(thr, leaf.op, inside)
                if v is None:
                    continue
                facts = copy.deepcopy(fire.facts)
                facts[targets[0]][leaf.field] = v
                where = "just inside" if inside else "just outside"
                out.append((f"{leaf.param} {where} ({leaf.field} {leaf.op} {thr}: {v:.6g})", facts, inside))
    return out


def run_examples(kb: KnowledgeBase, only: str | None = None, engines: list[str] | None = None) -> TestReport:
    engines = engines or (["python", "durable"] if durable_available() else ["python"])
    report = TestReport()
    for entry in (*kb.rules, *kb.cases):
        item = entry.item
        if only and item.id != only:
            continue
        cases: list[tuple[str, list[dict[str, Any]], dict[str, Any], bool]] = []
        for i, ex in enumerate(item.examples.fire):
            cases.append((ex.name or f"fire[{i}]", ex.facts, ex.params, True))
        for i, ex in enumerate(item.examples.no_fire):
            cases.append((ex.name or f"no_fire[{i}]", ex.facts, ex.params, False))
        for name, facts, expect in probes(kb, entry):
            cases.append((f"probe: {name}", facts, item.examples.fire[0].params, expect))
        for name, facts, params, expect in cases:
            res = _run(kb, entry, facts, params, engines)
            keys = {eng: [m.key() for m in ms] for eng, ms in res.items()}
            agree = len({tuple(v) for v in keys.values()}) == 1
            report.results.append(
                ExampleResult(item.id, name, expect, {eng: bool(ms) for eng, ms in res.items()}, agree, entry.path)
            )
    return report
