"""The engine-neutral condition language of rules and cases, and its pure-Python evaluator.

A condition is a list of *patterns*; all must hold at once. A pattern names a fact kind,
binds the matching fact to a name (``as``), and filters it with a ``where`` expression tree:
``all`` / ``any`` / ``not`` over *leaves* ``{field, op, value | param | ref}``. ``join`` makes a
field equal the same field of an earlier binding (rank, step, process group ...). A pattern
with ``absent: true`` holds when no fact matches it.

Semantics shared by both engines (this evaluator and the durable-rules compiler):
- a comparison on a field the fact does not have (or that is null) is false;
- ``not`` is pushed down to the leaves first (De Morgan), so ``not (x > 3)`` is ``x <= 3``,
  which is also false when x is missing; ``exists`` and ``missing`` (null or absent) negate
  each other; ``not`` over ``matches`` is not allowed;
- ``matches`` is a full-string regular-expression match;
- numbers are compared after ``sanitize_number`` (what the engine can represent).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


Op = Literal["==", "!=", "<", "<=", ">", ">=", "in", "not_in", "matches", "exists", "missing"]
NEGATE = {"==": "!=", "!=": "==", "<": ">=", "<=": ">", ">": "<=", ">=": "<", "in": "not_in", "not_in": "in",
          "exists": "missing", "missing": "exists"}  # fmt: skip


class Leaf(BaseModel):
    model_config = ConfigDict(extra="forbid")

    field: str
    op: Op
    value: Any = None
    param: str | None = Field(default=None, description="compare with a named, user-overridable threshold")
    ref: str | None = Field(default=None, description="compare with another binding's field: 'b.rank'")

    @model_validator(mode="after")
    def _one_operand(self) -> Leaf:
        given = [k for k in ("value", "param", "ref") if getattr(self, k) is not None]
        if self.op in ("exists", "missing"):
            if given:
                raise ValueError(f"'{self.op}' takes no value, param or ref")
        elif len(given) != 1:
            raise ValueError(f"op {self.op!r} needs exactly one of value, param or ref (got {given or 'none'})")
        if self.op in ("in", "not_in") and self.value is not None and not isinstance(self.value, list):
            raise ValueError(f"op {self.op!r} needs a list value")
        if self.op == "matches":
            if not isinstance(self.value, str):
                raise ValueError("op 'matches' needs a string value (a regular expression)")
            try:
                re.compile(self.value)
            except re.error as exc:
                raise ValueError(f"invalid regular expression {self.value!r}: {exc}") from None
        if self.ref is not None and "." not in self.ref:
            raise ValueError("ref must name a binding and a field: 'b.rank'")
        return self


class Expr(BaseModel):
    """all / any / not over sub-expressions, or a leaf."""

    model_config = ConfigDict(extra="forbid")

    all: list[Expr | Leaf] | None = None
    any: list[Expr | Leaf] | None = None
    not_: Expr | Leaf | None = Field(default=None, alias="not")

    @model_validator(mode="after")
    def _one_form(self) -> Expr:
        n = sum(x is not None for x in (self.all, self.any, self.not_))
        if n != 1:
            raise ValueError("an expression has exactly one of all, any, not")
        return self


class Pattern(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    fact: str = Field(description="fact kind, e.g. bottleneck, data_loader_wait")
    as_: str | None = Field(default=None, alias="as", description="binding name used by refs, joins and templates")
    where: Expr | Leaf | list[Expr | Leaf] | None = None
    join: dict[str, str] = Field(default_factory=dict, description="field -> binding: equal to that binding's field")
    absent: bool = Field(default=False, description="holds when no fact matches this pattern")

    def where_expr(self) -> Expr | Leaf | None:
        if isinstance(self.where, list):
            return Expr(all=self.where) if self.where else None
        return self.where


# ---------------------------------------------------------------------------------------------
# normal form: leaves only under all/any (no not)


@dataclass(frozen=True)
class NLeaf:
    field: str
    op: str
    value: Any = None
    param: str | None = None
    ref: str | None = None


@dataclass(frozen=True)
class NAll:
    items: tuple


@dataclass(frozen=True)
class NAny:
    items: tuple


def normalize(e: Expr | Leaf | None, negate: bool = False):
    if e is None:
        return None
    if isinstance(e, Leaf):
        op = e.op
        if negate:
            if op == "matches":
                raise ValueError("'not' over 'matches' is not supported by the engines")
            op = NEGATE[op]
        return NLeaf(e.field, op, e.value, e.param, e.ref)
    if e.not_ is not None:
        return normalize(e.not_, not negate)
    items = tuple(normalize(x, negate) for x in (e.all if e.all is not None else e.any))
    is_all = e.all is not None
    if negate:
        is_all = not is_all
    return NAll(items) if is_all else NAny(items)


def leaves(n) -> Iterator[NLeaf]:
    if n is None:
        return
    if isinstance(n, NLeaf):
        yield n
    else:
        for x in n.items:
            yield from leaves(x)


def and_refs(n, under_any: bool = False) -> list[tuple[str, str]]:
    """(binding, field) of every ref; refs are only allowed where all of them must hold (not
    inside ``any``), so that the referred field can be required of the referred fact."""
    if n is None:
        return []
    if isinstance(n, NLeaf):
        if n.ref is None:
            return []
        if under_any:
            raise ValueError(f"ref {n.ref!r} inside 'any' is not supported")
        name, _, field = n.ref.partition(".")
        return [(name, field)]
    out = []
    for x in n.items:
        out.extend(and_refs(x, under_any or isinstance(n, NAny)))
    return out


# ---------------------------------------------------------------------------------------------
# evaluator


def resolve_operand(leaf: NLeaf, params: Mapping[str, Any], bound: Mapping[str, Mapping[str, Any]]) -> Any:
    if leaf.param is not None:
        return params[leaf.param]
    if leaf.ref is not None:
        name, _, field = leaf.ref.partition(".")
        return bound[name].get(field)
    return leaf.value


def compare(actual: Any, op: str, expected: Any) -> bool:
    if op == "exists":
        return actual is not None
    if op == "missing":
        return actual is None
    if actual is None or expected is None and op not in ("in", "not_in"):
        return False
    try:
        if op == "==":
            return actual == expected
        if op == "!=":
            return actual != expected
        if op == "<":
            return actual < expected
        if op == "<=":
            return actual <= expected
        if op == ">":
            return actual > expected
        if op == ">=":
            return actual >= expected
        if op == "in":
            return actual in (expected or [])
        if op == "not_in":
            return actual not in (expected or [])
        if op == "matches":
            return isinstance(actual, str) and re.fullmatch(expected, actual) is not None
    except TypeError:
        return False
    raise ValueError(op)


def evaluate(n, fact: Mapping[str, Any], params: Mapping[str, Any], bound: Mapping[str, Mapping[str, Any]]) -> bool:
    if n is None:
        return True
    if isinstance(n, NLeaf):
        return compare(fact.get(n.field), n.op, resolve_operand(n, params, bound))
    if isinstance(n, NAll):
        return all(evaluate(x, fact, params, bound) for x in n.items)
    return any(evaluate(x, fact, params, bound) for x in n.items)


@dataclass
class CompiledPattern:
    kind: str
    name: str
    where: Any
    join: dict[str, str]
    absent: bool


def compile_patterns(patterns: list[Pattern]) -> list[CompiledPattern]:
    out = []
    for i, p in enumerate(patterns):
        out.append(CompiledPattern(p.fact, p.as_ or f"p{i}", normalize(p.where_expr()), dict(p.join), p.absent))
    return out


def match_all(
    patterns: list[CompiledPattern], by_kind: Mapping[str, list[Mapping[str, Any]]], params: Mapping[str, Any]
) -> list[dict[str, Mapping[str, Any]]]:
    """Every combination of facts satisfying all patterns (absent ones bind nothing)."""
    results: list[dict[str, Mapping[str, Any]]] = []

    def ok(p: CompiledPattern, fact, bound) -> bool:
        for field, other in p.join.items():
            if other not in bound or fact.get(field) is None or fact.get(field) != bound[other].get(field):
                return False
        return evaluate(p.where, fact, params, bound)

    def walk(i: int, bound: dict) -> None:
        if i == len(patterns):
            results.append(dict(bound))
            return
        p = patterns[i]
        candidates = by_kind.get(p.kind, [])
        if p.absent:
            if not any(ok(p, f, bound) for f in candidates):
                walk(i + 1, bound)
            return
        for f in candidates:
            if ok(p, f, bound):
                bound[p.name] = f
                walk(i + 1, bound)
                del bound[p.name]

    walk(0, {})
    return results


Expr.model_rebuild()


def rank_local(patterns) -> bool:
    """Every binding after the first joins an earlier one on rank: all its facts share one rank
    (a fact without a rank joins nothing), so its matches lie inside one rank's facts."""
    held = [p for p in compile_patterns(patterns) if not p.absent]
    return all("rank" in p.join for p in held[1:])
