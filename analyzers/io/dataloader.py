"""io analyzer: data-loader wait and its make-up, untraced host time, host-to-device copies.

Facts (hermes_kb/facts/io.py; formulas in docs/analysis/io.md):

* ``dataloader_wait``: per step that has DataLoader ``__next__`` annotations (at most
  ``MAX_STEP_FACTS`` steps, the ones with the longest wait) and one aggregate: wait time,
  share of the step and of the critical path, what runs inside the iterator (cpu ops, Python,
  untraced), and the Hermes paper's queue-based split adapted to traces (processing, reading,
  fetching, waiting for workers, unattributed) with the largest part as classification.
* ``untraced_host_time``: per step (same cap) and aggregate: host time on the host threads
  outside every cpu op and user annotation, split into Python work and untraced time, with
  the longest gaps and the events around them.
* ``h2d_copies``: per source memory kind (pageable / pinned / other), over all analysed steps.

Reads ``ctx.shared["critical_path"][step]`` when the critical_path analyzer left it (a DataFrame
with ``start_us, end_us, category, name``); works without it. Leaves nothing in ``ctx.shared``.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from hermes_kb.core.devices import device_of_trace
from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.io import DataLoaderWait, HostGap, HostToDeviceCopies, NamedTime, UntracedHostTime
from hermes_kb.trace.bundle import RankTrace

from .. import intervals as iv
from ..context import RankContext
from ..timeline.host_sets import gloo_mask, gloo_waits
from ..whatif.sets import WhatIfSet, register

MAX_STEP_FACTS = 8  # per-step facts per kind; beyond that only the steps with the largest values
LARGE_GAP_US = 1000.0  # a host gap of 1 ms or more is "large" (far above per-op Python overhead)
TOP_GAPS = 3
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
GC_NAME = "Python GC"


# ---------------------------------------------------------------- helpers shared with cpu.py


def name_mask(names: pd.Series, pattern: re.Pattern | str) -> np.ndarray:
    """Rows whose name matches the regex (re.search, once per distinct name). Matched with ``re``
    directly: pandas' str.contains warns about capture groups, and silencing that warning is not
    thread-safe (analyses run in threads)."""
    if not len(names):
        return np.zeros(0, dtype=bool)
    rx = pattern if isinstance(pattern, re.Pattern) else re.compile(pattern)
    if isinstance(names.dtype, pd.CategoricalDtype):
        codes = names.cat.codes.to_numpy()
        used = np.unique(codes[codes >= 0])  # test only the names present in these rows
        hit = np.zeros(len(names.cat.categories), dtype=bool)
        cats = names.cat.categories[used].astype(str)
        hit[used] = np.fromiter((rx.search(c) is not None for c in cats), dtype=bool, count=len(used))
        return np.where(codes >= 0, hit[np.clip(codes, 0, None)], False)
    uniq, inv = np.unique(names.astype(str).to_numpy(), return_inverse=True)
    return np.fromiter((rx.search(u) is not None for u in uniq), dtype=bool, count=len(uniq))[inv.reshape(-1)]


def name_is(names: pd.Series, value: str) -> np.ndarray:
    return (names == value).to_numpy(dtype=bool) if len(names) else np.zeros(0, dtype=bool)


def main_tid(trace: RankTrace) -> int | None:
    """The training loop's thread: the one with the step annotations, else the DataLoader
    annotations, else the thread launching the most device work, else the busiest cpu-op thread."""
    ann = trace.annotations
    for kind in ("step", "dataloader", "optimizer"):
        sel = ann.loc[(ann["kind"] == kind).to_numpy(), "tid"]
        if len(sel):
            return int(sel.value_counts().index[0])
    rt = trace.runtime
    if len(rt):
        sel = rt.loc[rt["kind"].isin(["launch", "graph_launch"]).to_numpy(), "tid"]
        if len(sel):
            return int(sel.value_counts().index[0])
    ops = trace.cpu_ops
    if len(ops):
        top = ops[(ops["depth"] == 0).to_numpy()]
        return int(top.groupby("tid")["dur"].sum().idxmax())
    py = trace.python
    if len(py):
        return int(py["tid"].value_counts().index[0])
    return None


def host_tids(trace: RankTrace) -> np.ndarray:
    """Threads whose work is the training loop's host time: the main thread plus every thread
    that launches kernels, copies or synchronises (e.g. the autograd engine's device thread)."""
    tids = set()
    m = main_tid(trace)
    if m is not None:
        tids.add(m)
    rt = trace.runtime
    if len(rt):
        sel = rt["kind"].isin(["launch", "graph_launch", "memcpy", "memset", "sync"]).to_numpy()
        tids.update(int(t) for t in pd.unique(rt["tid"].to_numpy()[sel]))
    return np.array(sorted(tids), dtype=np.int64)


def on_tids(df: pd.DataFrame, tids: np.ndarray) -> np.ndarray:
    if not len(df):
        return np.zeros(0, dtype=bool)
    return np.isin(df["tid"].to_numpy(), tids)


def host_window(w) -> tuple[float, float]:
    """Host side of a step: its start to the end of its step annotation (the window end when
    the annotation ends before it starts, e.g. inferred steps)."""
    end = w.cpu_end_us if w.cpu_end_us > w.start_us else w.end_us
    return w.start_us, min(end, w.end_us)


def window_arrays(ctx: RankContext) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([w.start_us for w in ctx.windows], dtype=np.float64),
            np.array([w.end_us for w in ctx.windows], dtype=np.float64))  # fmt: skip


def host_window_arrays(ctx: RankContext) -> tuple[np.ndarray, np.ndarray]:
    hw = [host_window(w) for w in ctx.windows]
    return np.array([h[0] for h in hw], dtype=np.float64), np.array([h[1] for h in hw], dtype=np.float64)


def step_pos(steps: np.ndarray, st: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index into ``steps`` (the windows' step numbers) of each step number in ``st`` (from
    ``ctx.step_of``, -1 outside every window), and which ones are valid."""
    st = np.asarray(st)
    if not len(steps):
        return np.zeros(len(st), np.int64), np.zeros(len(st), bool)
    order = np.argsort(steps, kind="stable")
    ss = steps[order]
    i = np.clip(np.searchsorted(ss, st), 0, len(ss) - 1)
    return order[i], (st >= 0) & (ss[i] == st)


def pick_steps(values: dict[int, float], n: int = MAX_STEP_FACTS) -> set[int]:
    """All steps when there are at most n, else the n with the largest values."""
    if len(values) <= n:
        return set(values)
    return set(sorted(values, key=lambda s: -values[s])[:n])


def python_stacks(trace: RankTrace) -> bool:
    py = trace.python
    return bool(len(py)) and bool((~name_is(py["name"], GC_NAME)).any())


def div(a: float, b: float) -> float:
    return float(min(max(a / b, 0.0), 1.0)) if b > 0 else 0.0


def top_ops_union(trace: RankTrace, tids: np.ndarray) -> iv.Intervals:
    ops = trace.cpu_ops
    if not len(ops):
        return iv.EMPTY
    m = (ops["depth"].to_numpy() == 0) & on_tids(ops, tids)
    return iv.union(ops["ts"].to_numpy()[m], ops["end"].to_numpy()[m])


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


def memcpy_runtime(trace: RankTrace, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Copies of one kind (HtoD, DtoH, ...) that have a runtime call: (memcpy rows, runtime rows)."""
    mc, lk, rt = trace.memcpy, trace.links, trace.runtime
    if not len(mc) or not len(lk) or not len(rt):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    gi = lk["gpu_idx"].to_numpy()
    ri = lk["runtime_idx"].to_numpy()
    m = (lk["gpu_kind"] == "memcpy").to_numpy() & (ri >= 0) & (ri < len(rt)) & (gi >= 0) & (gi < len(mc))
    gi, ri = gi[m], ri[m]
    k = (mc["kind"] == kind).to_numpy()[gi]
    return gi[k], ri[k]


def lengths(starts: np.ndarray, ends: np.ndarray, s: iv.Intervals) -> np.ndarray:
    return iv.overlap_length(starts, ends, s)


# ---------------------------------------------------------------- dataloader


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


def _dataloader(ctx: RankContext, tids: np.ndarray, stacks: bool) -> list[Fact]:
    tr = ctx.trace
    ann = tr.annotations
    dl = ann[(ann["kind"] == "dataloader").to_numpy()]
    if not len(dl):
        return []
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

    # Python self time inside the iterator, by class
    py = tr.python
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

    # archive members and file opens inside the iterator (Python frames: with_stack=True)
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

    # host-to-device copies of each step: the host time of the calls that issued them is what the
    # loop waits for ("fetching"); their device time is reported beside it
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

    py_in = np.clip(po_in - ops_in, 0.0, None)
    untraced = np.clip(wait - po_in, 0.0, None)
    untraced_multi = np.clip(m_len - m_po, 0.0, None)
    reading = np.minimum(io_self, py_in)
    wait_py = np.minimum(wait_self, py_in - reading)
    processing = np.clip(ops_in - pin_in, 0.0, None) + (py_in - reading - wait_py)
    worker_wait = np.minimum(untraced_multi, untraced) + wait_py
    unattributed = np.clip(untraced - untraced_multi, 0.0, None)
    fetching = pin_in + h2d_host

    def make(idx, step: int | None, iterator: str, calls: int, ranges, top) -> DataLoaderWait:
        def s(a: np.ndarray) -> float:
            return float(a[idx].sum())

        comp = {"processing": s(processing), "reading": s(reading), "fetching": s(fetching),
                "worker_wait": s(worker_wait), "unattributed": s(unattributed)}  # fmt: skip
        total = sum(comp.values())
        best = max(comp, key=comp.get)
        cls = "undetermined" if total <= 0 or best == "unattributed" else best
        w_us, step_us = s(wait), float((we - ws)[idx].sum())
        cp_total = cp_loader = None
        for i in np.atleast_1d(np.arange(len(steps))[idx]):
            t, l_ = _critical_path_share(ctx, int(steps[i]), loader)
            if t is not None:
                cp_total = (cp_total or 0.0) + t
                cp_loader = (cp_loader or 0.0) + l_
        return DataLoaderWait(
            rank=tr.rank, step=step, iterator=iterator, calls_count=calls,
            wait_us=w_us, step_us=step_us, step_share_ratio=div(w_us, step_us),
            critical_path_us=cp_total, critical_path_loader_us=cp_loader,
            critical_path_share_ratio=div(cp_loader, cp_total) if cp_total is not None else None,
            cpu_ops_us=s(ops_in), python_us=s(py_in), untraced_us=s(untraced),
            cpu_ops_ratio=div(s(ops_in), w_us), python_ratio=div(s(py_in), w_us), untraced_ratio=div(s(untraced), w_us),
            python_stacks=stacks, h2d_device_us=s(h2d_dev),
            processing_us=comp["processing"], reading_us=comp["reading"], fetching_us=comp["fetching"],
            worker_wait_us=comp["worker_wait"], unattributed_us=comp["unattributed"], data_time_us=total,
            data_share_ratio=div(total, step_us), fetching_ratio=div(comp["fetching"], step_us),
            classification=cls, classification_ratio=div(comp[best], total) if cls != "undetermined" else div(comp["unattributed"], total),
            top_python=top,
            archive_us=s(archive), archive_ratio=div(s(archive), w_us), file_opens_count=int(s(opens)),
            opens_per_call=s(opens) / calls if calls else 0.0, open_us=s(open_t),
            open_ratio=div(s(open_t), w_us), decode_us=s(decode), decode_ratio=div(s(decode), w_us),
            evidence=Evidence(
                time_ranges_us=ranges,
                events=sorted({str(n) for n in dl["name"].to_numpy()[np.isin(step_of_call, steps[idx])]})[:5],
                counts={"dataloader_annotations": calls, "pin_memory_ops": int(np.isin(ctx.step_of(PIN[0]), steps[idx]).sum())},
                note="wait = union of __next__ annotations in the step; processing = cpu ops (w/o pin_memory) + Python "
                     "time not in I/O or queue-wait functions; reading = self time of Python I/O calls; fetching = "
                     "host time of the HtoD copy calls in the step + pin_memory; worker_wait = untraced/queue-wait time in a "
                     "multi-process iterator; unattributed = untraced time in a single-process iterator",
            ),
        )  # fmt: skip

    register(ctx, WhatIfSet.of_intervals("dataloader", "the DataLoader's next() on the host (its annotation)",
                                         dl["tid"].to_numpy(np.int64), dts, dend))  # fmt: skip
    facts: list[Fact] = []
    present = {int(steps[i]): float(wait[i]) for i in range(len(steps)) if wait[i] > 0}
    keep = pick_steps(present)
    for i, step in enumerate(steps):
        if int(step) not in keep:
            continue
        sel = step_of_call == step
        k = set(kinds[sel]) or {"other"}
        rng = [(float(a), float(b)) for a, b in zip(*iv.clip(loader, ws[i], we[i]))][:5]
        facts.append(
            make(np.array([i]), int(step), k.pop() if len(k) == 1 else "mixed", int(sel.sum()), rng, [])
        )
    if present:
        inwin = step_of_call >= 0
        k = set(kinds[inwin])
        longest = np.argsort(-(dend - dts)[inwin])[:5]
        rng = [(float(dts[inwin][j]), float(dend[inwin][j])) for j in longest]
        facts.append(
            make(
                np.arange(len(steps)),
                None,
                k.pop() if len(k) == 1 else "mixed",
                int(inwin.sum()),
                rng,
                top_py,
            )
        )
    return facts


# ---------------------------------------------------------------- untraced host time


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


def _untraced(ctx: RankContext, tids: np.ndarray, stacks: bool) -> list[Fact]:
    tr = ctx.trace
    ops, ann, py = tr.cpu_ops, tr.annotations, tr.python
    if not len(ops) and not len(ann) and not len(py):
        return []
    # covering events: top-level cpu ops and non-step annotations on the host threads
    om = (ops["depth"].to_numpy() == 0) & on_tids(ops, tids) if len(ops) else np.zeros(0, bool)
    am = on_tids(ann, tids) & (ann["kind"] != "step").to_numpy() if len(ann) else np.zeros(0, bool)
    # CPU training with gloo: the driving thread waits for a gloo collective at work on gloo's
    # threads (host_sets.gloo_waits); those stretches cover host time like an annotation of its own
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
    M = iv.union(py["ts"].to_numpy()[mm], py["end"].to_numpy()[mm]) if len(py) else iv.EMPTY
    pm = gm | mm  # Python frames that cover host time like an operator
    c_ts = np.concatenate([ops["ts"].to_numpy()[om], ann["ts"].to_numpy()[am], py["ts"].to_numpy()[pm]])
    c_end = np.concatenate([ops["end"].to_numpy()[om], ann["end"].to_numpy()[am], py["end"].to_numpy()[pm]])
    c_src = np.concatenate([np.zeros(int(om.sum()), np.int8), np.ones(int(am.sum()), np.int8),
                            np.full(int(pm.sum()), 2, np.int8)])  # fmt: skip
    c_row = np.concatenate([np.flatnonzero(om), np.flatnonzero(am), np.flatnonzero(pm)])
    cover = iv.union(c_ts, c_end)
    by_end = np.argsort(c_end, kind="stable")
    by_ts = np.argsort(c_ts, kind="stable")
    end_sorted, ts_sorted = c_end[by_end], c_ts[by_ts]
    pmask = on_tids(py, tids) if len(py) else np.zeros(0, bool)
    P = iv.union(py["ts"].to_numpy()[pmask], py["end"].to_numpy()[pmask]) if len(py) else iv.EMPTY
    py_ts = py["ts"].to_numpy()[pmask] if len(py) else np.zeros(0)
    py_end = py["end"].to_numpy()[pmask] if len(py) else np.zeros(0)
    py_names = py["name"].to_numpy()[pmask] if len(py) else np.zeros(0, dtype=object)
    io_mask = pmask & name_mask(py["name"], PYTHON_IO_RE) if len(py) else np.zeros(0, bool)
    P_io = iv.union(py["ts"].to_numpy()[io_mask], py["end"].to_numpy()[io_mask]) if len(py) else iv.EMPTY
    pre_mask = pmask & name_mask(py["name"], PREPROCESS_RE) if len(py) else np.zeros(0, bool)
    P_pre = iv.union(py["ts"].to_numpy()[pre_mask], py["end"].to_numpy()[pre_mask]) if len(py) else iv.EMPTY

    def label(j: int) -> str:
        src, row = c_src[j], c_row[j]
        return str((ops, ann, py)[src]["name"].iat[row])

    def around(a: float, b: float) -> tuple[str | None, str | None]:
        i = np.searchsorted(end_sorted, a, side="right") - 1
        before = label(by_end[i]) if i >= 0 and abs(end_sorted[i] - a) < 1e-6 else None
        k = np.searchsorted(ts_sorted, b, side="left")
        after = label(by_ts[k]) if k < len(by_ts) and abs(ts_sorted[k] - b) < 1e-6 else None
        return before, after

    frames = _PauseFrames(py[pmask & ~gm & ~mm & ~io_mask]) if len(py) and (pmask & ~gm & ~mm).any() else None
    hs, he = host_window_arrays(ctx)
    rows = []
    gap_s: list[np.ndarray] = []
    gap_e: list[np.ndarray] = []
    for i, w in enumerate(ctx.windows):
        a, b = hs[i], he[i]
        if b <= a:
            continue
        cs, ce = iv.clip(cover, a, b)
        gs = np.concatenate([[a], ce])
        ge = np.concatenate([cs, [b]])
        keep = ge > gs
        gs, ge = gs[keep], ge[keep]
        glen = ge - gs
        gap_s.append(gs)
        gap_e.append(ge)
        py_part = iv.overlap_length(gs, ge, P) if len(gs) else np.zeros(0)
        io_part = iv.overlap_length(gs, ge, P_io) if len(gs) else np.zeros(0)
        pre_part = iv.overlap_length(gs, ge, P_pre) if len(gs) and len(P_pre[0]) else np.zeros(len(gs))
        top = np.argsort(-glen, kind="stable")[:TOP_GAPS]
        gaps = []
        for j in top:
            before, after = around(gs[j], ge[j])
            gaps.append(HostGap(start_us=float(gs[j]), end_us=float(ge[j]), duration_us=float(glen[j]), before=before,
                                after=after, python_function=_gap_python(py_ts, py_end, py_names, gs[j], ge[j], py_part[j]),
                                untraced_us=float(glen[j] - py_part[j])))  # fmt: skip
        large = glen >= LARGE_GAP_US
        pauses = _irregular_pauses(gs[large], ge[large], frames) if frames is not None else []
        mon_s, mon_e = iv.clip(M, a, b)
        rows.append({"step": w.step, "window": b - a, "step_us": w.duration_us, "outside": float(glen.sum()), "py": float(py_part.sum()),
                     "io": float(io_part.sum()), "pre": float(pre_part.sum()), "mon": float((mon_e - mon_s).sum()),
                     "n": len(glen), "nl": int(large.sum()), "ll": float(glen[large].sum()), "gaps": gaps,
                     "pauses": pauses})  # fmt: skip
    if not rows:
        return []
    _register_gaps(ctx, np.concatenate(gap_s), np.concatenate(gap_e), P_io, P_pre)
    pre_frames = _outer_frames(py, pre_mask) if pre_mask.any() else []
    pz = [p for r in rows for p in r["pauses"]]
    if pz and (tid := main_tid(ctx.trace)) is not None:
        register(ctx, WhatIfSet.of_intervals("python_pauses", "gaps where ordinary Python code paused for milliseconds",
                                             tid, [p[2] for p in pz], [p[3] for p in pz]))  # fmt: skip

    def make(rs: list[dict], step: int | None, gaps: list[HostGap]) -> UntracedHostTime:
        win = sum(r["window"] for r in rs)
        out = sum(r["outside"] for r in rs)
        pyt = min(sum(r["py"] for r in rs), out)
        pio = min(sum(r["io"] for r in rs), pyt)
        n_io, excess, blocking = _blocking_io(rs, pio) if step is None else (0, None, pio)
        pre = min(sum(r["pre"] for r in rs), pyt)
        return UntracedHostTime(
            rank=tr.rank, step=step, window_us=win, outside_ops_us=out, python_us=pyt, untraced_us=out - pyt,
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
                counts={"host_threads": len(tids), "cpu_ops": int(om.sum()), "annotations": int(am.sum()),
                        "python_functions": int(pmask.sum())},
                note=f"host threads {tids.tolist()[:6]}; outside_ops = host window minus top-level cpu ops and "
                     "non-step user annotations; python = part of it under python_function events",
            ),
        )  # fmt: skip

    keep = pick_steps({r["step"]: r["outside"] - r["py"] for r in rows})
    facts: list[Fact] = [make([r], r["step"], r["gaps"]) for r in rows if r["step"] in keep]
    allgaps = sorted((g for r in rows for g in r["gaps"]), key=lambda g: -g.duration_us)[:TOP_GAPS]
    facts.append(make(rows, None, allgaps))
    return facts


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


def outermost_frames(py: pd.DataFrame, m: np.ndarray) -> np.ndarray:
    """Rows of ``m`` with no ancestor in ``m`` (Python parent links)."""
    pid = pd.Series(np.arange(len(py)), index=py["py_id"].to_numpy())
    pid = pid[~pid.index.duplicated(keep="first")]
    prow = pd.Series(py["parent_id"].to_numpy()).map(pid).fillna(-1).to_numpy(np.int64)
    rows = np.flatnonzero(m)
    inner = np.zeros(len(rows), dtype=bool)
    cur = prow[rows]
    for _ in range(256):  # Python stacks are far shallower
        valid = cur >= 0
        if not valid.any():
            break
        inner |= valid & m[np.clip(cur, 0, None)]
        nxt = np.where(valid, prow[np.clip(cur, 0, None)], -1)
        nxt[nxt == cur] = -1  # a root frame that names itself as its parent
        cur = nxt
    return rows[~inner]


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


# ---------------------------------------------------------------- host-to-device copies


# pinned host-to-device copies reach about this share of the link's one-direction rate (pinned
# cudaMemcpy benchmarks: ~12-13 of 15.75 GB/s on Gen3, ~25 of 31.5 on Gen4, ~50-55 of 63 on Gen5)
PINNED_LINK_SHARE = 0.8


def _pinned_copy(ctx: RankContext, nbytes: int) -> float | None:
    """µs the bytes take from pinned memory on this rank's device (None: device or link unknown)."""
    dev = device_of_trace(ctx.trace)
    link = dev.host_link_bytes_per_s if dev is not None else None
    if not link:
        return None
    return nbytes / (PINNED_LINK_SHARE * link) * 1e6


def _h2d(ctx: RankContext) -> list[Fact]:
    tr = ctx.trace
    mc = tr.memcpy
    if not len(mc):
        return []
    hm = (mc["kind"] == "HtoD").to_numpy() & (ctx.step_of(mc["ts"].to_numpy()) >= 0)
    if not hm.any():
        return []
    idx = np.flatnonzero(hm)
    host = np.zeros(len(mc))
    mi, ri = memcpy_runtime(tr, "HtoD")
    host[mi] = tr.runtime["dur"].to_numpy()[ri]
    src = mc["src"].astype(str).to_numpy()[idx]
    kind = np.where(src == "Pageable", "pageable", np.where(src == "Pinned", "pinned", "other"))
    df = pd.DataFrame({"kind": kind, "dur": mc["dur"].to_numpy()[idx], "bytes": mc["bytes"].to_numpy()[idx],
                       "host": host[idx], "ts": mc["ts"].to_numpy()[idx], "end": mc["end"].to_numpy()[idx]})  # fmt: skip
    all_bytes = float(df["bytes"].clip(lower=0).sum())
    ws, we = window_arrays(ctx)
    kt = tr.kernels
    kernels = iv.union(kt["ts"].to_numpy(float), kt["end"].to_numpy(float)) if len(kt) else iv.EMPTY
    call_s, call_e = np.full(len(mc), np.nan), np.full(len(mc), np.nan)
    call_s[mi], call_e[mi] = tr.runtime["ts"].to_numpy()[ri], tr.runtime["end"].to_numpy()[ri]
    df["call_s"], df["call_e"] = call_s[idx], call_e[idx]
    facts: list[Fact] = []
    for k, g in df.groupby("kind", sort=True):
        has_call = np.isfinite(g["call_s"].to_numpy())
        held = iv.union(np.concatenate([g["ts"].to_numpy(float), g["call_s"].to_numpy()[has_call]]),
                        np.concatenate([g["end"].to_numpy(float), g["call_e"].to_numpy()[has_call]]))  # fmt: skip
        waited = float(lengths(ws, we, iv.subtract(held, kernels) if len(kernels[0]) else held).sum())
        window = float((we - ws).sum())
        if k == "pageable":
            rows = idx[kind == "pageable"]
            own = np.isin(mi, rows)  # the calls that issued them
            register(ctx, WhatIfSet.of_intervals(
                "h2d_pageable", "host-to-device copies from pageable memory, and the calls that issued them",
                tr.runtime["tid"].to_numpy()[ri[own]], call_s[mi[own]], call_e[mi[own]], memcpy=rows))  # fmt: skip
        b = int(g["bytes"].clip(lower=0).sum())
        dev = float(g["dur"].sum())
        longest = g.nlargest(3, "dur")
        pinned = _pinned_copy(ctx, b) if k == "pageable" else None
        facts.append(HostToDeviceCopies(
            rank=tr.rank, src=k, pageable=k == "pageable", copies_count=len(g), copied_bytes=b, device_us=dev,
            host_us=float(g["host"].sum()), bandwidth_gbps=(b / dev / 1e3) if dev > 0 else None,
            share_of_h2d_bytes_ratio=div(b, all_bytes), largest_bytes=int(g["bytes"].max()),
            window_us=window, waited_us=waited, waited_ratio=min(div(waited, window), 1.0),
            pinned_copy_us=pinned,
            pinned_removes_low_ratio=(min(max(1.0 - pinned / waited, 0.0), 1.0) if pinned is not None and waited > 0
                                      else None),
            pinned_removes_high_ratio=1.0 if pinned is not None and waited > 0 else None,
            evidence=Evidence(time_ranges_us=list(zip(longest["ts"].astype(float), longest["end"].astype(float))),
                              events=[f"Memcpy HtoD ({ {'pageable': 'Pageable', 'pinned': 'Pinned'}.get(k, 'Host')} -> Device)"],
                              counts={"memcpy": len(g)},
                              note="bandwidth = bytes / summed device duration (1 GB/s = 1e3 bytes/µs); waited = "
                                   "copies and their calls, minus kernel time, within the step windows"),
        ))  # fmt: skip
    return facts


# ---------------------------------------------------------------- entry point


def per_rank(ctx: RankContext) -> list[Fact]:
    if not ctx.windows:
        return []
    tids = host_tids(ctx.trace)
    stacks = python_stacks(ctx.trace)
    facts: list[Fact] = []
    facts.extend(_dataloader(ctx, tids, stacks))
    facts.extend(_untraced(ctx, tids, stacks))
    facts.extend(_h2d(ctx))
    return facts
