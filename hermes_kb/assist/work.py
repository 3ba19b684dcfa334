"""The MCP tools' bodies: each takes paths the server has already checked (``safety``) and
returns a JSON-able dict, made by the library's own calls: the same functions and inputs as
``hermes advise --format json``, ``hermes analyze --format json``, ``hermes kb explain``,
``hermes diff --format json`` and ``hermes monitor status``, so the numbers are theirs. Every
number an assistant may quote carries its provenance: the fact kind, rank, step and evidence
window it was measured on. Run in a worker process (``limits.run_limited``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..advisor.run import Advised, advise_bundle_full, advise_run_dir_full, advise_streamed
from ..analysis.run_dir import analyze_run_dir, as_run_dir
from ..core.errors import UsageError
from ..facts.base import Fact
from ..trace import discover, load

BRIEF_FIELDS = ("case_id", "title", "category", "severity", "confidence", "expected_speedup", "removable_us",
                "time_at_stake_us", "step_time_us", "share_of_step_ratio", "component", "replayed", "whatif_target",
                "ranks", "steps", "explanation", "within")  # fmt: skip
SCOPE_RE = re.compile(r"rank (\d+)|step (\d+)")


# ---- provenance ---------------------------------------------------------------------------------


def window_of(ranges) -> list[float] | None:
    """The evidence window: the first start to the last end of a fact's time ranges (µs from the
    bundle origin), or None where the fact has none (a monitor log's aggregate)."""
    ranges = [r for r in (ranges or []) if r and len(r) == 2]
    return [float(min(r[0] for r in ranges)), float(max(r[1] for r in ranges))] if ranges else None


def fact_provenance(f: Fact) -> dict:
    ev = f.evidence
    out: dict[str, Any] = {"fact": f.kind, "rank": f.rank, "step": f.step,
                           "evidence_window_us": window_of(ev.time_ranges_us)}  # fmt: skip
    if ev.events:
        out["events"] = ev.events[:5]
    if ev.note:
        out["note"] = ev.note
    return out


def fact_json(f: Fact) -> dict:
    return {**f.model_dump(mode="json"), "provenance": fact_provenance(f)}


def _scope(scope: str) -> tuple[int | None, int | None]:
    rank = step = None
    for m in SCOPE_RE.finditer(scope or ""):
        if m.group(1) is not None:
            rank = int(m.group(1))
        elif m.group(2) is not None:
            step = int(m.group(2))
    return rank, step


def finding_provenance(f: dict) -> list[dict]:
    """Where a finding's numbers come from: each evidence fact, and the what-if fact of its gain."""
    out = []
    for ev in f.get("evidence", []):
        rank, step = _scope(ev.get("scope", ""))
        out.append({"fact": ev.get("fact"), "rank": rank, "step": step, "scope": ev.get("scope"),
                    "evidence_window_us": window_of(ev.get("time_ranges_us"))})  # fmt: skip
    if f.get("replayed") and f.get("whatif_target"):
        out.append({"fact": "whatif", "target": f["whatif_target"], "ranks": f.get("ranks", []), "step": None,
                    "note": "the speedup range comes from this set's dependency-graph replay"})  # fmt: skip
    return out


# ---- inputs -------------------------------------------------------------------------------------


def advised(paths: list[str], *, top: int | None = None, rank: int | None = None, engine: str = "auto") -> Advised:
    """What ``hermes advise PATHS`` runs (cli/common.advised): a RUN_DIR, several rank files
    streamed rank by rank, or one bundle analysed here."""
    if (run_dir := as_run_dir(paths)) is not None:
        return advise_run_dir_full(run_dir, engine=engine, top=top, rank=rank)
    if len(discover(list(paths))) > 1:
        return advise_streamed(list(paths), engine=engine, top=top, rank=rank)
    return advise_bundle_full(load(list(paths)), engine=engine, top=top, rank=rank)


def analysed_facts(paths: list[str]) -> tuple[list[Fact], list[str]]:
    """What ``hermes analyze PATHS`` measures: a RUN_DIR's logs and captures, or the traces."""
    if (run_dir := as_run_dir(paths)) is not None:
        ra = analyze_run_dir(run_dir)
        return list(ra.facts), list(ra.warnings)
    from ..analysis.run import analyze_bundle

    bundle = load(list(paths))
    return analyze_bundle(bundle), [f"skipped {p.message}" for p in bundle.problems] + list(bundle.warnings)


# ---- the tools ----------------------------------------------------------------------------------


def advise(paths: list[str], fmt: str = "brief", top: int | None = None, rank: int | None = None) -> dict:
    """The report: its summary and the ranked findings with their evidence, gains and provenance."""
    import json

    from ..render.details import with_details
    from ..render.report import render_json, render_markdown

    adv = advised(paths, top=top, rank=rank)
    if fmt == "markdown":
        return {"markdown": render_markdown(adv.report)}
    report = json.loads(render_json(with_details(adv.report, adv.facts, adv.run)))
    findings = []
    for full in report.pop("findings"):
        f = full if fmt == "json" else {k: full.get(k) for k in BRIEF_FIELDS} | {
            "first_fix": (full.get("optimizations") or [{}])[0].get("title"),
            "alternatives": [a["case_id"] for a in full.get("alternatives", [])]}  # fmt: skip
        findings.append({**f, "provenance": finding_provenance(full)})
    if fmt != "json":  # the per-step series are for charts: left to the JSON resource
        for s in report.get("summary", []):
            s.pop("series", None)
    return {"report": report, "findings": findings}


def breakdown(paths: list[str], rank: int | None = None, per_step: bool = False) -> dict:
    """The step breakdown by component and the program phases, per rank (facts step_breakdown and
    program_phases: the mean per step over the analysed steps, and each step with per_step)."""
    facts, warnings = analysed_facts(paths)
    rows = []
    for f in facts:
        if f.kind not in ("step_breakdown", "program_phases") or (rank is not None and f.rank != rank):
            continue
        if f.step is not None and not per_step:
            continue
        rows.append(fact_json(f))
    return {"warnings": warnings, "items": rows}


def facts(paths: list[str], kinds: list[str] | None = None, rank: int | None = None, step: int | None = None,
          aggregate_only: bool = False) -> dict:  # fmt: skip
    """The facts ``hermes analyze`` measures, filtered by kind, rank and step, each with provenance."""
    all_facts, warnings = analysed_facts(paths)
    wanted = set(kinds or [])
    out = [fact_json(f) for f in all_facts
           if (not wanted or f.kind in wanted) and (rank is None or f.rank == rank)
           and (step is None or f.step == step) and (not aggregate_only or f.step is None)]  # fmt: skip
    counts: dict[str, int] = {}
    for f in all_facts:
        counts[f.kind] = counts.get(f.kind, 0) + 1
    return {"warnings": warnings, "kinds_in_input": counts, "items": out}


def explain(case_id: str, paths: list[str]) -> dict:
    """Why a case (or rule) did or did not fire: each condition with how many facts met it and
    the values seen (``hermes kb explain``)."""
    from ..advisor.knowledge import knowledge_base
    from ..kb.explain import explain_record

    kb = knowledge_base()
    if kb.by_id(case_id) is None:
        raise UsageError(f"no rule or case {case_id!r} (kb_search lists them)")
    all_facts, warnings = analysed_facts(paths)
    rec = explain_record(kb, case_id, all_facts)
    return {"case_id": case_id, "fires": rec["fires"], "verdict": rec["verdict"], "conditions": rec["conditions"],
            "text": rec["text"], "warnings": warnings}  # fmt: skip


def _whatif_fact(facts_: list[Fact], rank: int, target: str) -> Fact | None:
    return next((f for f in facts_ if f.kind == "whatif" and f.rank == rank and getattr(f, "target", None) == target), None)


def whatif(paths: list[str], rank: int | None = None, target: str | None = None, pattern: str | None = None,
           fraction: float = 0.5) -> dict:  # fmt: skip
    """The rank's dependency graph replayed with a named what-if set, or every event whose name
    matches ``pattern``, shortened by ``fraction``: the replayed span and what it removed."""
    from ..analysis.rank import analyze_rank
    from ..analysis.replay import matching_amounts, removed_by, replay_state

    if (target is None) == (pattern is None):
        raise UsageError("give either target (a what-if set, e.g. dataloader) or pattern (a regular expression over "
                         "event names)")  # fmt: skip
    if not 0.0 <= fraction <= 1.0:
        raise UsageError(f"fraction {fraction} is outside 0..1 (0.4: the events 40% shorter)")
    if as_run_dir(paths) is not None:
        raise UsageError("whatif replays a trace: give the capture (rank<R>.capture<ID>.json.gz) inside the RUN_DIR")
    bundle = load(list(paths))
    rank = bundle.rank_ids[0] if rank is None else rank
    if rank not in bundle.rank_ids:
        raise UsageError(f"no rank {rank} in the input (ranks: {', '.join(map(str, bundle.rank_ids))})")
    ctx, rank_facts = analyze_rank(bundle[rank], alone=True)  # replays as `hermes analyze` does, every set eagerly
    state = replay_state(ctx.shared, with_deferral=False)
    sets = sorted(f.target for f in rank_facts if f.kind == "whatif")
    if state is None:
        raise UsageError(f"rank {rank} has no replayable dependency graph (no steps, or no host timeline)")
    out: dict[str, Any] = {"rank": rank, "fraction": fraction}
    if target is not None:
        fact = _whatif_fact(rank_facts, rank, target)
        if fact is None or target not in state.amounts:
            raise UsageError(f"rank {rank} has no what-if set {target!r}; its sets: {', '.join(sets) or 'none'}")
        removed = max(0.0, removed_by(state, state.amounts[target], fraction, target in state.drop_waits))
        base = fact.replay_base_us
        out |= {"target": target, "description": fact.description, "own_us": fact.own_us,
                "critical_us": fact.critical_us, "nodes_count": fact.nodes_count, "drop_waits": fact.drop_waits,
                "analyze_points": {"removed_half_us": fact.removed_half_us, "removed_all_us": fact.removed_all_us,
                                   "replayed": fact.replayed},
                "provenance": fact_provenance(fact)}  # fmt: skip
    else:
        if len(pattern) > 200:
            raise UsageError("pattern longer than 200 characters")
        try:
            amounts, names, window = matching_amounts(ctx.shared, pattern)
        except re.error as exc:
            raise UsageError(f"pattern {pattern!r} is not a regular expression: {exc}") from None
        if not names:
            raise UsageError(f"no event on rank {rank}'s replay graph matches {pattern!r}")
        removed = max(0.0, removed_by(state, amounts, fraction))
        any_fact = next((f for f in rank_facts if f.kind == "whatif"), None)
        base = any_fact.replay_base_us if any_fact is not None else None
        out |= {"pattern": pattern, "events": names[:10], "events_count": len(names), "own_us": float(amounts.sum()),
                "nodes_count": int((amounts > 0).sum()),
                "provenance": {"fact": "whatif (replay of the rank's dependency graph)", "rank": rank, "step": None,
                               "evidence_window_us": window, "note": "the graph nodes the pattern names, each "
                               "shortened whole by the fraction; the window spans them"}}  # fmt: skip
    agg = next((f for f in rank_facts if f.kind == "step_breakdown" and f.step is None), None)
    steps = getattr(agg, "steps_count", None)
    out |= {"replay_base_us": base, "removed_us": removed,
            "replayed_span_us": None if base is None else base - removed,
            "speedup": None if not base or base - removed <= 0 else base / (base - removed),
            "steps_count": steps,
            "removed_per_step_us": removed / steps if steps else None,
            "note": "replay_base_us is the analysed span (first step start to last step end) as the replay "
                    "measures it; removed_us is what the replay with the events shortened takes off it",
            "sets_on_rank": sets}  # fmt: skip
    return out


def diff(before: list[str], after: list[str], top: int = 10) -> dict:
    """``hermes diff --format json``: step time by component, what changed, predictions met."""
    import json

    from ..render.diff import render_diff_json
    from ..tools.diff import diff_advised

    result = json.loads(render_diff_json(diff_advised(advised(before), advised(after), top=top)))
    prov = {"fact": "step_breakdown", "step": None, "before": before, "after": after,
            "note": "step times and components are each run's means per analysed step (its step_breakdown facts); "
                    "ops and kernels are means per step of the traced events"}  # fmt: skip
    return {**{k: v for k, v in result.items() if k != "ranks"}, "provenance": prov, "items": result.get("ranks", [])}


def kb_search(text: str | None = None, category: str | None = None) -> dict:
    """Cases whose id, title, cause, explanation or fixes mention ``text`` (all words), in ``category``."""
    from ..advisor.knowledge import knowledge_base

    kb = knowledge_base()
    words = [w.lower() for w in (text or "").split()]
    out = []
    for e in kb.active_cases():
        c = e.item
        if category and c.category != category:
            continue
        hay = " ".join([c.id, c.title, c.cause, c.explanation, *(o.title for o in c.optimizations),
                        *(str(o.how_to) for o in c.optimizations)]).lower()  # fmt: skip
        if all(w in hay for w in words):
            out.append({"case_id": c.id, "title": c.title, "category": c.category, "cause": c.cause,
                        "status": c.status, "hardware": c.hardware, "whatif": getattr(c.gain, "whatif", None),
                        "fixes": [{"title": o.title, "cost": o.cost, "risk": o.risk} for o in c.optimizations],
                        "resource": f"hermes://case/{c.id}"})  # fmt: skip
    return {"query": {"text": text, "category": category}, "items": out}


def case_yaml(case_id: str) -> str:
    from ..advisor.knowledge import knowledge_base

    entry = knowledge_base().by_id(case_id)
    if entry is None:
        raise UsageError(f"no rule or case {case_id!r}")
    return Path(entry.path).read_text(encoding="utf-8")


def monitor_status(run_dir: str) -> dict:
    """A monitor RUN_DIR: per rank its steps, step time, data wait and GC shares, the fluctuations
    that trigger captures, and the captures made (``hermes monitor status``)."""
    from ..core.errors import NoTracesError
    from ..monitor.logs import status
    from ..monitor.reader import read_run

    rows = status(Path(run_dir))
    if not rows:
        raise NoTracesError("no monitor logs (rank<R>.jsonl)", run_dir)
    run = read_run(run_dir)
    for r in rows:
        log = run.ranks.get(r["rank"])
        fl = [int(s) for s, f in zip(log.step, log.fluctuation) if f] if log is not None else []
        r["triggers"] = {"fluctuation_steps": fl[-20:], "note": "steps the monitor flagged as fluctuations (what "
                         "triggers an automatic capture)"}  # fmt: skip
        r["capture_records"] = log.captures[-10:] if log is not None else []
        r["capture_files"] = [str(p) for p in run.captures.get(r["rank"], [])]
        r["provenance"] = {"fact": "monitor log", "rank": r["rank"], "step": None,
                           "source": log.path if log is not None else None}  # fmt: skip
    return {"run_dir": run_dir, "warnings": list(run.warnings), "items": rows}


def schema(name: str) -> dict:
    if name == "facts":
        from ..facts import facts_json_schema

        return facts_json_schema()
    if name == "report":
        from ..advisor.report import Report

        return Report.model_json_schema()
    if name == "diff":
        from ..tools.diff import DiffResult

        return DiffResult.model_json_schema()
    if name in ("rule", "case"):
        from ..kb.models import Case, Rule

        return (Rule if name == "rule" else Case).model_json_schema(by_alias=True)
    raise UsageError(f"no schema {name!r} (facts, report, diff, rule, case)")


__all__ = ["advise", "advised", "analysed_facts", "breakdown", "case_yaml", "diff", "explain", "fact_provenance",
           "facts", "kb_search", "monitor_status", "schema", "whatif", "window_of"]  # fmt: skip
