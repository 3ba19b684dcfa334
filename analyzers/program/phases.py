"""Program phases: each step of the training thread split into what the program was doing
(docs/analysis/program.md).

The component breakdown (timeline/breakdown.py) says which part of the machine holds the step;
this says which part of the user's program does. On the training thread, per step window:

* data: DataLoader ``__next__`` annotations and, with Python stacks, the DataLoader's own
  ``__iter__`` / ``__next__`` frames (a new epoch's iterator starts its workers there);
* optimizer: ``Optimizer.step#`` / ``Optimizer.zero_grad#`` annotations;
* backward: ``torch/_tensor.py: backward`` frames (Python stacks), the autograd engine's
  ``evaluate_function`` operators on this thread, and, where the engine runs on its own threads
  (CUDA), the span of its work in the step while this thread waits in ``backward``;
* communication: collectives the training thread itself issues (``c10d::`` operators,
  ``record_param_comms``), e.g. a metric all-reduce in the user's step, and on gloo the time the
  thread waits for those it issued (their spans on gloo's threads while it runs no operator);
* forward: ``nn.Module`` calls (``module.py: _call_impl`` frames with stacks, ``nn.Module:``
  annotations), else the top-level operators autograd records (a sequence number);
* user_code: the rest covered by the user's own Python frames (with stacks) or by top-level
  operators (without);
* other: what nothing traced covers.

Each instant of the window goes to the first phase in that order that covers it, so the
phases are exclusive and add up to the window. The user's functions outside the phases are
measured in functions.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.program import PHASES, ProgramPhases
from hermes_kb.trace.bundle import RankTrace

from .. import intervals as iv
from ..context import RankContext
from ..comm.collectives import host_collective_spans
from ..selection import COLLECTIVE_OP, main_tid, name_mask, union_of

BACKWARD_FRAME = re.compile(r"^torch/(?:_tensor\.py|autograd/__init__\.py)\(\d+\): backward$")
MODULE_FRAME = re.compile(r"^torch/nn/modules/module\.py\(\d+\): _(?:wrapped_)?call_impl$")
MODULE_ANNOTATION = re.compile(r"^nn\.Module: ")
DATALOADER_FRAME = re.compile(r"^torch/utils/data/dataloader\.py\(\d+\): (?:__iter__|__next__)$")
# the autograd engine's work: evaluate_function wrappers (PyTorch 1.10+), or before them the
# backward functions and AccumulateGrad themselves at top level
BACKWARD_OP = re.compile(r"^autograd::engine::evaluate_function: |Backward\d*$|^torch::autograd::AccumulateGrad$")
# the order in which a phase claims an instant that several cover
ORDER = ("data", "optimizer", "backward", "communication", "forward", "user_code")


@dataclass
class ThreadView:
    """The training thread's evidence, as interval sets over the whole trace."""

    tid: int
    spans: dict[str, iv.Intervals]  # phase -> intervals (not yet exclusive)
    sources: list[str]
    has_stacks: bool


def _on(df: pd.DataFrame, tid: int) -> np.ndarray:
    return df["tid"].to_numpy() == tid if len(df) else np.zeros(0, dtype=bool)


def _backward_elsewhere(ops: pd.DataFrame, tid: int, windows) -> iv.Intervals:
    """Per step, the span of the autograd engine's work on other threads (the training thread
    waits for it in backward on CUDA, where the engine has a thread per device)."""
    m = (ops["depth"].to_numpy() == 0) & ~_on(ops, tid) & name_mask(ops["name"], BACKWARD_OP)
    if not m.any():
        return iv.EMPTY
    ts, end = ops["ts"].to_numpy()[m], ops["end"].to_numpy()[m]
    starts, ends = [], []
    for w in windows:
        inw = (ts >= w.start_us) & (ts < w.end_us)
        if inw.any():
            starts.append(float(ts[inw].min()))
            ends.append(float(min(end[inw].max(), w.end_us)))
    return iv.union(starts, ends)


def thread_view(trace: RankTrace, windows) -> ThreadView | None:
    tid = main_tid(trace)
    if tid is None:
        return None
    ann, ops, py = trace.annotations, trace.cpu_ops, trace.python
    sources: list[str] = []
    spans: dict[str, iv.Intervals] = {}
    a_on = _on(ann, tid)
    kind = ann["kind"].to_numpy() if len(ann) else np.zeros(0, dtype=object)
    spans["data"] = union_of(ann, a_on & (kind == "dataloader"))
    spans["optimizer"] = union_of(ann, a_on & (kind == "optimizer"))
    for name, key in (("dataloader_annotations", "data"), ("optimizer_annotations", "optimizer")):
        if len(spans[key][0]):
            sources.append(name)
    p_on = _on(py, tid)
    has_stacks = bool(p_on.any())
    if has_stacks:
        frames = union_of(py, p_on & name_mask(py["name"], DATALOADER_FRAME))
        if len(frames[0]):
            spans["data"] = iv.union(np.concatenate([spans["data"][0], frames[0]]),
                                     np.concatenate([spans["data"][1], frames[1]]))
            sources.append("dataloader_frames")
    top = (ops["depth"].to_numpy() == 0) & _on(ops, tid) if len(ops) else np.zeros(0, dtype=bool)
    names = ops["name"] if len(ops) else pd.Series([], dtype=object)
    bwd_op = name_mask(names, BACKWARD_OP) if len(ops) else np.zeros(0, dtype=bool)
    back = [union_of(ops, top & bwd_op)]
    if has_stacks:
        back.append(union_of(py, p_on & name_mask(py["name"], BACKWARD_FRAME)))
    if len(ops):
        back.append(_backward_elsewhere(ops, tid, windows))
    spans["backward"] = iv.union(np.concatenate([b[0] for b in back]), np.concatenate([b[1] for b in back]))
    comm_op = name_mask(names, COLLECTIVE_OP) if len(ops) else np.zeros(0, dtype=bool)
    spans["communication"] = union_of(ops, top & comm_op) if len(ops) else iv.EMPTY
    waits = _host_collective_waits(trace, tid, union_of(ops, top & ~comm_op) if len(ops) else iv.EMPTY)
    if len(waits[0]):
        spans["communication"] = iv.union(np.concatenate([spans["communication"][0], waits[0]]),
                                          np.concatenate([spans["communication"][1], waits[1]]))
        sources.append("gloo_spans")
    forward = [union_of(ann, a_on & name_mask(ann["name"], MODULE_ANNOTATION)) if len(ann) else iv.EMPTY]
    if len(forward[0][0]):
        sources.append("module_annotations")
    if has_stacks:
        forward.append(union_of(py, p_on & name_mask(py["name"], MODULE_FRAME)))
        sources.append("python_stacks")
    else:
        seq = ops["seq"].to_numpy() if len(ops) else np.zeros(0)
        forward.append(union_of(ops, top & (seq >= 0) & ~bwd_op))
        if len(forward[-1][0]):
            sources.append("sequence_numbers")
    spans["forward"] = iv.union(np.concatenate([f[0] for f in forward]), np.concatenate([f[1] for f in forward]))
    spans["user_code"] = user_cover(trace, tid, top, has_stacks)
    if len(trace.steps):
        sources.append("step_annotations")
    return ThreadView(tid=tid, spans=spans, sources=sources, has_stacks=has_stacks)


def _host_collective_waits(trace: RankTrace, tid: int, busy: iv.Intervals) -> iv.Intervals:
    """The time this thread waits for the gloo collectives it issued (``dist.all_reduce`` blocks
    until gloo's thread is done, with no operator recorded meanwhile): their spans on gloo's
    threads less this thread's other top-level operators."""
    return iv.subtract(host_collective_spans(trace, tid), busy)


def user_cover(trace: RankTrace, tid: int, top: np.ndarray, has_stacks: bool) -> iv.Intervals:
    """What the user's own code covers on the thread: its Python frames (with stacks; the
    frames of torch, the standard library and installed packages are not the user's), else the
    top-level operators."""
    if has_stacks:
        from .functions import user_frame_mask

        py = trace.python
        return union_of(py, _on(py, tid) & user_frame_mask(py["name"]))
    return union_of(trace.cpu_ops, top)


def exclusive(spans: dict[str, iv.Intervals], lo: float, hi: float) -> dict[str, iv.Intervals]:
    """Each phase's intervals inside [lo, hi), an instant going to the first phase of ORDER that
    covers it; ``other`` is what none covers."""
    taken = iv.EMPTY
    out: dict[str, iv.Intervals] = {}
    for phase in ORDER:
        mine = iv.subtract(iv.clip(spans.get(phase, iv.EMPTY), lo, hi), taken)
        out[phase] = mine
        taken = iv.union(np.concatenate([taken[0], mine[0]]), np.concatenate([taken[1], mine[1]]))
    out["other"] = iv.subtract((np.array([lo]), np.array([hi])), taken) if hi > lo else iv.EMPTY
    return out


def phases_fact(rank: int, step: int | None, lengths: dict[str, float], window: float, view: ThreadView,
                top: tuple[str, float] | None, ranges: list[tuple[float, float]]) -> ProgramPhases:  # fmt: skip
    def r(x: float) -> float:
        return float(min(max(x / window, 0.0), 1.0)) if window > 0 else 0.0

    largest = max(PHASES, key=lambda p: lengths[p])
    return ProgramPhases(
        rank=rank, step=step, window_us=window, steps_count=len(ranges),
        **{f"{p}_us": lengths[p] for p in PHASES}, **{f"{p}_ratio": r(lengths[p]) for p in PHASES},
        largest_phase=largest, largest_phase_ratio=r(lengths[largest]), sources=list(view.sources),
        has_stacks=view.has_stacks, top_function=top[0] if top else None, top_function_ratio=r(top[1]) if top else 0.0,
        evidence=Evidence(time_ranges_us=ranges[:5], counts={"steps": len(ranges)},
                          note=f"training thread {view.tid}; phases claim an instant in the order "
                               + ", ".join(ORDER) + "; other: nothing traced"),
    )  # fmt: skip


def per_rank(ctx: RankContext) -> list[Fact]:
    """One program_phases fact per analysed step and one over them; user_function facts and the
    user_function / user_loop what-if sets (functions.py)."""
    from .functions import user_functions

    view = thread_view(ctx.trace, ctx.windows)
    if view is None or not ctx.windows:
        return []
    per_step: list[tuple[int, dict[str, iv.Intervals], float]] = []
    for w in ctx.windows:
        if w.end_us > w.start_us:
            per_step.append((w.step, exclusive(view.spans, w.start_us, w.end_us), w.end_us - w.start_us))
    if not per_step:
        return []
    funcs, fn_facts = user_functions(ctx, view, per_step)
    facts: list[Fact] = []
    total = {p: 0.0 for p in PHASES}
    window = 0.0
    for step, parts, dur in per_step:
        lengths = {p: iv.length(parts[p]) for p in PHASES}
        for p in PHASES:
            total[p] += lengths[p]
        window += dur
        w = next(x for x in ctx.windows if x.step == step)
        facts.append(phases_fact(ctx.rank, step, lengths, dur, view, funcs.get(step), [(w.start_us, w.end_us)]))
    ranges = [(w.start_us, w.end_us) for w in ctx.windows]
    facts.append(phases_fact(ctx.rank, None, total, window, view, funcs.get(None), ranges))
    return facts + fn_facts


__all__ = ["ORDER", "ThreadView", "exclusive", "per_rank", "phases_fact", "thread_view", "user_cover"]
