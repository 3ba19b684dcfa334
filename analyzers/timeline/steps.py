"""Steps: ProfilerStep windows, or steps inferred from repeating annotations, and step times.

Window of step i: from its ProfilerStep start to the next step's start; the last step ends
at the end of the last device activity launched inside it (or its own end on CPU-only traces).
A last step much shorter than the others (< 60% of their median) is a partial capture: it is
excluded and reported; so is the first window of steps inferred from optimizer steps when it is
over 1.5x their median (it runs from the trace's first event: set-up, not a step). Without ProfilerStep annotations, steps are inferred from optimizer
steps (Optimizer.step#...), else from a top-level annotation that repeats at least 3 times;
failing both, the whole trace is one window, and the StepStructure fact says so.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence
from hermes_kb.facts.steps import StepStructure, StepTime
from hermes_kb.trace.bundle import RankTrace

from .. import intervals as iv
from ..context import RankContext, StepWindow

PARTIAL_RATIO = 0.6
FIRST_RATIO = 1.5
# a step over STRETCH_RATIO x the median of the others in which the rank traced less than
# EMPTY_RATIO x that median of work is an empty stretch (a moved annotation, a clock jump, a
# suspended process): left out, it would make the mean meaningless. A long step that is busy
# (compilation, a checkpoint) is kept: it is part of what the step costs.
STRETCH_RATIO = 20.0
EMPTY_RATIO = 2.0


def _device_end_of_launches(trace: RankTrace, start: float, end: float) -> float:
    """End of the last device activity whose launch happened in [start, end)."""
    links = trace.links
    if not len(links):
        return end
    m = (links["launch_ts"] >= start) & (links["launch_ts"] < end)
    if not m.any():
        return end
    sel = links[m]
    out = end
    for kind, frame in (("kernel", trace.kernels), ("memcpy", trace.memcpy), ("sync", trace.syncs)):
        idx = sel.loc[sel["gpu_kind"] == kind, "gpu_idx"].to_numpy()
        if len(idx):
            out = max(out, float(frame["end"].to_numpy()[idx].max()))
    return out


def _windows_from_marks(trace: RankTrace, marks: pd.DataFrame) -> list[StepWindow]:
    marks = marks.sort_values("ts").reset_index(drop=True)
    out = []
    for i, row in marks.iterrows():
        start = float(row["ts"])
        cpu_end = float(row["end"])
        if i + 1 < len(marks):
            end = float(marks["ts"].iat[i + 1])
        else:
            end = _device_end_of_launches(trace, start, cpu_end)
        out.append(StepWindow(step=int(row["step"]), start_us=start, end_us=max(end, cpu_end), cpu_end_us=cpu_end))
    return out


def _infer_marks(trace: RankTrace) -> tuple[pd.DataFrame | None, str, str | None]:
    ann = trace.annotations
    opt = ann[ann["name"].astype(str).str.startswith("Optimizer.step#")]
    if len(opt) >= 2:
        # a step ends where its optimizer step ends; the first starts at the first event
        ends = np.sort(opt["end"].to_numpy())
        lo = trace.time_span()[0]
        starts = np.concatenate([[lo], ends[:-1]])
        return pd.DataFrame({"step": np.arange(len(ends)), "ts": starts, "end": ends}), "optimizer_step", str(
            opt["name"].iat[0]
        )
    if len(ann):
        top = ann.copy()
        counts = top["name"].value_counts()
        counts = counts[counts >= 3]
        if len(counts):
            name = str(counts.index[0])
            reps = top[top["name"] == name].sort_values("ts")
            return (
                pd.DataFrame({"step": np.arange(len(reps)), "ts": reps["ts"].to_numpy(), "end": reps["end"].to_numpy()}),
                "repeating_annotation",
                name,
            )
    return None, "whole_trace", None


def _busy_us(trace: RankTrace, lo: float, hi: float) -> float:
    """µs of [lo, hi) covered by the rank's traced work: top-level CPU ops, runtime calls, kernels
    and copies."""
    starts, ends = [], []
    for df, top in ((trace.cpu_ops, True), (trace.runtime, False), (trace.kernels, False), (trace.memcpy, False)):
        if not len(df):
            continue
        m = (df["end"].to_numpy() > lo) & (df["ts"].to_numpy() < hi)
        if top:
            m &= df["depth"].to_numpy() == 0
        starts.append(np.clip(df["ts"].to_numpy(np.float64)[m], lo, hi))
        ends.append(np.clip(df["end"].to_numpy(np.float64)[m], lo, hi))
    return iv.length(iv.union(np.concatenate(starts), np.concatenate(ends))) if starts else 0.0


def _empty_stretches(trace: RankTrace, windows: list) -> tuple[list, list[int], str]:
    durs = np.array([w.duration_us for w in windows])
    out, why = [], []
    for i, w in enumerate(windows):
        med = float(np.median(np.delete(durs, i)))
        if med > 0 and w.duration_us > STRETCH_RATIO * med and _busy_us(trace, w.start_us, w.end_us) < EMPTY_RATIO * med:
            out.append(w.step)
            why.append(f"step {w.step} lasted {w.duration_us / 1e3:,.1f} ms, over {STRETCH_RATIO:.0f}x the median of the "
                       f"others ({med / 1e3:,.1f} ms), with little traced work in it: an empty stretch")  # fmt: skip
    return [w for w in windows if w.step not in out], out, "; ".join(why)


def step_context(trace: RankTrace) -> tuple[RankContext, list]:
    """The rank's analysis windows and the step facts."""
    marks = trace.steps
    source, marker = "profiler_step", None
    if not len(marks):
        marks, source, marker = _infer_marks(trace)
    excluded: list[int] = []
    reason = None
    if marks is None:
        lo, hi = trace.time_span()
        windows = [StepWindow(step=0, start_us=lo, end_us=hi, cpu_end_us=hi)]
    else:
        windows = _windows_from_marks(trace, marks)
        if source == "optimizer_step" and len(windows) >= 3:
            # the first window runs from the trace's first event, not from a step boundary
            med = float(np.median([w.duration_us for w in windows[1:]]))
            first = windows[0]
            if first.duration_us > FIRST_RATIO * med:
                excluded.append(first.step)
                reason = (f"the first window runs from the trace's first event and lasted {first.duration_us / 1e3:.1f} ms, "
                          f"over {FIRST_RATIO:.1f}x the median of the others ({med / 1e3:.1f} ms): set-up, not a step")  # fmt: skip
                windows = windows[1:]
        if len(windows) >= 3:
            med = float(np.median([w.duration_us for w in windows[:-1]]))
            last = windows[-1]
            if last.cpu_end_us - last.start_us < PARTIAL_RATIO * med:
                excluded.append(last.step)
                reason = ((reason + "; ") if reason else "") + (f"last step lasted {(last.cpu_end_us - last.start_us) / 1e3:.1f} ms, under "
                          f"{PARTIAL_RATIO:.0%} of the median of the others ({med / 1e3:.1f} ms): a partial capture")  # fmt: skip
                windows = windows[:-1]
        if len(windows) >= 3:
            windows, empty, why = _empty_stretches(trace, windows)
            if empty:
                excluded += empty
                reason = ((reason + "; ") if reason else "") + why
    ctx = RankContext(trace=trace, windows=windows, excluded_steps=excluded, step_source=source)
    facts = [
        StepStructure(
            rank=trace.rank,
            source=source,
            inferred=source != "profiler_step",
            marker=marker,
            steps_count=len(windows),
            excluded_steps=excluded,
            excluded_reason=reason,
            evidence=Evidence(
                time_ranges_us=[(windows[0].start_us, windows[-1].end_us)] if windows else [],
                events=[marker] if marker else (["ProfilerStep#N"] if source == "profiler_step" else []),
            ),
        )
    ]
    for w in windows:
        facts.append(
            StepTime(
                rank=trace.rank,
                step=w.step,
                start_us=w.start_us,
                end_us=w.end_us,
                duration_us=w.duration_us,
                cpu_duration_us=w.cpu_end_us - w.start_us,
                evidence=Evidence(time_ranges_us=[(w.start_us, w.end_us)],
                                  events=[f"ProfilerStep#{w.step}"] if source == "profiler_step" else []),  # fmt: skip
            )
        )
    return ctx, facts
