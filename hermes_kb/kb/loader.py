"""Load, validate and index the knowledge base (rules/*.yaml, cases/<category>/*.yaml).

YAML is read with the safe loader only. Every problem is reported as ``file:line:col: key:
message``: schema errors from pydantic are mapped back to the YAML node they came from, and
semantic checks (fact kinds and fields that exist, parameters declared, bindings defined,
unique ids, templates that parse) run on top.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..core.errors import ConfigError, HermesError
from . import cache
from .conditions import Leaf, Pattern, and_refs, leaves, normalize
from .files import kb_dirs, kb_files
from .models import Case, Rule
from .yaml_io import MAX_YAML_BYTES, LazyNodes, YamlLimitError, read_document, safe_yaml


class KbError(HermesError):
    """The knowledge base has problems; ``problems`` lists them one per line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        # one problem: one line naming the file, line, column and key; several: one line each
        super().__init__("\n".join(problems) if problems else "problems in the knowledge base")

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        return (self.__class__, (self.problems,))


@dataclass
class Entry:
    item: Rule | Case
    path: str
    nodes: Any  # the composed YAML node tree, to locate keys


@dataclass
class KnowledgeBase:
    rules: list[Entry] = field(default_factory=list)
    cases: list[Entry] = field(default_factory=list)
    params: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> name -> value in force

    def by_id(self, item_id: str) -> Entry | None:
        for e in (*self.rules, *self.cases):
            if e.item.id == item_id:
                return e
        return None

    def active_cases(self) -> list[Entry]:
        return [e for e in self.cases if e.item.status != "deprecated"]

    def active_rules(self) -> list[Entry]:
        return [e for e in self.rules if e.item.status != "deprecated"]


def _mark(node, loc: tuple) -> tuple[int, int]:
    """Line and column (1-based) of the YAML node at a pydantic error location."""
    best = node
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for k, v in node.value:
                if k.value == part or (part == "not_" and k.value == "not") or (part == "as_" and k.value == "as"):
                    nxt = v
                    best = k
                    break
            if nxt is None:
                continue  # union member names etc. are not in the YAML
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            best = node
    m = best.start_mark
    return m.line + 1, m.column + 1


def _node_at(node, loc: tuple):
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == part), node)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
    return node


def _leaf_mark(nodes, loc: tuple, field: str) -> tuple[int, int] | None:
    """Line/column of the leaf mapping ``{field: <field>, ...}`` under the node at loc."""
    stack = [_node_at(nodes, loc)]
    while stack:
        n = stack.pop()
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                if k.value == "field" and isinstance(v, yaml.ScalarNode) and v.value == field:
                    return n.start_mark.line + 1, n.start_mark.column + 1
            stack.extend(v for _, v in reversed(n.value))
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(reversed(n.value))
    return None


def _where(path: str, nodes, loc: tuple, msg: str, field: str | None = None) -> str:
    nodes = nodes.get() if isinstance(nodes, LazyNodes) else nodes
    line, col = _mark(nodes, loc) if nodes is not None else (1, 1)
    if field is not None and nodes is not None:
        line, col = _leaf_mark(nodes, loc, field) or (line, col)
    key = ".".join(str(x) for x in _plain(loc)) or "(file)"
    return f"{path}:{line}:{col}: {key}: {msg}"


def _plain(loc: tuple) -> tuple:
    """The error location without pydantic's union-member and validator names."""
    return tuple(x for x in loc if not (isinstance(x, str) and (x[:1].isupper() or "[" in x)))


def _schema_problems(p: str, nodes, exc: ValidationError) -> list[str]:
    """One problem per place: where a union (leaf or expression) failed every way, the error
    that got deepest into the YAML is the useful one."""
    best: dict[tuple, tuple[int, dict]] = {}
    for err in exc.errors():
        loc = _plain(tuple(err["loc"]))
        anchor = loc[:2]
        # deeper is better; at equal depth, a wrong value beats "extra key" (the other union member)
        depth = len(loc) * 2 + (err["type"] != "extra_forbidden")
        if anchor not in best or depth > best[anchor][0]:
            best[anchor] = (depth, err)
    return [_where(p, nodes, _plain(tuple(e["loc"])), e["msg"]) for _, e in best.values()]


def _fields(kind: str) -> set[str] | None:
    from ..facts import FACT_TYPES  # only when checking: a cached knowledge base needs no fact model

    cls = FACT_TYPES.get(kind)
    return None if cls is None else set(cls.model_fields)


def _check_patterns(patterns: list[Pattern], params: dict, base: tuple, p: str, nodes, problems: list[str]) -> dict:
    bound: dict[str, str] = {}
    for i, pat in enumerate(patterns):
        loc = (*base, i)
        fields = _fields(pat.fact)
        if fields is None:
            problems.append(_where(p, nodes, (*loc, "fact"), f"unknown fact kind {pat.fact!r} (see docs/facts.schema.json)"))
            continue
        for fld, other in pat.join.items():
            if other not in bound:
                problems.append(_where(p, nodes, (*loc, "join", fld), f"join refers to {other!r}, not bound by an earlier pattern"))
            elif fld not in fields or fld not in (_fields(bound[other]) or set()):
                problems.append(_where(p, nodes, (*loc, "join", fld), f"field {fld!r} is not in both {pat.fact!r} and {bound[other]!r}"))
        try:
            norm = normalize(pat.where_expr())
            and_refs(norm)
        except ValueError as exc:
            problems.append(_where(p, nodes, (*loc, "where"), str(exc)))
            norm = None
        for leaf in leaves(norm):
            wloc = (*loc, "where")
            if (bad := _bad_value(leaf.value)) is not None:
                problems.append(_where(p, nodes, wloc, f"value of {leaf.field!r} {bad}", leaf.field))
            if leaf.field not in fields:
                problems.append(_where(p, nodes, wloc, f"fact {pat.fact!r} has no field {leaf.field!r}", leaf.field))
            if leaf.param is not None and leaf.param not in params:
                problems.append(_where(p, nodes, wloc, f"parameter {leaf.param!r} is not declared", leaf.field))
            if leaf.ref is not None:
                name, _, fld = leaf.ref.partition(".")
                if name not in bound:
                    problems.append(_where(p, nodes, wloc, f"ref {leaf.ref!r}: {name!r} is not bound earlier", leaf.field))
                elif fld not in (_fields(bound[name]) or set()):
                    problems.append(_where(p, nodes, wloc, f"ref {leaf.ref!r}: {bound[name]!r} has no field {fld!r}",
                                           leaf.field))  # fmt: skip
        name = pat.as_ or f"p{i}"
        if pat.absent:
            continue
        if name in bound:
            problems.append(_where(p, nodes, (*loc, "as"), f"binding {name!r} used twice"))
        bound[name] = pat.fact
    return bound


def _scalar_ok(v: Any) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    return isinstance(v, (str, int, bool))


def _bad_value(v: Any) -> str | None:
    """Why a condition's value cannot be compared (None when it can): a mapping such as
    ``{"$gte": 1}`` would reach the rules engine as an operator of its own."""
    if v is None or _scalar_ok(v):
        return None if not (isinstance(v, str) and v.startswith("$")) else "must not start with '$'"
    if isinstance(v, list) and all(_scalar_ok(x) and not (isinstance(x, str) and x.startswith("$")) for x in v):
        return None
    return f"must be a number, a string, a boolean or a list of them (got {type(v).__name__} {str(v)[:40]})"


def _check_ref(ref, bound: dict, loc: tuple, p: str, nodes, problems: list[str]) -> None:
    if ref is None:
        return
    if ref.binding not in bound:
        problems.append(_where(p, nodes, loc, f"binding {ref.binding!r} is not bound by the conditions"))
    elif ref.field not in (_fields(bound[ref.binding]) or set()):
        problems.append(_where(p, nodes, loc, f"{bound[ref.binding]!r} has no field {ref.field!r}"))


def _check_examples(item, p: str, nodes, problems: list[str]) -> None:
    for which in ("fire", "no_fire"):
        for i, ex in enumerate(getattr(item.examples, which)):
            for j, fact in enumerate(ex.facts):
                loc = ("examples", which, i, "facts", j)
                kind = fact.get("kind")
                fields = _fields(kind) if isinstance(kind, str) else None
                if fields is None:
                    problems.append(_where(p, nodes, loc, f"example fact has unknown kind {kind!r}"))
                    continue
                for k in fact:
                    if k not in fields:
                        problems.append(_where(p, nodes, (*loc, k), f"fact {kind!r} has no field {k!r}"))
            for k in ex.params:
                if k not in item.parameters:
                    problems.append(_where(p, nodes, ("examples", which, i, "params", k), f"unknown parameter {k!r}"))


def load_kb(rules_dir: Path | None = None, cases_dir: Path | None = None,
            overrides: dict[str, dict[str, Any]] | None = None) -> KnowledgeBase:  # fmt: skip
    """Load and check every rule and case; raise KbError listing every problem found. A knowledge
    base that passed its checks is kept on disk as JSON documents (kb/cache.py, never pickled
    objects) and read back without parsing or checking again while no file changed."""
    d_rules, d_cases = (None, None) if rules_dir and cases_dir else kb_dirs()
    return _load_checked(rules_dir or d_rules, cases_dir or d_cases, overrides)


def named_for(path: Path, item_id: str) -> bool:
    """A rule's or case's file is named for its id: ``<id>.yaml`` or ``<id>-<words>.yaml``."""
    return path.stem == item_id or path.stem.startswith(item_id + "-")


def find_item_file(item_id: str, rules_dir: Path | None = None, cases_dir: Path | None = None) -> Path | None:
    """The file of a rule or case, found from its id in one step (its name starts with the id)."""
    d_rules, d_cases = kb_dirs()
    rules_dir, cases_dir = rules_dir or d_rules, cases_dir or d_cases
    pattern = [f"{item_id}.yaml", f"{item_id}-*.yaml"]
    for base, glob in ((Path(rules_dir), ""), (Path(cases_dir), "*/")):
        for pat in pattern:
            hits = sorted(base.glob(glob + pat))
            if hits:
                return hits[0]
    return None


def list_row(item: Rule | Case) -> dict[str, Any]:
    """What `hermes kb list` shows of an item (kept in the cache, so the list needs no model)."""
    return {"id": item.id, "status": item.status, "category": getattr(item, "category", None) or item.emit.category,
            "cause": getattr(item, "cause", ""), "title": item.title}  # fmt: skip


def _load_checked(rules_dir: Path, cases_dir: Path, overrides) -> KnowledgeBase:
    files = kb_files(rules_dir, cases_dir)
    digest, docs = cache.documents(files, MAX_YAML_BYTES)
    if docs is not None:
        kb = _from_cache(docs, Path(rules_dir), Path(cases_dir), overrides)
        if kb is not None:
            return kb
    docs = []
    kb = _load_files(files, overrides, docs)
    if digest is not None:
        cache.write(digest, docs)
    return _with_params(kb, overrides)


def _from_cache(docs: list[dict[str, Any]], rules_dir: Path, cases_dir: Path, overrides) -> KnowledgeBase | None:
    """The knowledge base from documents that passed every check when they were cached; None
    when one no longer validates (then the files are loaded and checked again)."""
    kb = KnowledgeBase()
    for doc in docs:
        model, base = (Rule, rules_dir) if doc["kind"] == "rule" else (Case, cases_dir)
        try:
            item = model.model_validate(doc["data"])
        except ValidationError:
            return None
        (kb.rules if model is Rule else kb.cases).append(Entry(item=item, path=str(base / doc["name"]), nodes=None))
    return _with_params(kb, overrides)


def _with_params(kb: KnowledgeBase, overrides) -> KnowledgeBase:
    """Each item's parameters in force: its defaults, replaced by the user's valid overrides
    (ConfigError naming the file and the first bad key otherwise)."""
    config_problems: list[str] = []
    for e in (*kb.rules, *kb.cases):
        item = e.item
        values = {k: v.default for k, v in item.parameters.items()}
        for k, v in (overrides or {}).get(item.id, {}).items():
            if (why := _override_problem(item, k, v)) is not None:
                config_problems.append(f"{item.id}.{k}: {why}")
                continue
            values[k] = v
        kb.params[item.id] = values
    ids = set(kb.params)
    for item_id in overrides or {}:
        if item_id not in ids:
            config_problems.append(f"{item_id}: no rule or case has this id (hermes kb list)")
    if config_problems:  # the user's --config: one line naming the file and the first key
        more = f" (and {len(config_problems) - 1} more)" if len(config_problems) > 1 else ""
        raise ConfigError(config_problems[0] + more, _config_name(overrides))
    return kb


def _load_files(files: list[tuple[str, str, Path]], overrides, docs: list[dict[str, Any]]) -> KnowledgeBase:
    """Parse and check every file; raise KbError listing every problem. ``docs`` receives each
    accepted item's document (what the cache keeps)."""
    from ..facts.whatif import known_target
    from .templates import check_template

    problems: list[str] = []
    kb = KnowledgeBase()
    seen: dict[str, str] = {}
    conditions: dict[str, str] = {}  # what an item matches on -> the item that has it
    for kind, name, path in files:
        model = Rule if kind == "rule" else Case
        p = str(path)
        try:
            data, nodes = read_document(path)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark else f"{p}:1:1"
            problems.append(f"{where}: (file): invalid YAML: {_one_line(getattr(exc, 'problem', None) or exc)}")
            continue
        except YamlLimitError as exc:
            problems.append(f"{p}:{exc.line}:{exc.column}: (file): {exc.problem}")
            continue
        except (OSError, RecursionError) as exc:
            problems.append(f"{p}:1:1: (file): cannot read: {_one_line(exc)}")
            continue
        if not isinstance(data, dict):
            problems.append(f"{p}:1:1: (file): expected a mapping at the top level")
            continue
        try:
            item = model.model_validate(data)
        except ValidationError as exc:
            problems.extend(_schema_problems(p, nodes, exc))
            continue
        if item.id in seen:
            problems.append(_where(p, nodes, ("id",), f"duplicate id {item.id!r} (also in {seen[item.id]})"))
            continue
        seen[item.id] = p
        n_before = len(problems)
        if not named_for(path, item.id):
            problems.append(_where(p, nodes, ("id",), f"the file name must start with the id: {item.id}-<short-title>.yaml "
                                                       f"(a rule or case is found by its id)"))  # fmt: skip
        if isinstance(item, Rule):
            bound = _check_patterns(item.when, item.parameters, ("when",), p, nodes, problems)
            _check_ref(item.emit.share, bound, ("emit", "share"), p, nodes, problems)
            _check_ref(item.emit.time, bound, ("emit", "time"), p, nodes, problems)
        else:
            if path.parent.name != item.category:
                problems.append(_where(p, nodes, ("category",), f"case in cases/{path.parent.name}/ has category {item.category!r}"))
            bound = _check_patterns(item.conditions, item.parameters, ("conditions",), p, nodes, problems)
            _check_ref(item.gain.removes, bound, ("gain", "removes"), p, nodes, problems)
            _check_ref(item.gain.step, bound, ("gain", "step"), p, nodes, problems)
            _check_ref(item.gain.at_most, bound, ("gain", "at_most"), p, nodes, problems)
            _check_ref(item.gain.removes_low, bound, ("gain", "removes_low"), p, nodes, problems)
            for i, ref in enumerate(item.gain.fraction_from or ()):
                _check_ref(ref, bound, ("gain", "fraction_from", i), p, nodes, problems)
            if item.gain.whatif is not None and not known_target(item.gain.whatif.target):
                problems.append(_where(p, nodes, ("gain", "whatif", "target"),
                                       f"unknown what-if target {item.gain.whatif.target!r} (docs/analysis/whatif.md)"))
            for problem in check_template(item.explanation):
                problems.append(_where(p, nodes, ("explanation",), problem))
        _check_examples(item, p, nodes, problems)
        if len(problems) > n_before:
            continue
        same = _conditions_key(item)
        if same in conditions:
            problems.append(_where(p, nodes, ("conditions" if isinstance(item, Case) else "when",),
                                   f"same conditions as {conditions[same]}: one of the two can never tell anything "
                                   "the other does not"))  # fmt: skip
            continue
        conditions[same] = f"{item.id} ({p})"
        entry = Entry(item=item, path=p, nodes=None)  # node trees are only needed while checking
        (kb.rules if isinstance(item, Rule) else kb.cases).append(entry)
        docs.append({"kind": kind, "name": name, "data": data, "row": list_row(item)})
    if problems:
        raise KbError(problems)
    return kb


def _one_line(v: Any) -> str:
    return " ".join(str(v).split())[:200]


def _conditions_key(item: Rule | Case) -> str:
    """What an item matches on, as text: its patterns, and for a rule what it derives."""
    pats = item.when if isinstance(item, Rule) else item.conditions
    key = {"kind": type(item).__name__, "patterns": [x.model_dump(by_alias=True, exclude_none=True) for x in pats],
           "params": {k: v.default for k, v in item.parameters.items()}}  # fmt: skip
    if isinstance(item, Rule):
        key["emit"] = item.emit.model_dump()
    return json.dumps(key, sort_keys=True, default=str)


def _config_name(overrides: Any) -> str:
    return str(getattr(overrides, "source", None) or "config")


def _override_problem(item: Rule | Case, name: str, value: Any) -> str | None:
    """Why a user's override cannot replace a parameter's value (None when it can): it must name
    a declared parameter and be of its type (a number for a number, finite)."""
    if name not in item.parameters:
        known = ", ".join(sorted(item.parameters)) or "none"
        return f"unknown parameter of {item.id} (its parameters: {known})"
    default = item.parameters[name].default
    if isinstance(default, bool):
        ok = isinstance(value, bool)
        want = "true or false"
    elif isinstance(default, (int, float)):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        want = "a number"
    else:
        ok = isinstance(value, str)
        want = "a string"
    return None if ok else f"must be {want} like its default {default!r} (got {type(value).__name__} {str(value)[:40]!r})"


class Overrides(dict):
    """A user's overrides, remembering the file they came from (for error messages)."""

    source: str | None = None


def load_overrides(path: Path) -> dict[str, dict[str, Any]]:
    """A user's threshold overrides: YAML ``{CASE_OR_RULE_ID: {param: value}}``. Unknown ids or
    parameters and values of the wrong type are errors (load_kb), never ignored."""
    try:
        data = safe_yaml(Path(path))
    except YamlLimitError as exc:
        raise ConfigError(f"cannot read config: {exc.problem}", str(path)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"invalid YAML: {_one_line(getattr(exc, 'problem', None) or exc)}", at) from None
    except (OSError, RecursionError) as exc:
        raise ConfigError(f"cannot read config: {_one_line(exc)}", str(path)) from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError("config must map rule/case ids to {parameter: value}", str(path))
    for k, v in data.items():
        if not isinstance(v, dict):
            raise ConfigError(f"{k}: expected a mapping {{parameter: value}} (got {type(v).__name__})", str(path))
    out = Overrides({str(k): {str(a): b for a, b in v.items()} for k, v in data.items()})
    out.source = str(path)
    return out


__all__ = ["Entry", "KbError", "KnowledgeBase", "Leaf", "find_item_file", "kb_dirs", "load_kb", "load_overrides", "named_for"]
