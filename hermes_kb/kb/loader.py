"""Load, validate and index the knowledge base (rules/*.yaml, cases/<category>/*.yaml).

YAML is read with the safe loader only. Every problem is reported as ``file:line:col: key:
message``: schema errors from pydantic are mapped back to the YAML node they came from, and
semantic checks (fact kinds and fields that exist, parameters declared, bindings defined,
unique ids, templates that parse) run on top.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import yaml
from pydantic import ValidationError

from ..errors import HermesError
from ..facts import FACT_TYPES
from ..facts.whatif import known_target
from .conditions import Leaf, Pattern, and_refs, leaves, normalize
from .models import Case, Rule


class KbError(HermesError):
    """The knowledge base has problems; ``problems`` lists them one per line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(f"{len(problems)} problem(s) in the knowledge base:\n" + "\n".join(problems))

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


def kb_dirs() -> tuple[Path, Path]:
    """rules/ and cases/ as shipped: inside the package in a wheel install, at the repository
    root in a source checkout or editable install."""
    pkg = Path(__file__).resolve().parents[1]
    for base in (pkg, pkg.parent):
        if (base / "rules").is_dir() and (base / "cases").is_dir():
            return base / "rules", base / "cases"
    raise HermesError(f"the knowledge base (rules/, cases/) is not installed next to {pkg}")


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


_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML has it: ~14x faster


def _read(path: Path) -> tuple[Any, Any]:
    """The document and its node tree (for error positions), parsed once with a safe loader."""
    loader = _SAFE_LOADER(path.read_text(encoding="utf-8"))
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()
    return data, node


def _fields(kind: str) -> set[str] | None:
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


_JINJA = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)


def _kb_files(rules_dir: Path, cases_dir: Path) -> list[tuple[Path, type]]:
    files: list[tuple[Path, type]] = [(f, Rule) for f in sorted(Path(rules_dir).glob("*.yaml"))]
    files += [(f, Case) for f in sorted(Path(cases_dir).glob("*/*.yaml"))]
    return files


def load_kb(rules_dir: Path | None = None, cases_dir: Path | None = None,
            overrides: dict[str, dict[str, Any]] | None = None) -> KnowledgeBase:  # fmt: skip
    """Load and check every rule and case; raise KbError listing every problem found. (No cache
    on disk: a cached object would have to be unpickled, which runs code from whoever can write
    the cache directory; the checked KB is kept in memory by the advisor instead.)"""
    d_rules, d_cases = (None, None) if rules_dir and cases_dir else kb_dirs()
    return _load_checked(rules_dir or d_rules, cases_dir or d_cases, overrides)


def _load_checked(rules_dir: Path, cases_dir: Path, overrides) -> KnowledgeBase:
    problems: list[str] = []
    kb = KnowledgeBase()
    seen: dict[str, str] = {}
    for path, model in _kb_files(rules_dir, cases_dir):
        p = str(path)
        try:
            data, nodes = _read(path)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark else p
            problems.append(f"{where}: (file): invalid YAML: {getattr(exc, 'problem', exc)}")
            continue
        except OSError as exc:
            problems.append(f"{p}:1:1: (file): cannot read: {exc}")
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
            if item.gain.whatif is not None and not known_target(item.gain.whatif.target):
                problems.append(_where(p, nodes, ("gain", "whatif", "target"),
                                       f"unknown what-if target {item.gain.whatif.target!r} (docs/analysis/whatif.md)"))
            try:
                _JINJA.parse(item.explanation)
            except jinja2.TemplateSyntaxError as exc:
                problems.append(_where(p, nodes, ("explanation",), f"template error: {exc.message}"))
        _check_examples(item, p, nodes, problems)
        if len(problems) > n_before:
            continue
        entry = Entry(item=item, path=p, nodes=None)  # node trees are only needed while checking
        (kb.rules if isinstance(item, Rule) else kb.cases).append(entry)
        values = {k: v.default for k, v in item.parameters.items()}
        for k, v in (overrides or {}).get(item.id, {}).items():
            if k not in values:
                problems.append(f"{p}:1:1: parameters.{k}: override for unknown parameter of {item.id}")
            values[k] = v
        kb.params[item.id] = values
    if problems:
        raise KbError(problems)
    return kb


def load_overrides(path: Path) -> dict[str, dict[str, Any]]:
    """A user's threshold overrides: YAML ``{CASE_OR_RULE_ID: {param: value}}``."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise HermesError(f"cannot read config: {exc}", str(path)) from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise HermesError("config must map rule/case ids to {parameter: value}", str(path))
    return data


__all__ = ["Entry", "KbError", "KnowledgeBase", "Leaf", "kb_dirs", "load_kb", "load_overrides"]
