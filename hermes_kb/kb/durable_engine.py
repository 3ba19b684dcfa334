"""Everything durable-rules-specific lives here.

Sharp edges handled (ARCHITECTURE.md): definitions are deep-copied before registration (it
mutates them); one Host per process, created lazily and used from one thread at a time behind
a lock; rulesets are registered once per KB content (names carry a hash, since a name cannot
be registered twice); each analysis uses a fresh session id and cleans up by retracting its
facts (never delete_state); numbers reach the engine sanitised (hermes_kb.kb.conditions);
identical facts are never asserted twice (they carry a unique _id); "not handled" and
"observed" exceptions are expected and tolerated; actions take exactly one parameter (two
would make durable run them asynchronously) and an exception inside one is recorded and
raised after the run instead of being swallowed.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import threading
from typing import Any

from ..errors import HermesError
from .conditions import NAll, NLeaf, and_refs, compile_patterns, sanitize_number

try:  # durable-rules does not import on Python 3.13+
    from durable import engine as _engine

    _IMPORT_ERROR: Exception | None = None
except Exception as exc:  # pragma: no cover - depends on the platform
    _engine = None
    _IMPORT_ERROR = exc


class EngineError(HermesError):
    pass


_LOCK = threading.Lock()
_HOST = None
_REGISTERED: dict[str, dict[str, tuple[str, list[str]]]] = {}  # ruleset name -> rule key -> (item id, bindings)
_SID = itertools.count(1)
_FIRED: list[tuple[str, dict[str, Any]]] = []
_ERRORS: list[str] = []


def available() -> bool:
    return _engine is not None


def _host():
    global _HOST
    if _HOST is None:
        _HOST = _engine.Host()
    return _HOST


def _operand(leaf: NLeaf, params: dict[str, Any]) -> Any:
    if leaf.param is not None:
        return sanitize_number(params[leaf.param])
    if leaf.ref is not None:
        name, _, field = leaf.ref.partition(".")
        return {_dname(name): field}
    return sanitize_number(leaf.value) if not isinstance(leaf.value, list) else [sanitize_number(v) for v in leaf.value]


def _dname(binding: str) -> str:
    # durable reserves some names on the action's closure (s is the session state, m the message)
    return f"b_{binding}"


_CMP = {"!=": "$neq", "<": "$lt", "<=": "$lte", ">": "$gt", ">=": "$gte"}


def _leaf(leaf: NLeaf, params: dict[str, Any]) -> dict:
    f = leaf.field
    exists = {"$ex": {f: 1}}
    if leaf.op == "exists":
        return exists
    if leaf.op == "missing":
        return {"$nex": {f: 1}}
    v = _operand(leaf, params)
    if leaf.op == "==":
        return {"$and": [exists, {f: v}]}
    if leaf.op in _CMP:
        return {"$and": [exists, {_CMP[leaf.op]: {f: v}}]}
    if leaf.op == "matches":
        return {"$and": [exists, {"$mt": {f: v}}]}
    if leaf.op == "in":
        if not v:
            return {"$and": [exists, {"$nex": {f: 1}}]}  # never true
        return {"$and": [exists, {"$or": [{f: x} for x in v]}]}
    if leaf.op == "not_in":
        return {"$and": [exists, *({"$neq": {f: x}} for x in v)]}
    raise EngineError(f"operator {leaf.op!r} has no durable-rules form")


def _expr(n, params) -> dict:
    if isinstance(n, NLeaf):
        return _leaf(n, params)
    key = "$and" if isinstance(n, NAll) else "$or"
    return {key: [_expr(x, params) for x in n.items]}


def compile_item(patterns, params: dict[str, Any]) -> tuple[list[dict], list[str]]:
    """durable-rules 'all' list for one rule/case, and the names of its (non-absent) bindings.

    durable-rules fails (error 311) when a fact refers to a field its partner lacks, while a
    comparison with a missing field is simply false in hermes' semantics; so every field that
    a later pattern refers to (ref or join) is required to exist on the referred binding."""
    compiled = compile_patterns(patterns)
    needed: dict[str, set[str]] = {p.name: set() for p in compiled}
    for p in compiled:
        try:
            refs = and_refs(p.where)
        except ValueError as exc:
            raise EngineError(str(exc)) from None
        refs.extend((other, field) for field, other in p.join.items())
        for name, field in refs:
            needed.setdefault(name, set()).add(field)
    out = []
    names = []
    for p in compiled:
        parts: list[dict] = [{"kind": p.kind}]
        parts.extend({"$ex": {f: 1}} for f in sorted(needed.get(p.name, ())))
        for field, other in p.join.items():
            parts.append({"$ex": {field: 1}})
            parts.append({field: {_dname(other): field}})
        if p.where is not None:
            parts.append(_expr(p.where, params))
        cond = parts[0] if len(parts) == 1 else {"$and": parts}
        if p.absent:
            out.append({f"{_dname(p.name)}$not": cond})
        else:
            out.append({_dname(p.name): cond})
            names.append(p.name)
    return out, names


def _action(key: str):
    def action(c):  # exactly one parameter: two would make durable-rules run it asynchronously
        try:
            ruleset_name, rule_key = key.split("/", 1)
            item_id, names = _REGISTERED[ruleset_name][rule_key]
            bound = {n: dict(c._m[_dname(n)]) for n in names}
            _FIRED.append((item_id, bound))
        except Exception as exc:  # surfaced after the run; durable would swallow it
            _ERRORS.append(f"{key}: {type(exc).__name__}: {exc}")

    return action


def _register(kb, items, attr: str) -> str:
    definition: dict[str, dict] = {}
    meta: dict[str, tuple[str, list[str]]] = {}
    for i, entry in enumerate(items):
        item = entry.item
        all_, names = compile_item(getattr(item, attr), kb.params[item.id])
        rule_key = f"r{i}"
        definition[rule_key] = {"all": all_}
        meta[rule_key] = (item.id, names)
    digest = hashlib.sha1(json.dumps(definition, sort_keys=True, default=str).encode()).hexdigest()[:16]
    name = f"hermes_{attr}_{digest}"
    if name not in _REGISTERED:
        to_register = copy.deepcopy(definition)  # registration mutates the dict it is given
        for rule_key in to_register:
            to_register[rule_key]["run"] = _action(f"{name}/{rule_key}")
        _REGISTERED[name] = meta
        try:
            _host().set_rulesets({name: to_register})
        except Exception as exc:
            del _REGISTERED[name]
            raise EngineError(f"durable-rules rejected the compiled knowledge base: {exc}") from None
    return name


def run(kb, items, facts: list[dict[str, Any]], attr: str):
    """Matches of ``items`` (rules or cases) on ``facts`` (flat, with _id)."""
    from .engine import Match

    if _engine is None:
        raise EngineError(f"durable-rules is not importable here: {_IMPORT_ERROR}")
    if not items or not facts:
        return []
    with _LOCK:
        name = _register(kb, items, attr)
        host = _host()
        sid = f"s{next(_SID)}"
        _FIRED.clear()
        _ERRORS.clear()
        asserted = []
        try:
            for f in facts:
                msg = {**f, "sid": sid}
                try:
                    host.assert_fact(name, msg)
                    asserted.append(msg)
                except _engine.MessageNotHandledException:
                    asserted.append(msg)
                except _engine.MessageObservedException:
                    pass
                except Exception as exc:
                    raise EngineError(f"durable-rules refused fact {f.get('kind')}#{f.get('_id')}: {exc}") from None
            fired = list(_FIRED)
            errors = list(_ERRORS)
        finally:
            for msg in asserted:  # clean up by retraction, never delete_state
                try:
                    host.retract_fact(name, msg)
                except Exception:
                    pass
            _FIRED.clear()
            _ERRORS.clear()
    if errors:
        raise EngineError("an action failed inside durable-rules: " + "; ".join(errors[:3]))
    out = {}
    for item_id, bound in fired:
        clean = {k: {kk: vv for kk, vv in v.items() if kk != "sid"} for k, v in bound.items()}
        m = Match(item_id, clean)
        out[m.key()] = m
    return sorted(out.values(), key=Match.key)
