"""DataLoader waits (``dataloader_wait``): how long the training loop waits in the DataLoader's
``__next__``, what runs inside the iterator (cpu ops, Python, untraced) and the Hermes paper's
queue-based split adapted to traces (processing, reading, fetching, waiting for workers,
unattributed), with the largest part as classification.

Reads ``ctx.shared["critical_path"][step]`` when the critical_path analyzer left it (a DataFrame
with ``start_us, end_us, category, name``); works without it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.io import DataLoaderWait, NamedTime
from hermes_kb.trace.bundle import RankTrace

from .. import intervals as iv
from ..context import RankContext
from ..selection import (
    GC_NAME,
    div,
    memcpy_runtime,
    name_is,
    name_mask,
    on_tids,
    pick_steps,
    step_pos,
    top_ops_union,
    window_arrays,
)
from ..whatif.sets import WhatIfSet, register

TOP_PYTHON = 5

# Python functions whose self time is I/O (reading), matched on the python_function name.
IO_PY = re.compile(
    r"<built-in (method|function) (read|readinto|readline|readlines|recv|recv_into|recvfrom|pread|preadv|"
    r"open|stat|lstat|fstat|listdir|scandir|exists|isfile|isdir|urlopen)\b"
    r"|<method '(read|readinto|readline|recv)' of"
    r"|(^|/)(genericpath|socket|ssl|shutil|tarfile|zipfile|gzip|bz2|lzma|pickle)\.py\("
    r"|(^|/)(urllib3?|requests|http|boto3|botocore|s3fs|fsspec|gcsfs|h5py|zarr|lmdb|smart_open|webdataset)/"
    r"|torch/serialization\.py\(\d+\): (load|_load)|npyio\.py\(\d+\): load"
    r"|pathlib\.py\(\d+\): (open|read_bytes|read_text|stat|exists|is_file|is_dir|iterdir|glob|rglob)"
    r"|os\.py\(\d+\): (listdir|walk|scandir|_walk)|PIL/Image\.py\(\d+\): open\b|torchvision/io/"
)
# Python functions whose self time is waiting on a queue / lock / pipe (worker processes, threads).
WAIT_PY = re.compile(
    r"(^|/)multiprocessing/(connection|queues|synchronize|popen_\w+)\.py\(|(^|/)(queue|selectors)\.py\("
    r"|threading\.py\(\d+\): (wait|_wait_for_tstate_lock|join)"
    r"|<built-in (method|function) (acquire|poll|select|epoll|wait|_wait)\b|<method 'acquire' of"
)
# Python frames of archive members being read and decompressed (zip / tar / gzip / bz2 / lzma / zlib)
ARCHIVE_PY = re.compile(
    r"(^|/)(zipfile|tarfile|gzip|bz2|lzma)(/__init__)?\.py\(|(^|/)zipfile/_path"
    r"|<built-in (method|function) (decompress|flush)\b.*\b(zlib|_bz2|_lzma|zstd|lz4)"
    r"|<method '(decompress|flush)' of '(zlib|_bz2|_lzma)"
)
# image decoding on the CPU (PIL's decoders, OpenCV, torchvision's CPU decoders, imageio)
DECODE_PY = re.compile(
    r"PIL/ImageFile\.py\(\d+\): load\b|<method 'decode' of 'ImagingDecoder'|<built-in (function|method) imdecode\b"
    r"|torchvision/io/image\.py\(\d+\): (decode_jpeg|decode_image|decode_png|read_image)\b"
    r"|(^|/)imageio/.*\.py\(\d+\): (imread|read)\b"
)
# a file being opened (builtin open(), io.open) and the metadata calls around it
OPEN_CALL_PY = re.compile(r"<built-in (function|method) open\b|<built-in function io\.open\b")
OPEN_PY = re.compile(
    r"<built-in (function|method) (open|stat|lstat|exists|isfile|isdir)\b|<built-in function io\.open\b"
    r"|pathlib\.py\(\d+\): (open|stat|exists|is_file|is_dir)\b|genericpath\.py\(\d+\): (exists|isfile|isdir)\b"
)
MULTI_ITER = "_MultiProcessingDataLoaderIter"
SINGLE_ITER = "_SingleProcessDataLoaderIter"


# ---------------------------------------------------------------- helpers


def python_union(trace: RankTrace, tids: np.ndarray) -> iv.Intervals:
    py = trace.python
    if not len(py):
        return iv.EMPTY
    m = on_tids(py, tids)
    return iv.union(py["ts"].to_numpy()[m], py["end"].to_numpy()[m])


def python_self_us(py: pd.DataFrame) -> np.ndarray:
    """Self time of each python_function: its duration minus its direct children's."""
    if not len(py):
        return np.zeros(0)
    pid = py["parent_id"].to_numpy()
    kids = py.loc[pid >= 0].groupby("parent_id")["dur"].sum()
    child = py["py_id"].map(kids).fillna(0.0).to_numpy(dtype=np.float64, copy=True)
    child[py["py_id"].to_numpy() < 0] = 0.0
    return np.clip(py["dur"].to_numpy() - child, 0.0, None)


def lengths(starts: np.ndarray, ends: np.ndarray, s: iv.Intervals) -> np.ndarray:
    return iv.overlap_length(starts, ends, s)


def _iterator_kind(names: pd.Series) -> np.ndarray:
    s = names.astype(str)
    multi = s.str.contains(MULTI_ITER, regex=False).to_numpy()
    single = s.str.contains(SINGLE_ITER, regex=False).to_numpy()
    return np.where(multi, "multi_process", np.where(single, "single_process", "other"))


def _critical_path_share(
    ctx: RankContext, step: int, loader: iv.Intervals
) -> tuple[float | None, float | None]:
    """(critical path length, its host part inside the loader) for a step, or (None, None)."""
    cp = ctx.shared.get("critical_path")
    seg = cp.get(step) if isinstance(cp, dict) else None
    if not isinstance(seg, pd.DataFrame) or not len(seg) or not {"start_us", "end_us"} <= set(seg.columns):
        return None, None
    s = seg["start_us"].to_numpy(dtype=np.float64)
    e = seg["end_us"].to_numpy(dtype=np.float64)
    total = float(np.clip(e - s, 0.0, None).sum())
    host = np.ones(len(seg), dtype=bool)
    if "category" in seg.columns:
        cat = seg["category"].astype(str).str.lower()
        # device-side segments can run during the loader wait without being the wait itself
        device = cat.str.contains(r"kernel|gpu|device|memcpy|memset|comm|nccl|compute|stream", regex=True)
        host = ~device.to_numpy()
    if "name" in seg.columns:
        host |= seg["name"].astype(str).str.startswith("enumerate(DataLoader)").to_numpy()
    inside = float(iv.overlap_length(s[host], e[host], loader).sum()) if host.any() else 0.0
    return total, min(inside, total)


# ---------------------------------------------------------------- what runs inside the iterator


def _python_self(
    ctx: RankContext, ltids: np.ndarray, loader: iv.Intervals, steps: np.ndarray
) -> tuple[np.ndarray, np.ndarray, list[NamedTime]]:
    """Python self time inside the iterator, by class: (I/O per step, queue waits per step, the
    functions with the most self time)."""
    py = ctx.trace.python
    io_self = np.zeros(len(steps))
    wait_self = np.zeros(len(steps))
    top_py: list[NamedTime] = []
    if len(py):
        pmask = (
            on_tids(py, ltids) & iv.covered_by(py["ts"].to_numpy(), loader) & ~name_is(py["name"], GC_NAME)
        )
        if pmask.any():
            sub = py[pmask]
            selfus = python_self_us(py)[pmask]
            st = ctx.step_of(sub["ts"].to_numpy())
            is_io = name_mask(sub["name"], IO_PY)
            # a read called by a multiprocessing connection / queue frame is a worker's batch
            # arriving over its pipe (waiting for the worker), not storage being read
            py_ids = py["py_id"].to_numpy()
            wait_ids = py_ids[name_mask(py["name"], WAIT_PY) & (py_ids >= 0)]
            in_pipe = np.isin(sub["parent_id"].to_numpy(), wait_ids)
            is_io = is_io & ~in_pipe
            is_wait = (name_mask(sub["name"], WAIT_PY) | in_pipe) & ~is_io
            pos, ok = step_pos(steps, st)
            np.add.at(io_self, pos[ok & is_io], selfus[ok & is_io])
            np.add.at(wait_self, pos[ok & is_wait], selfus[ok & is_wait])
            g = pd.DataFrame({"name": sub["name"].to_numpy()[ok], "t": selfus[ok]}).groupby(
                "name", observed=True
            )["t"]
            agg = (
                pd.DataFrame({"t": g.sum(), "n": g.size()}).sort_values("t", ascending=False).head(TOP_PYTHON)
            )
            top_py = [NamedTime(name=str(n), time_us=float(r.t), count=int(r.n)) for n, r in agg.iterrows()]
    return io_self, wait_self, top_py


def _files_in_loader(
    ctx: RankContext, ltids: np.ndarray, loader: iv.Intervals, ws: np.ndarray, we: np.ndarray, steps: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Archive members, image decoding and file opens inside the iterator, per step (Python
    frames: with_stack=True): (archive µs, decode µs, open µs, open() calls)."""
    py = ctx.trace.python
    archive = np.zeros(len(steps))
    decode = np.zeros(len(steps))
    open_t = np.zeros(len(steps))
    opens = np.zeros(len(steps))
    if len(py):
        inl = on_tids(py, ltids) & iv.covered_by(py["ts"].to_numpy(), loader)
        pts, pend = py["ts"].to_numpy(float), py["end"].to_numpy(float)
        for arr, rx in ((archive, ARCHIVE_PY), (decode, DECODE_PY), (open_t, OPEN_PY)):
            m = inl & name_mask(py["name"], rx)
            if m.any():
                arr += lengths(ws, we, iv.intersect(loader, iv.union(pts[m], pend[m])))
        m = inl & name_mask(py["name"], OPEN_CALL_PY)
        if m.any():
            pos, ok = step_pos(steps, ctx.step_of(pts[m]))
            np.add.at(opens, pos[ok], 1.0)
    return archive, decode, open_t, opens


def _h2d_per_step(ctx: RankContext, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Host-to-device copies of each step: the host time of the calls that issued them is what the
    loop waits for ("fetching"); their device time is reported beside it."""
    tr = ctx.trace
    h2d_host = np.zeros(len(steps))
    h2d_dev = np.zeros(len(steps))
    mi, ri = memcpy_runtime(tr, "HtoD")
    if len(mi):
        r_ts, r_dur = tr.runtime["ts"].to_numpy()[ri], tr.runtime["dur"].to_numpy()[ri]
        for arr, ts, val in (
            (h2d_host, r_ts, r_dur),
            (h2d_dev, tr.memcpy["ts"].to_numpy()[mi], tr.memcpy["dur"].to_numpy()[mi]),
        ):
            pos, ok = step_pos(steps, ctx.step_of(ts))
            np.add.at(arr, pos[ok], val[ok])
    return h2d_host, h2d_dev


# ---------------------------------------------------------------- the wait and its parts, per step


@dataclass
class _Waits:
    """The DataLoader's ``__next__`` annotations of a rank and, per step window, the wait and
    its parts (µs)."""

    dl: pd.DataFrame
    kinds: np.ndarray  # iterator kind per annotation
    dts: np.ndarray
    dend: np.ndarray
    loader: iv.Intervals
    step_of_call: np.ndarray
    pin: iv.Intervals
    ws: np.ndarray
    we: np.ndarray
    steps: np.ndarray
    wait: np.ndarray
    ops_in: np.ndarray
    py_in: np.ndarray
    untraced: np.ndarray
    processing: np.ndarray
    reading: np.ndarray
    fetching: np.ndarray
    worker_wait: np.ndarray
    unattributed: np.ndarray
    h2d_dev: np.ndarray
    archive: np.ndarray
    decode: np.ndarray
    open_t: np.ndarray
    opens: np.ndarray
    top_py: list[NamedTime]


def _waits(ctx: RankContext, dl: pd.DataFrame, tids: np.ndarray) -> _Waits:
    tr = ctx.trace
    kinds = _iterator_kind(dl["name"])
    dts, dend = dl["ts"].to_numpy(), dl["end"].to_numpy()
    loader = iv.union(dts, dend)
    multi = iv.union(dts[kinds == "multi_process"], dend[kinds == "multi_process"])
    ltids = np.union1d(tids, pd.unique(dl["tid"].to_numpy()))

    ops = tr.cpu_ops
    O = top_ops_union(tr, ltids)
    P = python_union(tr, ltids)
    PO = iv.union(np.concatenate([O[0], P[0]]), np.concatenate([O[1], P[1]]))
    if len(ops):
        pm = name_mask(ops["name"], r"pin_memory") & on_tids(ops, ltids)
        PIN = iv.union(ops["ts"].to_numpy()[pm], ops["end"].to_numpy()[pm])
    else:
        PIN = iv.EMPTY

    ws, we = window_arrays(ctx)
    steps = np.array([w.step for w in ctx.windows])
    wait = lengths(ws, we, loader)
    ops_in = lengths(ws, we, iv.intersect(loader, O))
    po_in = lengths(ws, we, iv.intersect(loader, PO))
    pin_in = lengths(ws, we, iv.intersect(loader, PIN))
    m_len = lengths(ws, we, multi)
    m_po = lengths(ws, we, iv.intersect(multi, PO))
    step_of_call = ctx.step_of(dts)

    io_self, wait_self, top_py = _python_self(ctx, ltids, loader, steps)
    archive, decode, open_t, opens = _files_in_loader(ctx, ltids, loader, ws, we, steps)
    h2d_host, h2d_dev = _h2d_per_step(ctx, steps)

    py_in = np.clip(po_in - ops_in, 0.0, None)
    untraced = np.clip(wait - po_in, 0.0, None)
    untraced_multi = np.clip(m_len - m_po, 0.0, None)
    reading = np.minimum(io_self, py_in)
    wait_py = np.minimum(wait_self, py_in - reading)
    processing = np.clip(ops_in - pin_in, 0.0, None) + (py_in - reading - wait_py)
    worker_wait = np.minimum(untraced_multi, untraced) + wait_py
    unattributed = np.clip(untraced - untraced_multi, 0.0, None)
    fetching = pin_in + h2d_host
    return _Waits(dl=dl, kinds=kinds, dts=dts, dend=dend, loader=loader, step_of_call=step_of_call, pin=PIN, ws=ws,
                  we=we, steps=steps, wait=wait, ops_in=ops_in, py_in=py_in, untraced=untraced, processing=processing,
                  reading=reading, fetching=fetching, worker_wait=worker_wait, unattributed=unattributed,
                  h2d_dev=h2d_dev, archive=archive, decode=decode, open_t=open_t, opens=opens, top_py=top_py)  # fmt: skip


def _wait_fact(ctx: RankContext, w: _Waits, stacks: bool, idx, step: int | None, iterator: str, calls: int, ranges,
               top) -> DataLoaderWait:  # fmt: skip
    def s(a: np.ndarray) -> float:
        return float(a[idx].sum())

    steps = w.steps
    comp = {"processing": s(w.processing), "reading": s(w.reading), "fetching": s(w.fetching),
            "worker_wait": s(w.worker_wait), "unattributed": s(w.unattributed)}  # fmt: skip
    total = sum(comp.values())
    best = max(comp, key=comp.get)
    cls = "undetermined" if total <= 0 or best == "unattributed" else best
    w_us, step_us = s(w.wait), float((w.we - w.ws)[idx].sum())
    cp_total = cp_loader = None
    for i in np.atleast_1d(np.arange(len(steps))[idx]):
        t, l_ = _critical_path_share(ctx, int(steps[i]), w.loader)
        if t is not None:
            cp_total = (cp_total or 0.0) + t
            cp_loader = (cp_loader or 0.0) + l_
    return DataLoaderWait(
        rank=ctx.trace.rank, step=step, iterator=iterator, calls_count=calls,
        wait_us=w_us, step_us=step_us, step_share_ratio=div(w_us, step_us),
        critical_path_us=cp_total, critical_path_loader_us=cp_loader,
        critical_path_share_ratio=div(cp_loader, cp_total) if cp_total is not None else None,
        cpu_ops_us=s(w.ops_in), python_us=s(w.py_in), untraced_us=s(w.untraced),
        cpu_ops_ratio=div(s(w.ops_in), w_us), python_ratio=div(s(w.py_in), w_us), untraced_ratio=div(s(w.untraced), w_us),
        python_stacks=stacks, h2d_device_us=s(w.h2d_dev),
        processing_us=comp["processing"], reading_us=comp["reading"], fetching_us=comp["fetching"],
        worker_wait_us=comp["worker_wait"], unattributed_us=comp["unattributed"], data_time_us=total,
        data_share_ratio=div(total, step_us), fetching_ratio=div(comp["fetching"], step_us),
        classification=cls, classification_ratio=div(comp[best], total) if cls != "undetermined" else div(comp["unattributed"], total),
        top_python=top,
        archive_us=s(w.archive), archive_ratio=div(s(w.archive), w_us), file_opens_count=int(s(w.opens)),
        opens_per_call=s(w.opens) / calls if calls else 0.0, open_us=s(w.open_t),
        open_ratio=div(s(w.open_t), w_us), decode_us=s(w.decode), decode_ratio=div(s(w.decode), w_us),
        evidence=Evidence(
            time_ranges_us=ranges,
            events=sorted({str(n) for n in w.dl["name"].to_numpy()[np.isin(w.step_of_call, steps[idx])]})[:5],
            counts={"dataloader_annotations": calls, "pin_memory_ops": int(np.isin(ctx.step_of(w.pin[0]), steps[idx]).sum())},
            note="wait = union of __next__ annotations in the step; processing = cpu ops (w/o pin_memory) + Python "
                 "time not in I/O or queue-wait functions; reading = self time of Python I/O calls; fetching = "
                 "host time of the HtoD copy calls in the step + pin_memory; worker_wait = untraced/queue-wait time in a "
                 "multi-process iterator; unattributed = untraced time in a single-process iterator",
        ),
    )  # fmt: skip


def dataloader_wait(ctx: RankContext, tids: np.ndarray, stacks: bool) -> list[Fact]:
    """``dataloader_wait`` facts: the steps with the longest waits, and the aggregate."""
    tr = ctx.trace
    ann = tr.annotations
    dl = ann[(ann["kind"] == "dataloader").to_numpy()]
    if not len(dl):
        return []
    w = _waits(ctx, dl, tids)
    steps, kinds, dts, dend, step_of_call = w.steps, w.kinds, w.dts, w.dend, w.step_of_call
    register(ctx, WhatIfSet.of_intervals("dataloader", "the DataLoader's next() on the host (its annotation)",
                                         dl["tid"].to_numpy(np.int64), dts, dend))  # fmt: skip
    facts: list[Fact] = []
    present = {int(steps[i]): float(w.wait[i]) for i in range(len(steps)) if w.wait[i] > 0}
    keep = pick_steps(present)
    for i, step in enumerate(steps):
        if int(step) not in keep:
            continue
        sel = step_of_call == step
        k = set(kinds[sel]) or {"other"}
        rng = [(float(a), float(b)) for a, b in zip(*iv.clip(w.loader, w.ws[i], w.we[i]))][:5]
        facts.append(
            _wait_fact(ctx, w, stacks, np.array([i]), int(step), k.pop() if len(k) == 1 else "mixed", int(sel.sum()),
                       rng, [])  # fmt: skip
        )
    if present:
        inwin = step_of_call >= 0
        k = set(kinds[inwin])
        longest = np.argsort(-(dend - dts)[inwin])[:5]
        rng = [(float(dts[inwin][j]), float(dend[inwin][j])) for j in longest]
        facts.append(
            _wait_fact(
                ctx,
                w,
                stacks,
                np.arange(len(steps)),
                None,
                k.pop() if len(k) == 1 else "mixed",
                int(inwin.sum()),
                rng,
                w.top_py,
            )
        )
    return facts
