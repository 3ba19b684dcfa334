"""``hermes diff BEFORE AFTER``: what changed between two runs, and whether the advice was right.

Per rank, the mean step before and after, and its change split by the components of the step
breakdown (compute, exposed communication, host (launch, dispatch, Python), data wait, idle:
each side's ``summary[].breakdown_us``, which add up to the mean step, so the parts add up to the
change). The operators (matched by name and input shapes) and kernels (by name) whose time per
step changed most. The findings before and after matched by case id: resolved, new, unchanged;
for each resolved finding, the step-time speedup measured on its ranks against the range it
predicted. The result is a pydantic model (``DiffResult``, stable JSON: ``hermes schema diff``).
"""

from __future__ import annotations

import statistics
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from ..advisor.report import Finding, Removable, Report, Speedup
from ..facts.breakdown import HOST_PARTS

DIFF_SCHEMA_VERSION = "1"
COMPONENTS = ("compute", "communication", "host", "data", "idle")


class DiffSide(BaseModel):
    sources: list[str]
    ranks: list[int]
    steps: int = Field(description="profiled (or monitored) steps per rank, largest over the ranks")


class ComponentDelta(BaseModel):
    component: str = Field(description="compute, communication, host, data, idle, or a host part "
                           "(host_launch, host_dispatch, host_python)")  # fmt: skip
    before_us: float = Field(description="mean per step before")
    after_us: float = Field(description="mean per step after")
    delta_us: float = Field(description="after - before (negative: time saved)")


class RankDiff(BaseModel):
    rank: int = Field(description="rank (after's numbering when the two sides' single ranks differ)")
    before_rank: int
    before_step_us: float | None = Field(description="mean step before")
    after_step_us: float | None = Field(description="mean step after")
    delta_us: float | None = Field(description="after - before")
    speedup: float | None = Field(description="before / after (above 1: faster)")
    critical_before: str | None = None
    critical_after: str | None = None
    components: list[ComponentDelta] = Field(default_factory=list, description="the five components, then the host's parts")


class OpDelta(BaseModel):
    kind: Literal["cpu_op", "kernel"]
    name: str
    input_dims: str | None = Field(default=None, description="the operator's recorded input shapes (cpu ops)")
    before_us: float = Field(description="time per step before: self time for cpu ops, duration for kernels")
    after_us: float
    delta_us: float
    before_count: float = Field(description="calls per step before")
    after_count: float


class FindingChange(BaseModel):
    case_id: str
    title: str
    status: Literal["resolved", "new", "unchanged"]
    category: str
    ranks: list[int] = Field(default_factory=list)
    severity_before: str | None = None
    severity_after: str | None = None
    predicted_speedup: Speedup | None = Field(default=None, description="the range the finding predicted before")
    predicted_removable_us: Removable | None = Field(default=None, description="per step: removable before, over "
                                                     "the analysed steps / their count")  # fmt: skip
    after_speedup: Speedup | None = Field(default=None, description="what the finding still predicts after")
    measured_speedup: float | None = Field(default=None, description="median over the finding's ranks of the mean step "
                                           "before / after")  # fmt: skip
    measured_removed_us: float | None = Field(default=None, description="per step: mean step before - after, median "
                                              "over the finding's ranks")  # fmt: skip
    component: str | None = Field(default=None, description="the step-breakdown component the finding sits in")
    component_delta_us: float | None = Field(default=None, description="per step: that component after - before, "
                                             "median over the finding's ranks")  # fmt: skip
    within_range: bool | None = Field(default=None, description="resolved findings: the measured speedup lies in the "
                                      "predicted range")  # fmt: skip
    verdict: str = ""


class DiffResult(BaseModel):
    schema_version: str = DIFF_SCHEMA_VERSION
    hermes_version: str
    before: DiffSide
    after: DiffSide
    ranks: list[RankDiff]
    step_before_us: float | None = Field(description="the job's step before: the slowest matched rank's mean step")
    step_after_us: float | None
    speedup: float | None = Field(description="step_before_us / step_after_us")
    components: list[ComponentDelta] = Field(default_factory=list, description="mean over matched ranks")
    ops: list[OpDelta] = Field(default_factory=list, description="cpu ops whose self time per step changed most, "
                               "both directions, over matched ranks")  # fmt: skip
    kernels: list[OpDelta] = Field(default_factory=list)
    findings: list[FindingChange] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)


def _parts(bd: dict[str, float]) -> dict[str, float]:
    p = {k: float(bd.get(f"{k}_us", 0.0)) for k in ("compute", "communication", "data", "idle", *HOST_PARTS)}
    p["host"] = sum(p[k] for k in HOST_PARTS)
    return p


def _steps(s) -> int:
    return s.steps_count if s.steps_count is not None else len(s.steps)


def match_ranks(a: Report, b: Report) -> tuple[list[tuple[int, int]], list[str]]:
    """(before rank, after rank) pairs: the same rank numbers; two single-rank inputs are paired
    whatever their numbers."""
    ra = [s.rank for s in a.summary]
    rb = [s.rank for s in b.summary]
    notes = []
    if len(ra) == 1 and len(rb) == 1:
        if ra != rb:
            notes.append(f"one rank on each side, compared with each other (rank {ra[0]} before, rank {rb[0]} after)")
        return [(ra[0], rb[0])], notes
    common = sorted(set(ra) & set(rb))
    if set(ra) - set(rb):
        notes.append(f"rank(s) {sorted(set(ra) - set(rb))} only before: left out")
    if set(rb) - set(ra):
        notes.append(f"rank(s) {sorted(set(rb) - set(ra))} only after: left out")
    return [(r, r) for r in common], notes


def rank_diffs(a: Report, b: Report, pairs: list[tuple[int, int]]) -> list[RankDiff]:
    sa = {s.rank: s for s in a.summary}
    sb = {s.rank: s for s in b.summary}
    out = []
    for ra, rb in pairs:
        x, y = sa[ra], sb[rb]
        before, after = x.mean_step_us, y.mean_step_us
        comps = []
        if x.breakdown_us and y.breakdown_us:
            pa, pb = _parts(x.breakdown_us), _parts(y.breakdown_us)
            comps = [ComponentDelta(component=k, before_us=round(pa[k], 3), after_us=round(pb[k], 3),
                                    delta_us=round(pb[k] - pa[k], 3)) for k in (*COMPONENTS, *HOST_PARTS)]  # fmt: skip
        out.append(RankDiff(
            rank=rb, before_rank=ra, before_step_us=before, after_step_us=after,
            delta_us=round(after - before, 3) if before is not None and after is not None else None,
            speedup=round(before / after, 4) if before and after else None,
            critical_before=x.critical_component, critical_after=y.critical_component, components=comps,
        ))  # fmt: skip
    return out


# -- operators and kernels -----------------------------------------------------------------------


def _window(trace) -> tuple[float, float, int]:
    """The analysed span of a rank (its ProfilerSteps) and the number of steps in it."""
    st = trace.steps
    if len(st):
        return float(st["ts"].min()), float(st["end"].max()), len(st)
    lo, hi = trace.time_span()
    return lo, hi, 1


def op_table(trace) -> pd.DataFrame:
    """Per (name, input_dims): self time and calls per step of the cpu ops inside the steps."""
    ops = trace.cpu_ops
    if not len(ops):
        return pd.DataFrame(columns=["name", "input_dims", "us", "count"])
    lo, hi, n = _window(trace)
    dur = ops["dur"].to_numpy(dtype=np.float64)
    child = np.zeros(len(ops))
    par = ops["parent"].to_numpy()
    has = par >= 0
    np.add.at(child, par[has], dur[has])
    self_us = np.maximum(dur - child, 0.0)
    ts = ops["ts"].to_numpy(dtype=np.float64)
    inside = (ts >= lo) & (ts < hi)
    df = pd.DataFrame({"name": ops["name"].astype(str).to_numpy()[inside],
                       "input_dims": ops["input_dims"].astype(str).to_numpy()[inside] if "input_dims" in ops else "",
                       "us": self_us[inside]})  # fmt: skip
    g = df.groupby(["name", "input_dims"], sort=False)["us"].agg(["sum", "count"]).reset_index()
    return pd.DataFrame({"name": g["name"], "input_dims": g["input_dims"], "us": g["sum"] / n, "count": g["count"] / n})


def kernel_table(trace) -> pd.DataFrame:
    k = trace.kernels
    if not len(k):
        return pd.DataFrame(columns=["name", "us", "count"])
    lo, hi, n = _window(trace)
    ts = k["ts"].to_numpy(dtype=np.float64)
    inside = (ts >= lo) & (ts < hi)
    df = pd.DataFrame({"name": k["name"].astype(str).to_numpy()[inside], "us": k["dur"].to_numpy(dtype=np.float64)[inside]})
    g = df.groupby("name", sort=False)["us"].agg(["sum", "count"]).reset_index()
    return pd.DataFrame({"name": g["name"], "us": g["sum"] / n, "count": g["count"] / n})


def _mean_tables(bundle, ranks: list[int], fn, keys: list[str]) -> pd.DataFrame:
    tables = [fn(bundle[r]) for r in ranks if r in bundle.ranks]
    if not tables:
        return pd.DataFrame(columns=[*keys, "us", "count"])
    cat = pd.concat(tables, ignore_index=True)
    g = cat.groupby(keys, sort=False)[["us", "count"]].sum().reset_index()
    g[["us", "count"]] = g[["us", "count"]] / len(tables)
    return g


def changed(before: pd.DataFrame, after: pd.DataFrame, keys: list[str], kind: str, top: int) -> list[OpDelta]:
    """The ``top`` largest increases and the ``top`` largest decreases of time per step."""
    m = before.merge(after, on=keys, how="outer", suffixes=("_a", "_b")).fillna({"us_a": 0.0, "us_b": 0.0,
                                                                                "count_a": 0.0, "count_b": 0.0})  # fmt: skip
    if not len(m):
        return []
    m["delta"] = m["us_b"] - m["us_a"]
    m = m[m["delta"].abs() > 0]
    picked = pd.concat([m.nsmallest(top, "delta"), m.nlargest(top, "delta")]).drop_duplicates(subset=keys)
    picked = picked.reindex(picked["delta"].abs().sort_values(ascending=False).index)
    return [OpDelta(kind=kind, name=str(r["name"]), input_dims=(str(r["input_dims"]) or None) if "input_dims" in keys else None,
                    before_us=round(float(r["us_a"]), 3), after_us=round(float(r["us_b"]), 3),
                    delta_us=round(float(r["delta"]), 3), before_count=round(float(r["count_a"]), 3),
                    after_count=round(float(r["count_b"]), 3)) for _, r in picked.iterrows()]  # fmt: skip


# -- findings ------------------------------------------------------------------------------------


def _flat(findings: list[Finding]) -> dict[str, Finding]:
    out: dict[str, Finding] = {}
    for f in findings:
        out.setdefault(f.case_id, f)
        for alt in f.alternatives:
            out.setdefault(alt.case_id, alt)
    return out


def finding_changes(a: Report, b: Report, ranks: list[RankDiff], min_speedup: float) -> list[FindingChange]:
    """Findings before and after by case id (alternatives included). A finding counts when its
    best case reaches ``min_speedup`` (the text reports' threshold); one that falls under it
    after is resolved."""
    fa = {k: f for k, f in _flat(a.findings).items() if f.expected_speedup.high >= min_speedup}
    fb_all = _flat(b.findings)
    fb = {k: f for k, f in fb_all.items() if f.expected_speedup.high >= min_speedup}
    by_before = {r.before_rank: r for r in ranks}
    out = []
    for cid, f in fa.items():
        status = "unchanged" if cid in fb else "resolved"
        rs = [by_before[r] for r in (f.ranks or list(by_before)) if r in by_before]
        rs = [r for r in rs if r.speedup is not None] or [r for r in ranks if r.speedup is not None]
        measured = statistics.median([r.speedup for r in rs]) if rs else None
        removed = statistics.median([-r.delta_us for r in rs]) if rs else None
        steps = max((len(s.steps) for s in a.summary if s.rank in (f.ranks or [s.rank])), default=0) or 1
        per_step = (f.removable_us.low / steps, f.removable_us.high / steps) if f.removable_us else None
        if a.summary and a.summary[0].steps_count is not None and f.removable_us:
            per_step = None  # a monitor run's finding is per analysed step window, not per logged step
        after = fb_all.get(cid)
        comp = None
        if f.component:
            vals = [c.delta_us for r in rs for c in r.components if c.component == f.component]
            comp = round(statistics.median(vals), 3) if vals else None
        change = FindingChange(
            case_id=cid, title=f.title, status=status, category=f.category, ranks=f.ranks,
            severity_before=f.severity, severity_after=after.severity if after else None,
            predicted_speedup=f.expected_speedup,
            predicted_removable_us=Removable(low=round(per_step[0], 3), high=round(per_step[1], 3)) if per_step else None,
            after_speedup=after.expected_speedup if after else None,
            measured_speedup=round(measured, 4) if measured is not None else None,
            measured_removed_us=round(removed, 3) if removed is not None else None,
            component=f.component, component_delta_us=comp,
        )  # fmt: skip
        if status == "resolved" and measured is not None:
            lo, hi = f.expected_speedup.low, f.expected_speedup.high
            change.within_range = bool(lo <= measured <= hi)
            where = "inside" if change.within_range else ("below" if measured < lo else "above")
            change.verdict = (f"measured {measured:.2f}x, {where} the predicted {lo:.2f}x-{hi:.2f}x"
                              + ("" if measured >= 1.0 else "; the step got slower: the change did more than this fix"))  # fmt: skip
        elif status == "resolved":
            change.verdict = "no step time on both sides to compare"
        else:
            change.verdict = (f"still predicted after: {after.expected_speedup.low:.2f}x-{after.expected_speedup.high:.2f}x "
                              f"(before {f.expected_speedup.low:.2f}x-{f.expected_speedup.high:.2f}x)")  # fmt: skip
        out.append(change)
    for cid, f in fb.items():
        if cid not in fa:
            out.append(FindingChange(case_id=cid, title=f.title, status="new", category=f.category, ranks=f.ranks,
                                     severity_after=f.severity, after_speedup=f.expected_speedup,
                                     verdict=f"appeared after the change: {f.expected_speedup.low:.2f}x-"
                                             f"{f.expected_speedup.high:.2f}x"))  # fmt: skip
    resolved = [c for c in out if c.status == "resolved" and c.measured_speedup is not None]
    if len(resolved) > 1:
        for c in resolved:
            c.verdict += (f" ({len(resolved)} findings resolved together: the measured change is their joint effect, "
                          f"and whatever else changed)")  # fmt: skip
    order = {"resolved": 0, "new": 1, "unchanged": 2}
    out.sort(key=lambda c: order[c.status])
    return out


def diff_reports(a: Report, b: Report, *, bundle_a=None, bundle_b=None, top: int = 10) -> DiffResult:
    from ..core.version import __version__
    from ..advisor.findings import MIN_REPORTED_SPEEDUP

    pairs, notes = match_ranks(a, b)
    ranks = rank_diffs(a, b, pairs)
    comparable = [r for r in ranks if r.before_step_us and r.after_step_us]
    step_a = max((r.before_step_us for r in comparable), default=None)
    step_b = max((r.after_step_us for r in comparable), default=None)
    comps: list[ComponentDelta] = []
    with_parts = [r for r in ranks if r.components]
    if with_parts:
        for i, c in enumerate(with_parts[0].components):
            ba = statistics.fmean(r.components[i].before_us for r in with_parts)
            bb = statistics.fmean(r.components[i].after_us for r in with_parts)
            comps.append(ComponentDelta(component=c.component, before_us=round(ba, 3), after_us=round(bb, 3),
                                        delta_us=round(bb - ba, 3)))  # fmt: skip
    ops: list[OpDelta] = []
    kernels: list[OpDelta] = []
    if bundle_a is not None and bundle_b is not None:
        ra = [p[0] for p in pairs if p[0] in bundle_a.ranks]
        rb = [p[1] for p in pairs if p[1] in bundle_b.ranks]
        if ra and rb:
            keys = ["name", "input_dims"]
            ops = changed(_mean_tables(bundle_a, ra, op_table, keys), _mean_tables(bundle_b, rb, op_table, keys),
                          keys, "cpu_op", top)  # fmt: skip
            kernels = changed(_mean_tables(bundle_a, ra, kernel_table, ["name"]),
                              _mean_tables(bundle_b, rb, kernel_table, ["name"]), ["name"], "kernel", top)  # fmt: skip
    else:
        notes.append("operators and kernels not compared: a side has no profiler trace (a monitor RUN_DIR without a capture)")
    devs_a = {s.device for s in a.summary if s.device}
    devs_b = {s.device for s in b.summary if s.device}
    if devs_a and devs_b and devs_a != devs_b:
        notes.append(f"different devices: {', '.join(sorted(devs_a))} before, {', '.join(sorted(devs_b))} after")
    return DiffResult(
        hermes_version=__version__,
        before=DiffSide(sources=a.inputs.sources, ranks=a.inputs.ranks, steps=max((_steps(s) for s in a.summary), default=0)),
        after=DiffSide(sources=b.inputs.sources, ranks=b.inputs.ranks, steps=max((_steps(s) for s in b.summary), default=0)),
        ranks=ranks,
        step_before_us=step_a,
        step_after_us=step_b,
        speedup=round(step_a / step_b, 4) if step_a and step_b else None,
        components=comps,
        ops=ops,
        kernels=kernels,
        findings=finding_changes(a, b, ranks, MIN_REPORTED_SPEEDUP),
        warnings=notes,
    )  # fmt: skip


def diff_advised(a, b, *, top: int = 10) -> DiffResult:
    """The diff of two ``advisor.run.Advised`` (the CLI's path: each side loaded and advised once)."""
    return diff_reports(a.report, b.report, bundle_a=a.bundle, bundle_b=b.bundle, top=top)


def diff(before, after, *, top: int = 10, config=None, engine: str = "auto") -> DiffResult:
    """``hermes diff`` from Python: paths (trace files, directories, RUN_DIRs) or TraceBundles."""
    from ..advisor.run import advise_bundle_full, advise_run_dir_full
    from ..analysis.run_dir import as_run_dir
    from ..trace import TraceBundle, load

    def side(x):
        if not isinstance(x, TraceBundle) and (rd := as_run_dir(x)) is not None:
            return advise_run_dir_full(rd, config=config, engine=engine)
        return advise_bundle_full(x if isinstance(x, TraceBundle) else load(x), config=config, engine=engine)

    return diff_advised(side(before), side(after), top=top)


__all__ = ["ComponentDelta", "DiffResult", "DiffSide", "FindingChange", "OpDelta", "RankDiff", "diff", "diff_advised",
           "diff_reports"]
