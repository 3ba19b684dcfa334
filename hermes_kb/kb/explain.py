"""`hermes kb explain ID PATH`: why a rule or case did or did not fire, condition by condition."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..facts.base import Fact
from ..facts.flat import sanitize_number
from .conditions import NLeaf, compare, compile_patterns, evaluate, leaves, match_all, resolve_operand
from .matches import facts_by_kind, derive_bottlenecks, prepare, python_matches
from .loader import KnowledgeBase


def _scope(f: Mapping[str, Any]) -> str:
    parts = [f"rank {f['rank']}" if f.get("rank") is not None else "", f"step {f['step']}" if f.get("step") is not None else ""]
    return ", ".join(p for p in parts if p) or "job"


def _leaf_text(leaf: NLeaf, params: Mapping[str, Any]) -> str:
    if leaf.param is not None:
        rhs = f"{leaf.param} (= {params[leaf.param]})"
    elif leaf.ref is not None:
        rhs = leaf.ref
    else:
        rhs = repr(leaf.value) if leaf.op not in ("exists", "missing") else ""
    return f"{leaf.field} {leaf.op} {rhs}".strip()


def explain(kb: KnowledgeBase, item_id: str, facts: list[Fact]) -> str:
    return "\n".join(explain_record(kb, item_id, facts)["text"])


def explain_record(kb: KnowledgeBase, item_id: str, facts: list[Fact]) -> dict[str, Any]:
    """``explain`` as data: its text lines, each local condition (how many candidates passed,
    the values seen), whether the item fires and the verdict line."""
    entry = kb.by_id(item_id)
    assert entry is not None
    item = entry.item
    is_rule = item_id.startswith("R-")
    flat = prepare(facts)
    lines = [f"{item_id}: {item.title}  ({entry.path})"]
    if not is_rule:
        rule_matches = python_matches(kb.active_rules(), flat, kb, "when")
        derived = derive_bottlenecks(kb, rule_matches, len(flat))
        flat = flat + derived
        lines.append(f"rules derived {len(derived)} bottleneck fact(s): "
                     + (", ".join(f"{d['category']}/{d['component']} {_scope(d)} share {d['share_ratio']:.0%}"
                                  for d in derived[:8]) or "none"))  # fmt: skip
    params = {k: sanitize_number(v) for k, v in kb.params[item_id].items()}
    patterns = compile_patterns(item.when if is_rule else item.conditions)
    by_kind = facts_by_kind(flat)
    conditions: list[dict[str, Any]] = []
    for p in patterns:
        cands = by_kind.get(p.kind, [])
        head = f"- pattern {p.name}: {'no ' if p.absent else ''}fact '{p.kind}'"
        if p.join:
            head += " joined on " + ", ".join(f"{k} = {v}.{k}" for k, v in p.join.items())
        lines.append(f"{head}: {len(cands)} candidate(s)")
        for leaf in leaves(p.where):
            if leaf.ref is not None:
                lines.append(f"    {_leaf_text(leaf, params)}: depends on {leaf.ref.split('.')[0]} (checked in the full match)")
                continue
            rhs = resolve_operand(leaf, params, {})
            passing = [c for c in cands if compare(c.get(leaf.field), leaf.op, rhs)]
            seen = ", ".join(f"{_scope(c)}: {c.get(leaf.field)!r}" for c in cands[:4]) + (" ..." if len(cands) > 4 else "")
            lines.append(f"    {_leaf_text(leaf, params)}: {len(passing)}/{len(cands)} pass  [seen {seen or 'nothing'}]")
            conditions.append({"condition": _leaf_text(leaf, params), "held": bool(passing), "passing": len(passing),
                               "candidates": len(cands), "seen": seen or "nothing"})  # fmt: skip
        whole = [c for c in cands if evaluate(p.where, c, params, {})] if not any(
            lf.ref for lf in leaves(p.where)
        ) else None  # fmt: skip
        if whole is not None:
            lines.append(f"    all conditions of {p.name}: {len(whole)}/{len(cands)} candidate(s)")
    matches = match_all(patterns, by_kind, params)
    verdict = f"FIRES {len(matches)} time(s)" if matches else "does NOT fire"
    lines.append(f"=> {item_id} {verdict} on this trace")
    for m in matches[:5]:
        lines.append("   " + "; ".join(f"{k}: {v.get('kind')} ({_scope(v)})" for k, v in m.items()))
    return {"text": lines, "conditions": conditions, "fires": bool(matches), "verdict": f"{item_id} {verdict} on this trace"}
