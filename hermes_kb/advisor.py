"""From matches to ranked findings with expected gains, and the Report.

Expected gain of a finding: the per-step time R the case's optimization can remove (a field
the case names, taken from overlap / critical-path / exposed-time facts, never a raw total),
the step time T it is part of, and the case's fraction range [f_lo, f_hi] of R the fix
removes: speedup = T / (T - f * R). Severity is by the share of the step at stake, the most
the fix can remove, f_hi * R / T: high >= 10%, medium >= 3%, low below (docs/advice.md).
"""

from __future__ import annotations

import os
import statistics
import threading
from collections import defaultdict
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import SandboxedEnvironment

from . import __version__
from .analysis import analyze_bundle
from .facts.base import Fact
from .kb.engine import EngineName, Inference, Match, infer
from .kb.loader import KnowledgeBase, load_kb, load_overrides
from .kb.models import Case
from .report import (
    SEVERITY_ORDER,
    EvidenceItem,
    Finding,
    Inputs,
    KbInfo,
    OptimizationAdvice,
    RankSummary,
    Report,
    Speedup,
    StepSummary,
)
from .trace import TraceBundle, load

HIGH_SHARE = 0.10
MEDIUM_SHARE = 0.03
_KB_LOCK = threading.Lock()


def severity_of(share: float) -> str:
    return "high" if share >= HIGH_SHARE else "medium" if share >= MEDIUM_SHARE else "low"


@lru_cache(maxsize=8)
def _kb_cached(config: str | None) -> KnowledgeBase:
    overrides = load_overrides(Path(config)) if config else None
    return load_kb(overrides=overrides, use_cache=True)


def knowledge_base(config: str | os.PathLike | None = None) -> KnowledgeBase:
    with _KB_LOCK:
        return _kb_cached(str(config) if config else None)


class _Obj(dict):
    """A flat fact as template variables: attribute access, missing fields render empty."""

    def __getattr__(self, name: str) -> Any:
        return self.get(name)


def _ms(v: Any) -> str:
    return f"{float(v) / 1e3:,.1f} ms" if isinstance(v, (int, float)) else "?"


def _pct(v: Any) -> str:
    return f"{float(v):.0%}" if isinstance(v, (int, float)) else "?"


def _mb(v: Any) -> str:
    return f"{float(v) / 1e6:,.1f} MB" if isinstance(v, (int, float)) else "?"


_ENV = SandboxedEnvironment(undefined=jinja2.ChainableUndefined, autoescape=False)
_ENV.filters.update(ms=_ms, pct=_pct, mb=_mb, us=lambda v: f"{float(v):,.1f} µs" if isinstance(v, (int, float)) else "?")


def _explain(case: Case, m: Match, originals: dict | None = None) -> str:
    def fields(flat: dict) -> _Obj:
        # the engines see scalars only; the template also gets the fact's lists (e.g. spike steps)
        orig = (originals or {}).get(flat.get("_id"))
        full = orig.model_dump(exclude={"evidence"}) if orig is not None else {}
        return _Obj({**{k: v for k, v in full.items() if isinstance(v, list)}, **flat})

    try:
        return _ENV.from_string(case.explanation).render(**{k: fields(v) for k, v in m.bindings.items()}).strip()
    except jinja2.TemplateError as exc:
        return f"{case.title} ({exc})"


def _platform(bundle: TraceBundle) -> str:
    if any(t.meta.format == "ascend" for t in bundle):
        return "npu"
    if any(t.has_device for t in bundle):
        return "gpu"
    return "cpu"


def _how_to(case_opt, platform: str) -> str:
    h = case_opt.how_to
    if platform == "npu":
        return h.npu or h.any or h.gpu or ""
    return (h.gpu if platform == "gpu" else None) or h.any or h.gpu or h.npu or ""


def _mean_step(facts: list[dict[str, Any]]) -> dict[int | None, float]:
    per_rank: dict[int | None, list[float]] = defaultdict(list)
    for f in facts:
        if f.get("kind") == "step_time" and isinstance(f.get("duration_us"), (int, float)):
            per_rank[f.get("rank")].append(float(f["duration_us"]))
    out = {r: statistics.fmean(v) for r, v in per_rank.items() if v}
    alls = [x for v in per_rank.values() for x in v]
    if alls:
        out[None] = statistics.fmean(alls)
    return out


def _value(m: Match, ref) -> float | None:
    """The number a case's field reference points at in one match (None when absent or not a number)."""
    v = m.bindings.get(ref.binding, {}).get(ref.field) if ref is not None else None
    return float(v) if isinstance(v, (int, float)) else None


def _gain(case: Case, m: Match, step_means: dict) -> tuple[float, float, float | None, float] | None:
    """(removable R, step T, bound on what the fix removes or None, R at the measurement's low end)
    of one match."""
    r = _value(m, case.gain.removes)
    if r is None:
        return None
    t = _value(m, case.gain.step)
    if t is None or t <= 0:
        rank = m.bindings.get(case.gain.removes.binding, {}).get("rank")
        t = step_means.get(rank, step_means.get(None))
    if not isinstance(t, (int, float)) or t <= 0:
        return None
    t = float(t)
    c = _value(m, case.gain.at_most)
    cap = min(max(c, 0.0), t) if c is not None else None
    r = min(max(r, 0.0), t)
    low = _value(m, case.gain.removes_low)
    r_low = min(max(low, 0.0), r) if low is not None else r
    return r, t, cap, r_low


def _evidence(m: Match, inf: Inference) -> list[EvidenceItem]:
    out = []
    for name, flat in m.bindings.items():
        fact: Fact | None = inf.originals.get(flat["_id"])
        values = {k: v for k, v in flat.items() if k not in ("_id", "kind", "rank", "step", "sid")}
        ev = fact.evidence if fact is not None else None
        out.append(
            EvidenceItem(
                fact=flat.get("kind", "?"),
                scope=fact.scope() if fact is not None else "",
                values=values,
                time_ranges_us=list(ev.time_ranges_us[:5]) if ev else [],
                events=list(ev.events[:10]) if ev else [],
                note=ev.note if ev else None,
            )
        )
    return out


def findings_from(inf: Inference, kb: KnowledgeBase, platform: str) -> list[Finding]:
    cases = {e.item.id: e.item for e in kb.cases}
    step_means = _mean_step(inf.facts)
    by_case: dict[str, list[Match]] = defaultdict(list)
    for m in inf.cases:
        case = cases[m.item_id]
        if case.hardware != "any" and case.hardware != platform:
            continue
        by_case[m.item_id].append(m)
    findings: list[Finding] = []
    for case_id, matches in by_case.items():
        case = cases[case_id]
        gains = [g for g in (_gain(case, m, step_means) for m in matches) if g is not None]
        if not gains:
            continue
        # several matches (ranks, steps) of one case become one finding: the median removable time
        # and step time across them (data-parallel ranks wait for each other, so one rank's gain
        # is not the job's; the median is the typical rank)
        r = statistics.median(g[0] for g in gains)
        t = statistics.median(g[1] for g in gains)
        caps = [g[2] for g in gains if g[2] is not None]
        cap = statistics.median(caps) if len(caps) == len(gains) else None
        r_low = statistics.median(g[3] for g in gains)
        lo, hi = case.gain.fraction
        rm_lo, rm_hi = lo * r_low, hi * r
        if cap is not None:
            rm_lo, rm_hi = min(rm_lo, cap), min(rm_hi, cap)
        sp_lo = t / max(t - rm_lo, 1e-9)
        sp_hi = t / max(t - rm_hi, 1e-9)
        share = r / t
        # at stake: what the fix can remove at best, as a share of the step
        at_stake = rm_hi / t
        severity = severity_of(at_stake)
        if case.max_severity is not None and SEVERITY_ORDER[severity] > SEVERITY_ORDER[case.max_severity]:
            severity = case.max_severity
        ranks = sorted({v.get("rank") for m in matches for v in m.bindings.values() if v.get("rank") is not None})
        steps = sorted({v.get("step") for m in matches for v in m.bindings.values() if v.get("step") is not None})
        best = max(matches, key=lambda m: sum(1 for v in m.bindings.values() if v.get("step") is None))
        confidence = 0.8 if case.status == "stable" else 0.6
        if len(steps) >= 3 or any(v.get("step") is None for v in best.bindings.values()):
            confidence += 0.1
        assumption = (f"{case.gain.assumption.strip()} Measured: {r / 1e3:,.2f} ms removable out of {t / 1e3:,.2f} ms "
                      f"of step time ({share:.0%}; median over {len(gains)} match(es)); the fix removes {lo:.0%}-{hi:.0%} "
                      f"of it; speedup = step time / (step time - removed).")  # fmt: skip
        if r_low < r:
            assumption += (f" The measurement is itself a range: {r_low / 1e3:,.2f}-{r / 1e3:,.2f} ms removable "
                           f"({case.gain.removes_low.field} to {case.gain.removes.field}); the low end of the "
                           f"speedup starts from the smaller one.")  # fmt: skip
        if cap is not None and cap < hi * r:
            assumption += (f" Bound: at most {cap / 1e3:,.2f} ms can go ({case.gain.at_most.field}, "
                           f"{cap / t:.0%} of the step), which caps the range.")  # fmt: skip
        findings.append(
            Finding(
                case_id=case.id,
                title=case.title,
                category=case.category,
                cause=case.cause,
                severity=severity,
                confidence=round(min(confidence, 0.95), 2),
                expected_speedup=Speedup(low=round(sp_lo, 3), high=round(sp_hi, 3)),
                time_at_stake_us=round(r, 3),
                step_time_us=round(t, 3),
                share_of_step_ratio=round(share, 4),
                assumption=assumption,
                ranks=ranks,
                steps=steps,
                evidence=_evidence(best, inf),
                optimizations=[
                    OptimizationAdvice(title=o.title, how_to=_how_to(o, platform), snippet=o.snippet, cost=o.cost,
                                       risk=o.risk)  # fmt: skip
                    for o in case.optimizations
                ],
                explanation=_explain(case, best, inf.originals),
                references=list(case.references),
            )
        )
    return merge_findings(findings)


def _evidence_key(f: Finding) -> tuple:
    return tuple(sorted((e.fact, e.scope) for e in f.evidence if e.fact != "bottleneck"))


def merge_findings(findings: list[Finding]) -> list[Finding]:
    """Rank by expected gain, then confidence; a finding resting on exactly the same evidence as
    a better one is folded into it (listed under ``related``)."""
    ranked = sorted(findings, key=lambda f: (-(f.expected_speedup.low + f.expected_speedup.high), -f.confidence,
                                               f.case_id))  # fmt: skip
    kept: list[Finding] = []
    by_key: dict[tuple, Finding] = {}
    for f in ranked:
        key = _evidence_key(f)
        if key and key in by_key:
            by_key[key].related.append(f.case_id)
            continue
        by_key[key] = f
        kept.append(f)
    return kept


def _summary(bundle: TraceBundle, facts: list[Fact]) -> list[RankSummary]:
    out = []
    for t in bundle:
        steps = [StepSummary(step=f.step, duration_us=round(f.duration_us, 3))
                 for f in facts if f.kind == "step_time" and f.rank == t.rank]  # fmt: skip
        breakdown: dict[str, float] = {}
        for f in facts:
            if f.rank == t.rank and f.step is None and f.kind in ("step_breakdown", "overlap_breakdown", "multi_component_overlap"):
                breakdown = {k: round(float(v), 3) for k, v in f.model_dump().items()
                             if k.endswith("_us") and isinstance(v, (int, float))}  # fmt: skip
        out.append(
            RankSummary(
                rank=t.rank,
                device=t.meta.device_name,
                steps=steps,
                mean_step_us=round(statistics.fmean([s.duration_us for s in steps]), 3) if steps else None,
                breakdown_us=breakdown,
            )
        )
    return out


def advise_bundle(
    bundle: TraceBundle,
    *,
    config: str | os.PathLike | None = None,
    engine: EngineName = "auto",
    top: int | None = None,
    rank: int | None = None,
    facts: list[Fact] | None = None,
) -> Report:
    kb = knowledge_base(config)
    facts = facts if facts is not None else analyze_bundle(bundle)
    inf = infer(kb, facts, engine)
    findings = findings_from(inf, kb, _platform(bundle))
    if rank is not None:
        findings = [f for f in findings if not f.ranks or rank in f.ranks]
    if top is not None:
        findings = findings[:top]
    warnings = [f"skipped {p.message}" for p in bundle.problems] + list(bundle.warnings)
    warnings += [f"analyzer {f.analyzer} failed on rank {f.rank}: {f.message}" for f in facts if f.kind == "analyzer_error"]
    summary = _summary(bundle, facts)
    if rank is not None:
        summary = [s for s in summary if s.rank == rank]
    return Report(
        hermes_version=__version__,
        inputs=Inputs(sources=bundle.sources, ranks=bundle.rank_ids, skipped=[p.path for p in bundle.problems]),
        summary=summary,
        findings=findings,
        kb=KbInfo(rules=len(kb.active_rules()), cases=len(kb.active_cases()), engine=inf.engine),
        warnings=warnings,
    )


def advise(
    path_or_bundle: TraceBundle | str | os.PathLike | Sequence,
    *,
    config: str | os.PathLike | None = None,
    engine: EngineName = "auto",
    top: int | None = None,
    rank: int | None = None,
) -> Report:
    """Diagnose a trace, or a monitor RUN_DIR (its rank<R>.jsonl logs and captured traces):
    findings ranked by expected gain. Safe to call repeatedly and from
    several threads (the KB is loaded once; the rules engine is used behind a lock)."""
    if not isinstance(path_or_bundle, TraceBundle):
        from .run_advice import advise_run_dir, as_run_dir

        if (run_dir := as_run_dir(path_or_bundle)) is not None:  # a monitor RUN_DIR (rank<R>.jsonl)
            return advise_run_dir(run_dir, config=config, engine=engine, top=top, rank=rank)
    bundle = path_or_bundle if isinstance(path_or_bundle, TraceBundle) else load(path_or_bundle)
    return advise_bundle(bundle, config=config, engine=engine, top=top, rank=rank)


__all__ = ["SEVERITY_ORDER", "advise", "advise_bundle", "findings_from", "knowledge_base", "severity_of"]
