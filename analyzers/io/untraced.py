"""Untraced host time (``untraced_host_time``): per step (at most ``MAX_STEP_FACTS``, the ones
with the most untraced time) and aggregate, the host time on the host threads outside every cpu
op and user annotation, split into Python work and untraced time, with the longest gaps and the
events around them; Python I/O and input preprocessing between operators, and ordinary Python
code that paused for milliseconds (irregular pauses)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.io import HostGap, UntracedHostTime

from .. import intervals as iv
from ..context import RankContext
from ..selection import div, host_window_arrays, main_tid, name_is, name_mask, on_tids, outermost_frames, pick_steps
from ..timeline.host_sets import gloo_mask, gloo_waits
from ..whatif.sets import WhatIfSet, register

LARGE_GAP_US = 1000.0  # a host gap of 1 ms or more is "large" (far above per-op Python overhead)
TOP_GAPS = 3


def _gap_python(
    py_ts: np.ndarray, py_end: np.ndarray, names: np.ndarray, a: float, b: float, covered: float
) -> str | None:
    """The innermost python function (latest start) that covers at least half of the gap's
    Python-covered time: what the host was doing in the gap."""
    if not len(py_ts) or covered <= 0:
        return None
    m = np.flatnonzero((py_ts < b) & (py_end > a))
    if not len(m):
        return None
    ov = np.minimum(py_end[m], b) - np.maximum(py_ts[m], a)
    m = m[ov >= 0.5 * covered - 1e-9]
    return str(names[m[np.argmax(py_ts[m])]]) if len(m) else None


# Python frames that block on files, storage, sockets or the clock (with_stack names):
# builtins such as open/fsync/sleep, file and pickler methods, torch.save/load, logging, json/pickle.
# json: only json.load / json.dump, which read or write a file; json.loads / json.dumps parse or
# format a string in memory (CPU work: a shard of annotations parsed in the step is not I/O).
PYTHON_IO_RE = re.compile(
    r"^<built-in function (open|fsync|fdatasync|sleep|select|poll)>"
    r"|^<built-in method (write|writelines|flush|read|readinto|readline|readlines|close|dump|dumps|load|"
    r"write_record|write_end_of_file|send|sendall|recv|recv_into) of "
    r"|torch/serialization\.py\(\d+\): (save|load|_save|_load)\b"
    r"|logging/__init__\.py\(\d+\): (emit|flush|handle)\b"
    r"|(^|/)json/__init__\.py\(\d+\): (load|dump)$"
    r"|(^|/)(pickle|shutil|gzip|tarfile|zipfile|socket|ssl)\.py\("
)


# Input preparation called inline on the host threads (not from a DataLoader): image, video and
# audio decoding and transforms, tokenizers, Hugging Face processors and pipelines' preprocess.
# Matched on the frame's file path (``path(line): function``), as with_stack names it.
PREPROCESS_RE = re.compile(
    r"(^|/)(PIL|torchvision/(transforms|io|datasets)|cv2|av|decord|torchaudio|librosa|albumentations|"
    r"kornia/augmentation|timm/data|tokenizers|imageio|soundfile)/"
    r"|transformers/(image_processing|feature_extraction|processing_utils|tokenization|image_transforms|image_utils|"
    r"video_utils|video_processing|audio_utils)\w*\.py\("
    r"|transformers/models/\w+/(image_processing|feature_extraction|processing|tokenization|video_processing)_\w+\.py\("
    r"|transformers/pipelines/\w+\.py\(\d+\): (preprocess|read_video_\w+|load_image|ffmpeg_read)$"
)


# hermes' own monitor as with_stack names its frames (.../hermes_kb/monitor/recorder.py(202): step)
MONITOR_FRAME_RE = re.compile(r"hermes_kb/monitor/\w+\.py\(\d+\)")


IO_STEP_SHARE = 0.10  # a step whose I/O frames take 10% of it is an I/O step
QUIET_SHARE = 0.01  # ... and one under 1% a quiet one
IO_EXPLAINS = 0.5  # the I/O frames must be half of what the I/O steps add for the excess to count


def _blocking_io(rows: list[dict], python_io_us: float) -> tuple[int, float | None, float]:
    """(I/O steps, their summed excess over the median quiet step, blocking_io_us). The excess is
    what a periodic save or log flush adds to the steps it lands in, everything around the write
    included (state_dict(), pickling in Python, copies), which the I/O frames alone leave out;
    None without both kinds of step. It counts when the I/O frames of those steps are at least
    IO_EXPLAINS of it."""
    io = [r for r in rows if r["io"] >= IO_STEP_SHARE * r["step_us"]]
    quiet = [r["step_us"] for r in rows if r["io"] < QUIET_SHARE * r["step_us"]]
    if not io or not quiet:
        return len(io), None, python_io_us
    base = float(np.median(quiet))
    excess = float(sum(max(r["step_us"] - base, 0.0) for r in io))
    explained = sum(r["io"] for r in io) >= IO_EXPLAINS * excess
    return len(io), excess, max(python_io_us, excess) if explained else python_io_us


# ---------------------------------------------------------------- what covers host time


class _Cover:
    """The events that cover host time on the host threads: top-level cpu ops, non-step
    annotations (and gloo waits), Python GC pauses and hermes' monitor frames; and the names of
    the events that end where a gap starts and start where it ends."""

    def __init__(self, ctx: RankContext, tids: np.ndarray):
        tr = ctx.trace
        ops, ann, py = tr.cpu_ops, tr.annotations, tr.python
        self.frames = (ops, ann, py)
        # covering events: top-level cpu ops and non-step annotations on the host threads
        om = (ops["depth"].to_numpy() == 0) & on_tids(ops, tids) if len(ops) else np.zeros(0, bool)
        am = on_tids(ann, tids) & (ann["kind"] != "step").to_numpy() if len(ann) else np.zeros(0, bool)
        # CPU training with gloo: the driving thread waits for a gloo collective at work on gloo's
        # threads (overlap.gloo_waits); those stretches cover host time like an annotation of its own
        m = main_tid(tr)
        if m is not None and len(ann):
            (w_s, _), _ = gloo_waits(tr, m)
            if len(w_s):
                am |= gloo_mask(ann) & (ann["tid"].to_numpy() != m)
        # Python GC pauses are accounted for by the gc_pauses fact: they cover host time like an
        # operator does, so they are neither "Python between operators" nor untraced here; hermes'
        # own monitor (its step() and resource sampling, seen in its captures) is measured apart
        gm = on_tids(py, tids) & name_is(py["name"], "Python GC") if len(py) else np.zeros(0, bool)
        mm = on_tids(py, tids) & name_mask(py["name"], MONITOR_FRAME_RE) if len(py) else np.zeros(0, bool)
        self.monitor = iv.union(py["ts"].to_numpy()[mm], py["end"].to_numpy()[mm]) if len(py) else iv.EMPTY
        pm = gm | mm  # Python frames that cover host time like an operator
        c_ts = np.concatenate([ops["ts"].to_numpy()[om], ann["ts"].to_numpy()[am], py["ts"].to_numpy()[pm]])
        c_end = np.concatenate([ops["end"].to_numpy()[om], ann["end"].to_numpy()[am], py["end"].to_numpy()[pm]])
        self.src = np.concatenate([np.zeros(int(om.sum()), np.int8), np.ones(int(am.sum()), np.int8),
                                   np.full(int(pm.sum()), 2, np.int8)])  # fmt: skip
        self.row = np.concatenate([np.flatnonzero(om), np.flatnonzero(am), np.flatnonzero(pm)])
        self.union = iv.union(c_ts, c_end)
        self.by_end = np.argsort(c_end, kind="stable")
        self.by_ts = np.argsort(c_ts, kind="stable")
        self.end_sorted, self.ts_sorted = c_end[self.by_end], c_ts[self.by_ts]
        self.om, self.am, self.gm, self.mm = om, am, gm, mm

    def label(self, j: int) -> str:
        src, row = self.src[j], self.row[j]
        return str(self.frames[src]["name"].iat[row])

    def around(self, a: float, b: float) -> tuple[str | None, str | None]:
        i = np.searchsorted(self.end_sorted, a, side="right") - 1
        before = self.label(self.by_end[i]) if i >= 0 and abs(self.end_sorted[i] - a) < 1e-6 else None
        k = np.searchsorted(self.ts_sorted, b, side="left")
        after = self.label(self.by_ts[k]) if k < len(self.by_ts) and abs(self.ts_sorted[k] - b) < 1e-6 else None
        return before, after


@dataclass
class _HostPython:
    """The Python frames on the host threads, and those of them doing I/O or input preprocessing."""

    mask: np.ndarray
    union: iv.Intervals
    ts: np.ndarray
    end: np.ndarray
    names: np.ndarray
    io_mask: np.ndarray
    io: iv.Intervals
    pre_mask: np.ndarray
    pre: iv.Intervals


def _host_python(py: pd.DataFrame, tids: np.ndarray) -> _HostPython:
    pmask = on_tids(py, tids) if len(py) else np.zeros(0, bool)
    P = iv.union(py["ts"].to_numpy()[pmask], py["end"].to_numpy()[pmask]) if len(py) else iv.EMPTY
    py_ts = py["ts"].to_numpy()[pmask] if len(py) else np.zeros(0)
    py_end = py["end"].to_numpy()[pmask] if len(py) else np.zeros(0)
    py_names = py["name"].to_numpy()[pmask] if len(py) else np.zeros(0, dtype=object)
    io_mask = pmask & name_mask(py["name"], PYTHON_IO_RE) if len(py) else np.zeros(0, bool)
    P_io = iv.union(py["ts"].to_numpy()[io_mask], py["end"].to_numpy()[io_mask]) if len(py) else iv.EMPTY
    pre_mask = pmask & name_mask(py["name"], PREPROCESS_RE) if len(py) else np.zeros(0, bool)
    P_pre = iv.union(py["ts"].to_numpy()[pre_mask], py["end"].to_numpy()[pre_mask]) if len(py) else iv.EMPTY
    return _HostPython(mask=pmask, union=P, ts=py_ts, end=py_end, names=py_names, io_mask=io_mask, io=P_io,
                       pre_mask=pre_mask, pre=P_pre)  # fmt: skip


# ---------------------------------------------------------------- gaps per step


def _step_rows(ctx: RankContext, cover: _Cover, hp: _HostPython, frames: _PauseFrames | None
               ) -> tuple[list[dict], list[np.ndarray], list[np.ndarray]]:  # fmt: skip
    """Per step window with a host side: the gaps between covering events and their make-up;
    and the gaps themselves (starts, ends)."""
    hs, he = host_window_arrays(ctx)
    rows = []
    gap_s: list[np.ndarray] = []
    gap_e: list[np.ndarray] = []
    for i, w in enumerate(ctx.windows):
        a, b = hs[i], he[i]
        if b <= a:
            continue
        cs, ce = iv.clip(cover.union, a, b)
        gs = np.concatenate([[a], ce])
        ge = np.concatenate([cs, [b]])
        keep = ge > gs
        gs, ge = gs[keep], ge[keep]
        glen = ge - gs
        gap_s.append(gs)
        gap_e.append(ge)
        py_part = iv.overlap_length(gs, ge, hp.union) if len(gs) else np.zeros(0)
        io_part = iv.overlap_length(gs, ge, hp.io) if len(gs) else np.zeros(0)
        pre_part = iv.overlap_length(gs, ge, hp.pre) if len(gs) and len(hp.pre[0]) else np.zeros(len(gs))
        gaps = _top_gaps(cover, hp, gs, ge, glen, py_part)
        large = glen >= LARGE_GAP_US
        pauses = _irregular_pauses(gs[large], ge[large], frames) if frames is not None else []
        mon_s, mon_e = iv.clip(cover.monitor, a, b)
        rows.append({"step": w.step, "window": b - a, "step_us": w.duration_us, "outside": float(glen.sum()), "py": float(py_part.sum()),
                     "io": float(io_part.sum()), "pre": float(pre_part.sum()), "mon": float((mon_e - mon_s).sum()),
                     "n": len(glen), "nl": int(large.sum()), "ll": float(glen[large].sum()), "gaps": gaps,
                     "pauses": pauses})  # fmt: skip
    return rows, gap_s, gap_e


def _top_gaps(cover: _Cover, hp: _HostPython, gs: np.ndarray, ge: np.ndarray, glen: np.ndarray,
              py_part: np.ndarray) -> list[HostGap]:  # fmt: skip
    """The longest gaps of a step, with the events around them and the Python at work in them."""
    top = np.argsort(-glen, kind="stable")[:TOP_GAPS]
    gaps = []
    for j in top:
        before, after = cover.around(gs[j], ge[j])
        gaps.append(HostGap(start_us=float(gs[j]), end_us=float(ge[j]), duration_us=float(glen[j]), before=before,
                            after=after, python_function=_gap_python(hp.ts, hp.end, hp.names, gs[j], ge[j], py_part[j]),
                            untraced_us=float(glen[j] - py_part[j])))  # fmt: skip
    return gaps


def _untraced_fact(ctx: RankContext, tids: np.ndarray, stacks: bool, cover: _Cover, hp: _HostPython,
                   pre_frames: list[str], rs: list[dict], step: int | None, gaps: list[HostGap]) -> UntracedHostTime:  # fmt: skip
    win = sum(r["window"] for r in rs)
    out = sum(r["outside"] for r in rs)
    pyt = min(sum(r["py"] for r in rs), out)
    pio = min(sum(r["io"] for r in rs), pyt)
    n_io, excess, blocking = _blocking_io(rs, pio) if step is None else (0, None, pio)
    pre = min(sum(r["pre"] for r in rs), pyt)
    return UntracedHostTime(
        rank=ctx.trace.rank, step=step, window_us=win, outside_ops_us=out, python_us=pyt, untraced_us=out - pyt,
        python_io_us=pio, python_io_ratio=div(pio, win), python_io_share_ratio=div(pio, pyt),
        io_steps_count=n_io, io_step_excess_us=excess, blocking_io_us=blocking,
        python_preprocess_us=pre, python_preprocess_ratio=div(pre, win), python_preprocess_share_ratio=div(pre, pyt),
        preprocess_frames=pre_frames if pre > 0 else [],
        monitor_us=sum(r["mon"] for r in rs),
        outside_ops_ratio=div(out, win), python_ratio=div(pyt, win), untraced_ratio=div(out - pyt, win),
        gaps_count=sum(r["n"] for r in rs), large_gap_threshold_us=LARGE_GAP_US,
        large_gaps_count=sum(r["nl"] for r in rs), large_gaps_us=sum(r["ll"] for r in rs),
        irregular_pause_us=sum(p[1] for r in rs for p in r["pauses"]),
        irregular_pause_ratio=div(sum(p[1] for r in rs for p in r["pauses"]), win),
        irregular_pause_count=sum(len(r["pauses"]) for r in rs),
        irregular_frames=_top_names(p for r in rs for p in r["pauses"]),
        python_stacks=stacks, top_gaps=gaps,
        evidence=Evidence(
            time_ranges_us=[(g.start_us, g.end_us) for g in gaps],
            counts={"host_threads": len(tids), "cpu_ops": int(cover.om.sum()), "annotations": int(cover.am.sum()),
                    "python_functions": int(hp.mask.sum())},
            note=f"host threads {tids.tolist()[:6]}; outside_ops = host window minus top-level cpu ops and "
                 "non-step user annotations; python = part of it under python_function events",
        ),
    )  # fmt: skip


def untraced_host_time(ctx: RankContext, tids: np.ndarray, stacks: bool) -> list[Fact]:
    """``untraced_host_time`` facts: the steps with the most untraced time, and the aggregate."""
    tr = ctx.trace
    ops, ann, py = tr.cpu_ops, tr.annotations, tr.python
    if not len(ops) and not len(ann) and not len(py):
        return []
    cover = _Cover(ctx, tids)
    hp = _host_python(py, tids)
    gm, mm = cover.gm, cover.mm
    frames = _PauseFrames(py[hp.mask & ~gm & ~mm & ~hp.io_mask]) if len(py) and (hp.mask & ~gm & ~mm).any() else None
    rows, gap_s, gap_e = _step_rows(ctx, cover, hp, frames)
    if not rows:
        return []
    _register_gaps(ctx, np.concatenate(gap_s), np.concatenate(gap_e), hp.io, hp.pre)
    pre_frames = _outer_frames(py, hp.pre_mask) if hp.pre_mask.any() else []
    pz = [p for r in rows for p in r["pauses"]]
    if pz and (tid := main_tid(ctx.trace)) is not None:
        register(ctx, WhatIfSet.of_intervals("python_pauses", "gaps where ordinary Python code paused for milliseconds",
                                             tid, [p[2] for p in pz], [p[3] for p in pz]))  # fmt: skip

    def make(rs: list[dict], step: int | None, gaps: list[HostGap]) -> UntracedHostTime:
        return _untraced_fact(ctx, tids, stacks, cover, hp, pre_frames, rs, step, gaps)

    keep = pick_steps({r["step"]: r["outside"] - r["py"] for r in rows})
    facts: list[Fact] = [make([r], r["step"], r["gaps"]) for r in rows if r["step"] in keep]
    allgaps = sorted((g for r in rows for g in r["gaps"]), key=lambda g: -g.duration_us)[:TOP_GAPS]
    facts.append(make(rows, None, allgaps))
    return facts


# ---------------------------------------------------------------- irregular pauses, what-if sets


PAUSE_FACTOR = 5.0  # a call this many times its frame's median is a pause, not the frame's work


class _PauseFrames:
    """Python frames (not I/O, not GC, not hermes' monitor) and, per frame name, its median call
    duration and call count: a call far above its own median is the frame stopping, not working."""

    def __init__(self, py: pd.DataFrame):
        self.ts = py["ts"].to_numpy(np.float64)
        self.end = py["end"].to_numpy(np.float64)
        codes, names = pd.factorize(py["name"].astype(str))
        self.code, self.names = codes, np.asarray(names, dtype=object)
        dur = self.end - self.ts
        med = pd.Series(dur).groupby(codes).median()
        self.median = med.reindex(range(len(names))).to_numpy()
        self.count = np.bincount(codes, minlength=len(names))

    def innermost(self, a: float, b: float) -> int:
        """The latest-starting frame covering [a, b], -1 when none."""
        m = np.flatnonzero((self.ts <= a) & (self.end >= b))
        return int(m[np.argmax(self.ts[m])]) if len(m) else -1


def _irregular_pauses(gs: np.ndarray, ge: np.ndarray, f: _PauseFrames) -> list[tuple[str, float]]:
    """(frame name, pause µs) of the large gaps whose innermost covering frame took at least
    PAUSE_FACTOR times, and LARGE_GAP_US more than, the median of its calls (at least 3)."""
    out = []
    for a, b in zip(gs, ge):
        i = f.innermost(a, b)
        if i < 0:
            continue
        c = f.code[i]
        med, dur = f.median[c], f.end[i] - f.ts[i]
        if f.count[c] >= 3 and dur >= max(PAUSE_FACTOR * med, med + LARGE_GAP_US):
            out.append((str(f.names[c]), float(min(b - a, dur - med)), float(a), float(b)))
    return out


def _top_names(pauses) -> list[str]:
    tot: dict[str, float] = {}
    for n, us_, *_ in pauses:
        tot[n] = tot.get(n, 0.0) + us_
    return [n for n, _ in sorted(tot.items(), key=lambda x: -x[1])[:TOP_GAPS]]


def _outer_frames(py: pd.DataFrame, m: np.ndarray, n: int = 3) -> list[str]:
    """Names of the outermost frames of ``m`` (no ancestor in ``m``), most time first."""
    rows = outermost_frames(py, m)
    dur = py["end"].to_numpy(float)[rows] - py["ts"].to_numpy(float)[rows]
    tot = pd.Series(dur).groupby(py["name"].astype(str).to_numpy()[rows]).sum().sort_values(ascending=False, kind="stable")
    return [str(k) for k in tot.index[:n]]


def _register_gaps(ctx: RankContext, gs: np.ndarray, ge: np.ndarray, p_io: iv.Intervals,
                   p_pre: iv.Intervals = iv.EMPTY) -> None:  # fmt: skip
    """What-if sets of the host time no operator covers (on the thread that drives the steps)."""
    tid = main_tid(ctx.trace)
    if tid is None or not len(gs):
        return
    register(ctx, WhatIfSet.of_intervals("host_gaps", "host time between operators (untraced Python, GC, I/O)",
                                         tid, gs, ge))  # fmt: skip
    large = (ge - gs) >= LARGE_GAP_US
    if large.any():
        register(ctx, WhatIfSet.of_intervals("host_gaps_large", f"host gaps of {LARGE_GAP_US / 1e3:.0f} ms or more",
                                             tid, gs[large], ge[large]))  # fmt: skip
    io_s, io_e = iv.intersect(iv.union(gs, ge), p_io)
    if len(io_s):
        register(ctx, WhatIfSet.of_intervals("python_io", "Python frames blocking on I/O between operators",
                                             tid, io_s, io_e))  # fmt: skip
    pre_s, pre_e = iv.intersect(iv.union(gs, ge), p_pre)
    if len(pre_s):
        register(ctx, WhatIfSet.of_intervals("python_preprocess", "input preprocessing frames between operators",
                                             tid, pre_s, pre_e))  # fmt: skip
