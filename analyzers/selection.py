"""Selecting a rank's events, shared by the analyzers: rows whose name matches a pattern, the
training loop's thread and the host threads, the step windows (their host side) and a step's
position among them, the steps that get a fact of their own, copies with the runtime calls that
issued them, the outermost of a set of Python frames; and ``div``, the clamped ratio of every
fact's ``*_ratio`` fields."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from hermes_kb.trace.bundle import RankTrace

from . import intervals as iv
from .context import RankContext

MAX_STEP_FACTS = 8  # per-step facts per kind; beyond that only the steps with the largest values
GC_NAME = "Python GC"


def union_of(df: pd.DataFrame, mask: np.ndarray) -> iv.Intervals:
    """The union of the [ts, end) intervals of the rows of ``df`` that ``mask`` selects."""
    if not len(df) or not mask.any():
        return iv.EMPTY
    return iv.union(df["ts"].to_numpy(dtype=np.float64)[mask], df["end"].to_numpy(dtype=np.float64)[mask])


# the operators and spans that are collectives themselves (issued, or run on gloo's threads)
COLLECTIVE_OP = re.compile(r"^(?:c10d::|record_param_comms$|gloo:|nccl:|hccl:)")


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
