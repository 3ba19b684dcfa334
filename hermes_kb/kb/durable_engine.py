"""Everything durable-rules-specific lives here.

Sharp edges handled (docs/architecture.md, "The rules engine"): definitions are deep-copied before registration (it
mutates them); one Host per process, created lazily, without the background timer threads a
Host normally starts (they call into the C engine concurrently and crash it), and used from
one thread at a time behind a lock; rulesets are registered once per KB content (names carry a hash, since a name cannot
be registered twice); every analysis uses the same session id (``SESSION``) and cleans up by
retracting its facts (never delete_state): the C core keeps a state per session id for the life
of the process, so a fresh id per call grew the process by ~2.9 MB a call (60 advise calls:
+165 MB); with one id it holds flat (docs/reliability.md); numbers reach the engine sanitised (hermes_kb.facts.flat);
identical facts are never asserted twice (they carry a unique _id); "not handled" and
"observed" exceptions are expected and tolerated; actions take exactly one parameter (two
would make durable run them asynchronously) and an exception inside one is recorded and
raised after the run instead of being swallowed.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import HermesError
from ..facts.flat import sanitize_number
from .conditions import CompiledPattern, NAll, NLeaf, and_refs, compare, compile_patterns, evaluate, rank_local
from . import matches
from .matches import Match

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
_REGISTERED: dict[str, dict[str, tuple]] = {}  # ruleset name -> rule key -> (item id, bindings, PostFilter)
_KINDS: dict[str, frozenset[str]] = {}  # ruleset name -> the fact kinds its patterns match
_ABSENT_KINDS: dict[str, set[str]] = {}
_REGEX_KEYS: dict[tuple[str, str], str] = {}  # (field, pattern) -> flag field set on facts  # ruleset name -> kinds named by absent patterns
SESSION = "hermes"  # the one session id: a state per id lives as long as the process
_FIRED: list[tuple[str, dict[str, Any]]] = []
_ERRORS: list[str] = []


def available() -> bool:
    return _engine is not None


def _host():
    global _HOST
    if _HOST is None:

        class QuietHost(_engine.Host):
            def _run(self):
                # durable's Host starts timer threads that call into the C engine for every
                # ruleset, concurrently with the caller's thread: with many rulesets this crashed
                # the process (SIGSEGV in 2 of 3 `hermes kb test` runs). hermes uses neither
                # timers nor queued events (actions run inline in assert_fact), so none start.
                pass

        _HOST = QuietHost()
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
        # durable-rules' own regex dialect lacks classes like \d and differs in details, so
        # matches are decided by Python's re (the oracle's semantics) into a flag field per
        # (field, pattern) that is added to each fact before it is asserted
        key = _REGEX_KEYS.setdefault((f, v), f"_re{len(_REGEX_KEYS)}")
        return {key: 1}
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


def _conjuncts(n, params) -> list[dict]:
    """The where expression as a flat list of conjuncts (nested ands flattened)."""
    if n is None:
        return []
    if isinstance(n, NAll):
        return [c for x in n.items for c in _conjuncts(x, params)]
    expr = _expr(n, params)
    if "$and" in expr and len(expr) == 1:
        return list(expr["$and"])
    return [expr]


def _unique(parts: list[dict]) -> list[dict]:
    seen: set[str] = set()
    out = []
    for p in parts:
        key = json.dumps(p, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def _refers(conj: dict) -> bool:
    """Whether a compiled conjunct compares with another binding ({field: {binding: field}})."""
    for k, v in conj.items():
        if isinstance(v, dict):
            if k.startswith("$"):
                if any(isinstance(x, dict) for x in v.values()):
                    return True
            elif len(v) == 1 and next(iter(v)).startswith("b_"):
                return True
    return False


def _strip_cross_inequalities(n):
    """The expression without leaves that compare with another binding by an inequality
    (returned separately); they sit only where all conditions must hold (validated)."""
    if n is None:
        return None, []
    if isinstance(n, NLeaf):
        if n.ref is not None and n.op != "==":
            return None, [n]
        return n, []
    if isinstance(n, NAll):
        kept, taken = [], []
        for x in n.items:
            k, t = _strip_cross_inequalities(x)
            taken.extend(t)
            if k is not None:
                kept.append(k)
        return (NAll(tuple(kept)) if kept else None), taken
    return n, []  # refs never sit under any (validated)


@dataclass
class PostFilter:
    """Conditions checked in Python on each match durable-rules reports: cross-binding
    inequalities (durable-rules crashes or misjudges them: SIGSEGV in 3 of 8 runs of one case)
    and absent patterns (durable-rules never takes back a match that a later fact would
    have prevented, so its answer would depend on the order facts arrive in)."""

    refs: list[tuple[str, NLeaf]] = field(default_factory=list)
    absent: list[CompiledPattern] = field(default_factory=list)

    def keep(self, bound: dict[str, dict], by_kind: dict[str, list[dict]], params: dict[str, Any]) -> bool:
        for name, leaf in self.refs:
            other, _, fld = leaf.ref.partition(".")
            if not compare(bound[name].get(leaf.field), leaf.op, bound[other].get(fld)):
                return False
        for p in self.absent:
            for f in by_kind.get(p.kind, []):
                if all(f.get(k) is not None and f.get(k) == bound[o].get(k) for k, o in p.join.items()) and evaluate(
                    p.where, f, params, bound
                ):
                    return False
        return True


def compile_item(patterns, params: dict[str, Any]) -> tuple[list[dict], list[str], PostFilter]:
    """durable-rules 'all' list for one rule/case, the names of its (non-absent) bindings, and
    the conditions left to Python (PostFilter).

    durable-rules fails (error 311) when a fact refers to a field its partner lacks, while a
    comparison with a missing field is simply false in hermes' semantics; so every field that
    a later pattern refers to (ref or join) is required to exist on the referred binding."""
    compiled = compile_patterns(patterns)
    post = PostFilter()
    needed: dict[str, set[str]] = {p.name: set() for p in compiled}
    for p in compiled:
        try:
            refs = and_refs(p.where)
        except ValueError as exc:
            raise EngineError(str(exc)) from None
        if p.absent:
            continue
        refs.extend((other, field) for field, other in p.join.items())
        for name, field in refs:
            needed.setdefault(name, set()).add(field)
    out = []
    names = []
    for p in compiled:
        if p.absent:
            post.absent.append(p)
            continue
        where, taken = _strip_cross_inequalities(p.where)
        post.refs.extend((p.name, leaf) for leaf in taken)
        # One flat conjunction, comparisons with other bindings first: durable-rules ignores a
        # cross-binding comparison that follows another condition inside a nested $and.
        parts: list[dict] = [{"kind": p.kind}]
        parts.extend({"$ex": {f: 1}} for f in sorted(needed.get(p.name, ())))
        parts.extend({"$ex": {leaf.field: 1}} for leaf in taken)
        cross: list[dict] = []
        local: list[dict] = []
        for field_, other in p.join.items():
            parts.append({"$ex": {field_: 1}})
            cross.append({field_: {_dname(other): field_}})
        for conj in _conjuncts(where, params):
            (cross if _refers(conj) else local).append(conj)
        parts = _unique([parts[0], *cross, *parts[1:], *local])
        cond = parts[0] if len(parts) == 1 else {"$and": parts}
        out.append({_dname(p.name): cond})
        names.append(p.name)
    return out, names, post


def _action(key: str):
    def action(c):  # exactly one parameter: two would make durable-rules run it asynchronously
        try:
            ruleset_name, rule_key = key.split("/", 1)
            item_id, names, post = _REGISTERED[ruleset_name][rule_key]
            bound = {n: dict(c._m[_dname(n)]) for n in names}
            _FIRED.append((item_id, bound, post))
        except Exception as exc:  # surfaced after the run; durable would swallow it
            _ERRORS.append(f"{key}: {type(exc).__name__}: {exc}")

    return action


def _register(kb, items, attr: str) -> str:
    """The ruleset of ``items``, compiled and registered once per knowledge base, items and
    parameters (compiling 194 items took ~35 ms of every advise). The cache lives on the KB and
    holds the items it was made from, so an id in its key is never another object's."""
    params = json.dumps([kb.params.get(e.item.id) for e in items], sort_keys=True, default=str)
    key = (attr, tuple(id(e.item) for e in items), params)
    cache = kb.__dict__.setdefault("_durable_rulesets", {})
    hit = cache.get(key)
    if hit is not None and hit[1] in _REGISTERED:
        return hit[1]
    name = _compile_and_register(kb, items, attr)
    cache[key] = ([e.item for e in items], name)
    return name


def _compile_and_register(kb, items, attr: str) -> str:
    definition: dict[str, dict] = {}
    meta: dict[str, tuple[str, list[str]]] = {}
    for i, entry in enumerate(items):
        item = entry.item
        all_, names, post = compile_item(getattr(item, attr), kb.params[item.id])
        rule_key = f"r{i}"
        definition[rule_key] = {"all": all_}
        meta[rule_key] = (item.id, names, post)
    digest = hashlib.sha1(json.dumps(definition, sort_keys=True, default=str).encode()).hexdigest()[:16]
    name = f"hermes_{attr}_{digest}"
    if name not in _REGISTERED:
        _KINDS[name] = frozenset(p.kind for e in items for p in compile_patterns(getattr(e.item, attr)) if not p.absent)
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


def _drain(host, name: str, sid: str) -> None:
    """Retract whatever facts the session still holds (none after a clean run): the next
    analysis reuses the session and must start from nothing."""
    try:
        left = host.get_facts(name, sid)
    except Exception:
        return
    for f in left or []:
        try:
            host.retract_fact(name, f)
        except Exception:
            pass


# Above this many facts, the rules and cases whose bindings all join on rank run a group of
# ranks at a time (a match of theirs never spans two ranks), so the engine holds one group's
# facts, not the job's: at 256 DLRM ranks the cases' run held ~60 MB, ~0.25 MB a rank.
PARTITION_MIN_FACTS = 20_000


def _partitions(items, facts: list[dict[str, Any]], attr: str) -> list[tuple[list, list[list[dict[str, Any]]]]]:
    """(items, fact groups) to run: every item on all facts, or, for a large job, the rank-local
    items on groups of matches.PARTITION_RANKS ranks (and the facts without a rank as one more group)."""
    if len(facts) < PARTITION_MIN_FACTS:
        return [(list(items), [facts])]
    is_local = [rank_local(getattr(e.item, attr)) for e in items]
    local = [e for e, yes in zip(items, is_local) if yes]
    spread = [e for e, yes in zip(items, is_local) if not yes]
    by_rank: dict[Any, list[dict[str, Any]]] = {}
    for f in facts:
        by_rank.setdefault(f.get("rank"), []).append(f)
    ranks = sorted((r for r in by_rank if r is not None), key=lambda r: (str(type(r)), r))
    size = matches.PARTITION_RANKS
    groups = [[f for r in ranks[i:i + size] for f in by_rank[r]] for i in range(0, len(ranks), size)]
    if None in by_rank:
        groups.append(by_rank[None])
    return [(spread, [facts]), (local, groups)]


def _fire(host, name: str, facts: list[dict[str, Any]], sid: str) -> tuple[list, list]:
    """Assert ``facts`` (those of a kind the ruleset's patterns name) into ruleset ``name``,
    collect what fired, retract them all. Called under _LOCK."""
    _FIRED.clear()
    _ERRORS.clear()
    asserted = []
    try:
        # a fact of a kind no pattern names matches nothing: the engine never holds it (at
        # 256 DLRM ranks the cases' run held 62 MB, most of it facts no case reads)
        kinds = _KINDS.get(name)
        for f in facts:
            if kinds is not None and f.get("kind") not in kinds:
                continue
            msg = {**f, "sid": sid}
            for (field, pattern), key in _REGEX_KEYS.items():
                value = f.get(field)
                if isinstance(value, str):
                    msg[key] = 1 if re.fullmatch(pattern, value) else 0
            try:
                host.assert_fact(name, msg)
                asserted.append(msg)
            except _engine.MessageNotHandledException:
                asserted.append(msg)
            except _engine.MessageObservedException:
                pass
            except Exception as exc:
                raise EngineError(f"durable-rules refused fact {f.get('kind')}#{f.get('_id')}: {exc}") from None
        return list(_FIRED), list(_ERRORS)
    finally:
        for msg in asserted:  # clean up by retraction, never delete_state
            try:
                host.retract_fact(name, msg)
            except Exception:
                pass
        _drain(host, name, sid)
        _FIRED.clear()
        _ERRORS.clear()


def _given(by_id: dict[Any, dict], bound: dict[str, Any]) -> dict[str, Any]:
    """The fact as it was given rather than durable-rules' copy of it, when they are equal: a
    fact bound by many matches (a rank's step breakdown) is then held once, not once a match."""
    mine = by_id.get(bound.get("_id"))
    return mine if mine == bound else bound


def run(kb, items, facts: list[dict[str, Any]], attr: str):
    """Matches of ``items`` (rules or cases) on ``facts`` (flat, with _id)."""
    if _engine is None:
        raise EngineError(f"durable-rules is not importable here: {_IMPORT_ERROR}")
    if not items or not facts:
        return []
    fired: list = []
    errors: list = []
    with _LOCK:
        host = _host()
        for its, groups in _partitions(items, facts, attr):
            if not its:
                continue
            name = _register(kb, its, attr)
            for group in groups:
                got, errs = _fire(host, name, group, SESSION)
                fired.extend(got)
                errors.extend(errs)
    if errors:
        raise EngineError("an action failed inside durable-rules: " + "; ".join(errors[:3]))
    by_kind: dict[str, list[dict]] = {}
    by_id: dict[Any, dict] = {}
    for f in facts:
        by_kind.setdefault(f.get("kind", ""), []).append(f)
        by_id[f.get("_id")] = f
    out = {}
    for item_id, bound, post in fired:
        clean = {k: _given(by_id, {kk: vv for kk, vv in v.items() if kk != "sid" and not kk.startswith("_re")})
                 for k, v in bound.items()}  # fmt: skip
        params = {k: sanitize_number(v) for k, v in kb.params[item_id].items()}
        if not post.keep(clean, by_kind, params):
            continue
        m = Match(item_id, clean)
        out[m.key()] = m
    return sorted(out.values(), key=Match.key)
