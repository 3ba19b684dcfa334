"""The user's functions on the training thread, and what each holds outside the program phases
(docs/analysis/program.md).

A frame is the user's when it is not torch's, the standard library's, an installed package's
(site-packages, or a known library by its top-level name) or hermes' own monitor. For each
user function, over the analysed steps: the time inside it, the part outside forward, backward,
the optimizer, data and collectives (``outside_us``), and what it runs there: top-level
operators, device synchronisations, file I/O, prints, and an operator called many times a step
on many shapes (a Python loop over tensors). A function that also runs training phases (the
loop, the step function) is a ``driver``: it holds the program, it is not a cause. The largest
function that is not a driver gets the what-if set ``user_function`` (its time outside the
phases and the device work launched there), so the replay prices removing or thinning it.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.program import UserFunction

from .. import intervals as iv
from ..context import RankContext
from ..selection import name_mask
from ..whatif.sets import WhatIfSet, register

FRAME_RE = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<func>.+)$")
LIBRARIES = frozenset({
    "torch", "torchvision", "torchaudio", "torchtext", "functorch", "triton", "torch_npu", "torch_xla", "numpy",
    "scipy", "pandas", "transformers", "accelerate", "datasets", "tokenizers", "huggingface_hub", "safetensors",
    "lightning", "pytorch_lightning", "lightning_fabric", "deepspeed", "apex", "megatron", "fairscale", "timm",
    "einops", "PIL", "cv2", "tqdm", "wandb", "tensorboard", "hermes_kb", "yaml", "jinja2", "packaging", "_pytest",
    "pytest", "IPython", "typing_extensions", "google", "sklearn", "matplotlib", "h5py", "pyarrow", "msgspec",
})  # fmt: skip
SYNC_OPS = re.compile(r"^aten::(?:item|_local_scalar_dense|cpu|numpy|tolist|nonzero)$")
IO_FRAMES = re.compile(r"^<built-in (?:function open|method (?:write|read|readline|readinto|flush|send|sendall|recv)\b)"
                       r"|^<method '(?:write|read|flush)' of")  # fmt: skip
PRINT_FRAMES = re.compile(r"^<built-in function print>$")
MAX_FACTS = 10
MIN_SHARE = 0.01  # functions holding less of the window are not reported
LOOP_CALLS = 16  # calls of one operator a step ...
LOOP_SHAPES = 4  # ... on this many shapes at least: a loop over tensors
DRIVER_SHARE = 0.05  # a function with this much of its time in backward, the optimizer or data runs the step
DRIVER_WORK = 0.5  # a driver is named for its extra time when operators and read-backs fill this much of it


def is_user_file(path: str) -> bool:
    if path.startswith("<") or "site-packages/" in path or "dist-packages/" in path or "/lib/python3" in path:
        return False
    parts = [p for p in path.split("/") if p and p != "."]
    if not parts:
        return False
    if "hermes_kb" in parts:  # hermes' own monitor, running inside the loop
        return False
    head = parts[0].removesuffix(".py")
    return not (head in LIBRARIES or head in sys.stdlib_module_names or head.startswith("_"))


def user_frame_mask(names: pd.Series) -> np.ndarray:
    """Rows of python frames that are the user's code (tested once per distinct name)."""
    if not len(names):
        return np.zeros(0, dtype=bool)
    cat = names.astype("category") if not isinstance(names.dtype, pd.CategoricalDtype) else names
    ok = np.array([bool((m := FRAME_RE.match(str(n)))) and is_user_file(m.group("file")) for n in cat.cat.categories],
                  dtype=bool)  # fmt: skip
    codes = cat.cat.codes.to_numpy()
    return np.where(codes >= 0, ok[np.clip(codes, 0, None)], False)


def _inside(ts: np.ndarray, a: iv.Intervals) -> np.ndarray:
    return iv.covered_by(ts, a) if len(ts) else np.zeros(0, dtype=bool)


def _loop(ops: pd.DataFrame, steps: int) -> tuple[str | None, float, int, float]:
    """Operators called at least LOOP_CALLS times a step on LOOP_SHAPES shapes or more (a loop
    over tensors): (the most-called, its calls a step, its shapes, the time of all of them)."""
    if not len(ops) or steps <= 0:
        return None, 0.0, 0, 0.0
    names = ops["name"].astype(str)
    dims = ops["input_dims"].astype(str) if "input_dims" in ops.columns else pd.Series("", index=ops.index)
    stats = pd.DataFrame({"name": names, "dims": dims, "dur": ops["dur"].to_numpy()}).groupby("name", sort=True)
    calls, shapes, dur = stats.size(), stats["dims"].nunique(), stats["dur"].sum()
    looped = calls.index[(calls / steps >= LOOP_CALLS) & (shapes >= LOOP_SHAPES)]
    if not len(looped):
        return None, 0.0, 0, 0.0
    top = max(looped, key=lambda n: (calls[n], n))
    return str(top), float(calls[top] / steps), int(shapes[top]), float(dur[looped].sum())


@dataclass
class _Group:
    name: str
    frames: pd.DataFrame
    spans: iv.Intervals  # the function's time inside the step windows
    outside: iv.Intervals  # of it, outside the phases (the user_code phase)
    training_us: float


def _group(name: str, frames: pd.DataFrame, windows: iv.Intervals, outside: iv.Intervals,
           training: iv.Intervals) -> _Group:  # fmt: skip
    spans = iv.intersect(iv.union(frames["ts"].to_numpy(dtype=np.float64), frames["end"].to_numpy(dtype=np.float64)), windows)
    return _Group(name, frames, spans, iv.intersect(spans, outside), iv.length(iv.intersect(spans, training)))


def _measure(ctx: RankContext, tid: int, g: _Group, window: float) -> UserFunction:
    trace = ctx.trace
    time_us, out_us = iv.length(g.spans), iv.length(g.outside)
    driver = bool(time_us > 0 and g.training_us >= DRIVER_SHARE * time_us)
    extra = g.outside if driver else g.spans
    extra_us = iv.length(extra)
    ops = trace.cpu_ops
    on = (ops["tid"].to_numpy() == tid) if len(ops) else np.zeros(0, dtype=bool)
    top = ops[on & (ops["depth"].to_numpy() == 0) & _inside(ops["ts"].to_numpy(), extra)] if len(ops) else ops
    every = ops[on & _inside(ops["ts"].to_numpy(), extra)] if len(ops) else ops
    sync_ops = every[name_mask(every["name"], SYNC_OPS)] if len(every) else every
    if len(sync_ops):  # the outermost of a chain (aten::item > aten::_local_scalar_dense) counts once
        parent = sync_ops["parent"].to_numpy()
        nested = np.isin(parent, sync_ops.index.to_numpy())
        sync_ops = sync_ops[~nested]
    syncs, syncs_us = len(sync_ops), iv.length(iv.union(sync_ops["ts"].to_numpy(np.float64), sync_ops["end"].to_numpy(np.float64))) if len(sync_ops) else 0.0
    rt = trace.runtime
    if len(rt):
        m = (rt["tid"].to_numpy() == tid) & (rt["kind"].to_numpy() == "sync") & _inside(rt["ts"].to_numpy(), extra)
        syncs += int(m.sum())
        if m.any():
            waits = iv.union(rt["ts"].to_numpy(np.float64)[m], rt["end"].to_numpy(np.float64)[m])
            syncs_us = iv.length(iv.union(np.concatenate([waits[0], sync_ops["ts"].to_numpy(np.float64)]),
                                          np.concatenate([waits[1], sync_ops["end"].to_numpy(np.float64)])))  # fmt: skip
    py = trace.python
    inner = py[(py["tid"].to_numpy() == tid) & _inside(py["ts"].to_numpy(), extra)] if len(py) else py
    work_us = _work(inner, top, extra)
    frames = g.frames
    steps = sorted({int(s) for s in ctx.step_of(frames["ts"].to_numpy()) if s >= 0})
    # a loop over tensors is the user's own: operators outside the model's forward and the phases
    loose = top[_inside(top["ts"].to_numpy(), g.outside)] if len(top) else top
    loop_op, loop_rate, loop_shapes, loop_us = _loop(loose, len(steps))
    by_time = top.groupby(top["name"].astype(str), observed=True)["dur"].sum().sort_values(ascending=False) if len(top) else pd.Series(dtype=float)
    m = FRAME_RE.match(g.name)
    longest = frames.sort_values("dur", ascending=False).head(3)
    return UserFunction(
        rank=ctx.rank, function=g.name, file=m.group("file") if m else g.name, line=int(m.group("line")) if m else 0,
        window_us=window, time_us=time_us, outside_us=out_us, training_us=g.training_us, driver=driver,
        extra_us=extra_us, share_ratio=float(min(extra_us / window, 1.0)) if window > 0 else 0.0,
        per_step_us=extra_us / max(1, len(ctx.windows)), work_us=work_us,
        calls_count=len(frames), steps_count=len(steps),
        steps_ratio=float(min(len(steps) / len(ctx.windows), 1.0)) if ctx.windows else 0.0,
        ops_count=len(top), ops_us=float(top["dur"].sum()) if len(top) else 0.0,
        top_ops=[str(n) for n in by_time.index[:5]], syncs_count=syncs, syncs_us=syncs_us,
        io_calls_count=int(name_mask(inner["name"], IO_FRAMES).sum()) if len(inner) else 0,
        prints_count=int(name_mask(inner["name"], PRINT_FRAMES).sum()) if len(inner) else 0,
        loop_op=loop_op, loop_calls_per_step=loop_rate, loop_shapes_count=loop_shapes, loop_us=loop_us,
        loop_share_ratio=float(min(loop_us / window, 1.0)) if window > 0 else 0.0,
        evidence=Evidence(time_ranges_us=[(float(a), float(b)) for a, b in zip(longest["ts"], longest["end"])],
                          events=[g.name, *[str(n) for n in by_time.index[:3]]],
                          counts={"calls": len(frames), "operators": len(top)},
                          note=("time outside forward, backward, the optimizer, data and collectives (the function "
                                "runs the training step)" if driver else "all of the function's time: it runs no "
                                "training step (no backward, optimizer or data inside it)")),
    )  # fmt: skip


def _work(inner: pd.DataFrame, top: pd.DataFrame, extra: iv.Intervals) -> float:
    """Time of ``extra`` inside what the function calls itself: library and built-in Python frames
    and top-level operators that start in it. Other user functions (the step function a loop
    calls) have their own facts; hermes' monitor and what it calls is not the user's work."""
    monitor = iv.EMPTY
    starts, ends = [top["ts"].to_numpy(np.float64)], [top["end"].to_numpy(np.float64)]
    if len(inner):
        names = inner["name"].astype(str)
        mon = names.str.contains("hermes_kb/", regex=False).to_numpy()
        monitor = iv.union(inner["ts"].to_numpy(np.float64)[mon], inner["end"].to_numpy(np.float64)[mon])
        keep = ~mon & ~user_frame_mask(inner["name"])
        starts.append(inner["ts"].to_numpy(np.float64)[keep])
        ends.append(inner["end"].to_numpy(np.float64)[keep])
    work = iv.intersect(iv.union(np.concatenate(starts), np.concatenate(ends)), extra)
    return iv.length(iv.subtract(work, monitor))


def _site(facts: list[UserFunction]) -> UserFunction | None:
    """The function the report names: the largest that runs no training, else the innermost
    driver (the step function rather than the loop) holding most of the drivers' extra time,
    when that time is mostly operators and read-backs."""
    free = [f for f in facts if not f.driver]
    if free:
        return max(free, key=lambda f: (f.extra_us, f.time_us, f.function))
    # a driver's time outside the phases is named only when it is mostly spent in what it calls
    # (operators, Python functions): the loop's own glue between the phases is not extra work
    drivers = [f for f in facts if f.driver and f.work_us >= DRIVER_WORK * f.extra_us]
    if not drivers:
        return None
    most = max(f.extra_us for f in drivers)
    return min((f for f in drivers if f.extra_us >= 0.5 * most), key=lambda f: (f.time_us, f.function))


def _register(ctx: RankContext, tid: int, f: UserFunction, g: _Group, target: str = "user_function") -> None:
    mine = g.outside if f.driver else g.spans
    kernels = np.zeros(0, dtype=np.int64)
    links = ctx.trace.links
    if len(links):
        m = (links["gpu_kind"].to_numpy() == "kernel") & (links["launch_tid"].to_numpy() == tid) \
            & _inside(links["launch_ts"].to_numpy(), mine)
        kernels = links.loc[m, "gpu_idx"].to_numpy(dtype=np.int64)
    what = "the loop over tensors in" if target == "user_loop" else "the user function"
    register(ctx, WhatIfSet.of_intervals(target, f"{what} {f.function} besides the training step",
                                         tid, mine[0], mine[1], kernels=kernels))  # fmt: skip


def _cat(parts: list[iv.Intervals]) -> iv.Intervals:
    if not parts:
        return iv.EMPTY
    return iv.union(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def user_functions(ctx: RankContext, view, per_step) -> tuple[dict, list[Fact]]:
    """(step or None -> (the named function, its extra µs), the user_function facts)."""
    py = ctx.trace.python
    if not view.has_stacks or not len(py):
        return {}, []
    tid = view.tid
    sel = py[(py["tid"].to_numpy() == tid) & user_frame_mask(py["name"])]
    # frames that start inside a phase are the model's, a hook's or the optimizer's own helpers
    phases = _cat([view.spans[p] for p in ("data", "optimizer", "backward", "communication", "forward")])
    sel = sel[~_inside(sel["ts"].to_numpy(), phases)] if len(sel) else sel
    if not len(sel):
        return {}, []
    windows = iv.union([w.start_us for w in ctx.windows], [w.end_us for w in ctx.windows])
    window = sum(dur for _, _, dur in per_step)
    outside = _cat([p["user_code"] for _, p, _ in per_step])
    # what the step is for: backward and the optimizer when it trains; a rank that never runs
    # either (inference, evaluation) is there for its forward
    trains = any(iv.length(p[k]) > 0 for _, p, _ in per_step for k in ("optimizer", "backward"))
    keys = ("data", "optimizer", "backward") if trains else ("data", "forward")
    training = _cat([p[k] for _, p, _ in per_step for k in keys])
    groups = {str(name): _group(str(name), grp, windows, outside, training)
              for name, grp in sel.groupby(sel["name"].astype(str), observed=True, sort=True)}  # fmt: skip
    facts = [f for f in (_measure(ctx, tid, g, window) for g in groups.values()) if f.share_ratio >= MIN_SHARE]
    site = _site(facts)
    loops = [f for f in facts if f.loop_op is not None]
    if loops:
        loop = max(loops, key=lambda f: (f.loop_us, f.function))
        _register(ctx, tid, loop, groups[loop.function], "user_loop")
    facts.sort(key=lambda f: (f is not site, f.driver, -f.extra_us, f.function))
    facts = facts[:MAX_FACTS]
    if site is None:
        return {}, facts
    site.site = True
    g = groups[site.function]
    _register(ctx, tid, site, g)
    mine = g.outside if site.driver else g.spans
    funcs = {None: (site.function, site.extra_us)}
    for step, _, dur in per_step:
        w = next(x for x in ctx.windows if x.step == step)
        funcs[step] = (site.function, iv.length(iv.clip(mine, w.start_us, w.end_us)))
    return funcs, facts


__all__ = ["LIBRARIES", "is_user_file", "user_frame_mask", "user_functions"]
