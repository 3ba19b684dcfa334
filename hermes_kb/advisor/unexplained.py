"""Bottlenecks no case explains: a rule fired, no finding covers it. Reported with the component,
its share, the candidate causes side by side (each with the first condition the trace does not
meet) and the measurements that tell them apart (the rule's ``tell_apart``): never "no
bottleneck found" while a rule fired (docs/advice.md)."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from ..kb.conditions import compare, compile_patterns, evaluate, leaves, resolve_operand
from ..kb.matches import Inference
from ..kb.loader import KnowledgeBase
from ..kb.models import Case, Rule
from .findings import MIN_REPORTED_SPEEDUP
from ..facts.breakdown import HOST_PARTS, TOP_COMPONENTS
from .report import Candidate, Finding, RankSummary, Unexplained

MAX_CANDIDATES = 4
# the step-breakdown rules emit these components; a finding of the same component on the rank
# explains them (no case binds them)
STEP_COMPONENTS = {"step_data": "data", "step_host": "host", "step_communication": "communication",
                   "step_idle": "idle"}  # fmt: skip
_COMPONENT_OF_CATEGORY = {"io": "data", "cpu": "host", "computation": "compute", "communication": "communication",
                          "parallel": "communication"}  # fmt: skip
_SUMMARY = {
    "data": "The step waits for the DataLoader on its critical path.",
    "host": "The host holds the step's critical path: the device waits for launches, operator dispatch or Python.",
    "communication": "Collectives that nothing hides hold the step's critical path.",
    "idle": "Part of the step is idle with nothing traced to explain it.",
}


# what tells the mechanisms behind a program phase apart, when a phase holds the step
PHASE_TELL = {
    "forward": "forward: which operators (hermes analyze --kind op_class: GEMMs, element-wise, attention) and how many "
               "per step (operator_dispatch); an evaluation run inside the step shows as a user_function",
    "backward": "backward: the same operator classes on the autograd thread, and in data-parallel jobs the gradient "
                "collectives inside it (comm_summary, bucket_fusion)",
    "optimizer": "optimizer: per-parameter (foreach=False) or fused implementation (optimizer_step facts)",
    "data": "data: in-process loading or workers that cannot keep up (dataloader_wait, loader_workers)",
    "user_code": "your code: the function named and what it runs (hermes analyze --kind user_function: operators, "
                 "read-backs, file calls, prints, a loop over tensors)",
    "communication": "collectives the program issues: their sizes and waits (comm_summary, comm_sync_wait)",
    "other": "untraced time on the training thread: record with Python stacks (with_stack=True) to name it",
}
PHASE_SHARE = 0.2  # a phase or a user function at least this share of the step is named in an unexplained entry


def program_note(facts: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """What the program phases say about the rank (largest phase, the user function named), and
    the measurements that tell the mechanisms behind them apart."""
    p = next((f for f in facts if f.get("kind") == "program_phases" and f.get("step") is None), None)
    if p is None:
        return "", []
    phase, share = str(p.get("largest_phase", "")), float(p.get("largest_phase_ratio") or 0.0)
    site, site_share = p.get("top_function"), float(p.get("top_function_ratio") or 0.0)
    parts, tell = [], []
    if share >= PHASE_SHARE:
        words = {"user_code": "the user's code outside forward, backward and the optimizer", "other": "untraced time",
                 "communication": "collectives it issues", "data": "waiting for data"}  # fmt: skip
        parts.append(f"the program spends {share:.0%} of the step in {words.get(phase, phase)}")
        if phase in PHASE_TELL:
            tell.append(PHASE_TELL[phase])
    if site and site_share >= PHASE_SHARE:
        parts.append(f"the user function {site} takes {site_share:.0%} besides training")
        tell.append(PHASE_TELL["user_code"])
    return (" Where the program spends it: " + "; ".join(parts) + "." if parts else ""), tell


def _component(rule: Rule) -> str:
    return STEP_COMPONENTS.get(rule.emit.component) or _COMPONENT_OF_CATEGORY.get(rule.emit.category, "host")


def _case_component(case: Case) -> str:
    return _COMPONENT_OF_CATEGORY.get(case.category, case.category)


def _binds_component(case: Case) -> set[str]:
    """Bottleneck components a case's conditions require (``component == X`` on a bottleneck)."""
    out: set[str] = set()
    for p in compile_patterns(case.conditions):
        if p.kind == "bottleneck" and not p.absent:
            out |= {lf.value for lf in leaves(p.where) if lf.field == "component" and lf.op == "==" and lf.value}
    return out


def why_not(kb: KnowledgeBase, case: Case, facts: list[dict[str, Any]], rank: int | None) -> tuple[int, str]:
    """(patterns the rank's facts meet before the first that fails, what fails). Joins are
    checked on the rank only; a pattern fails when no fact of its kind passes all its own leaves."""
    params = kb.params.get(case.id, {})
    mine = [f for f in facts if f.get("rank") in (rank, None)]
    met = 0
    for p in compile_patterns(case.conditions):
        cands = [f for f in mine if f.get("kind") == p.kind]
        if p.absent:
            if any(evaluate(p.where, f, params, {}) for f in cands if not any(lf.ref for lf in leaves(p.where))):
                return met, f"a {p.kind} fact rules it out"
            met += 1
            continue
        if not cands:
            return met, f"no {p.kind} fact on this rank"
        for lf in leaves(p.where):
            if lf.ref is not None:
                continue
            rhs = resolve_operand(lf, params, {})
            if not any(compare(f.get(lf.field), lf.op, rhs) for f in cands):
                seen = sorted({repr(f.get(lf.field)) for f in cands if f.get(lf.field) is not None})[:3]
                want = "" if lf.op in ("exists", "missing") else f" {rhs!r}"
                return met, f"needs {p.kind}.{lf.field} {lf.op}{want} (seen {', '.join(seen) or 'nothing'})"
        met += 1
    return met, "its conditions hold on their own, but not together on one rank"


def unexplained(inf: Inference, kb: KnowledgeBase, findings: list[Finding], platform: str,
                summary: Sequence[RankSummary] = ()) -> list[Unexplained]:  # fmt: skip
    """One entry per breakdown component that holds bottlenecks no shown finding explains: the
    step-level rule's share when it fired (the hierarchy's first level), the specific rules'
    otherwise; candidates and measurements of every rule involved, side by side."""
    rules = {e.item.id: e.item for e in kb.rules}
    cases = [e.item for e in kb.cases if e.item.hardware in ("any", platform)]
    shown = [f for f in findings if f.expected_speedup.high >= MIN_REPORTED_SPEEDUP]
    every = {f.case_id: f for f in findings for f in (f, *f.alternatives)}
    bound = {v["_id"] for m in inf.cases if m.item_id in every
             for v in m.bindings.values() if v.get("kind") == "bottleneck"}  # fmt: skip
    left: dict[str, list[tuple[Rule, dict]]] = defaultdict(list)
    for b in inf.facts:
        rule = rules.get(b.get("rule_id")) if b.get("kind") == "bottleneck" else None
        if rule is None:
            continue
        comp = _component(rule)
        r = b.get("rank")
        if rule.emit.component in STEP_COMPONENTS:
            covered = any(f.component == comp and (not f.ranks or r in f.ranks) for f in shown)
        else:
            covered = b["_id"] in bound
        if not covered:
            left[comp].append((rule, b))
    out: list[Unexplained] = []
    # once per job, not per rank: a job has thousands of ranks, each with its bottlenecks
    binds = {c.id: _binds_component(c) for c in cases}
    steps_of = Counter(f.get("rank") for f in inf.facts if f.get("kind") == "step_time")
    for comp, items in left.items():
        step = [(r, b) for r, b in items if r.emit.component in STEP_COMPONENTS]
        lead = step or items
        ranks = sorted({b["rank"] for _, b in items if b.get("rank") is not None})
        rank0 = max(lead, key=lambda x: x[1].get("share_ratio", 0.0))[1].get("rank")
        involved = list(dict.fromkeys(r.id for r, _ in items))
        emitted = {r.emit.component for r, _ in items}
        pool = {c.id: c for c in cases
                if emitted & binds[c.id] or (emitted & set(STEP_COMPONENTS) and _case_component(c) == comp)}  # fmt: skip
        mine = inf.rank_facts(rank0)
        scored = sorted(((*_why(kb, c, mine, rank0, every), c) for c in pool.values()),
                        key=lambda x: (-x[0], x[2].id))  # fmt: skip
        # a step rule's time is the breakdown's, already per step; the others' span the analysed window
        times = [b["time_us"] / (1 if step else max(1, steps_of[b.get("rank")]))
                 for _, b in lead if isinstance(b.get("time_us"), (int, float))]  # fmt: skip
        head = _SUMMARY.get(comp) if step else f"{lead[0][0].title}."
        title = head.rstrip(".")
        where, tell = program_note(mine)
        share = round(statistics.median(b.get("share_ratio", 0.0) for _, b in lead), 4)
        time_us = round(statistics.median(times), 3) if times else None
        # the component's number is the breakdown's, as the report prints it (one number per
        # component and rank); a rule that measured another share says so and names its measure
        bd_ratio, bd_us = breakdown_share([s for s in summary if not ranks or s.rank in ranks], comp)
        if bd_ratio is not None and abs(share - bd_ratio) > SAME_SHARE:
            rid = lead[0][0].id
            head += (f" {rid} measured {share:.0%} of the step"
                     + (f" ({time_us / 1e3:,.2f} ms per step)" if time_us else "")
                     + f" by its own definition (hermes kb show {rid}), which can count time the breakdown gives to "
                     f"another component or measure other steps; the breakdown's {bd_ratio:.0%} gives each moment of "
                     f"the step to one component only.")  # fmt: skip
        out.append(Unexplained(
            rule_id=lead[0][0].id, title=title, category=lead[0][0].emit.category, component=comp,
            ranks=ranks,
            share_ratio=share,
            time_us=time_us,
            breakdown_ratio=round(bd_ratio, 4) if bd_ratio is not None else None,
            breakdown_us=round(bd_us, 3) if bd_us is not None else None,
            summary=f"{head} No case of the knowledge base explains it on this trace (rules fired: "
                    f"{', '.join(involved)}); the closest cases are below, each with the first condition it misses."
                    + where,
            candidates=[Candidate(case_id=c.id, title=c.title, why_not=text) for _, text, c in scored[:MAX_CANDIDATES]],
            tell_apart=list(dict.fromkeys([*(t for r in {r.id: r for r, _ in items}.values() for t in r.tell_apart), *tell])),
        ))  # fmt: skip
    return sorted(out, key=lambda u: -(u.breakdown_ratio if u.breakdown_ratio is not None else u.share_ratio))


SAME_SHARE = 0.02  # a rule's share within this of the breakdown's is the same number, said once


def breakdown_share(rows: list, comp: str) -> tuple[float | None, float | None]:
    """The component's share of the mean step and its time per step as the report's breakdown
    shows them (RankSummary rows: ``breakdown_us`` over ``mean_step_us``), median over the rows;
    None when no row has a breakdown or the component is not one of its five."""
    if comp not in TOP_COMPONENTS:
        return None, None
    parts = HOST_PARTS if comp == "host" else (comp,)
    got = [(sum(float((s.breakdown_us or {}).get(f"{p}_us", 0.0)) for p in parts), float(s.mean_step_us))
           for s in rows if s.breakdown_us and s.mean_step_us]  # fmt: skip
    if not got:
        return None, None
    return statistics.median(t / m for t, m in got), statistics.median(t for t, _ in got)


def _why(kb: KnowledgeBase, case: Case, facts: list[dict[str, Any]], rank: int | None,
         fired: dict[str, Finding]) -> tuple[int, str]:  # fmt: skip
    f = fired.get(case.id)
    if f is not None and (not f.ranks or rank in f.ranks):
        if f.profile_only:
            return 99, "fired: the profile itself is the finding (a one-off cost in the analysed steps), see the findings"
        if f.expected_speedup.high < MIN_REPORTED_SPEEDUP:
            return 99, (f"fired, but its fix removes little of the step here "
                        f"({f.expected_speedup.low:.2f}x-{f.expected_speedup.high:.2f}x)")  # fmt: skip
        return 99, f"fired ({f.expected_speedup.low:.2f}x-{f.expected_speedup.high:.2f}x): see the findings"
    return why_not(kb, case, facts, rank)

