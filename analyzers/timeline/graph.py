"""The dependency graph's vocabulary: node categories, the ``Graph`` a rank's trace becomes
(analyzers/timeline/graph_build.py builds it, docs/analysis/critical_path.md describes it), the
sortable (lane, time) keys and the shared name table its builders use, and the thread that
drives the steps."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..context import RankContext

CATEGORIES = (
    "cpu_op", "host_gap", "launch", "runtime", "sync_wait", "kernel", "communication", "memcpy", "device_idle"
)
CPU_OP, HOST_GAP, LAUNCH, RUNTIME, SYNC_WAIT, KERNEL, COMM, MEMCPY, DEVICE_IDLE = range(len(CATEGORIES))
HOST_CATS = [CPU_OP, HOST_GAP, LAUNCH, RUNTIME]
DEVICE_CATS = [KERNEL, COMM, MEMCPY]
UNTRACED = "(untraced host time)"


@dataclass
class Graph:
    start: np.ndarray
    end: np.ndarray
    cat: np.ndarray  # int8 index into CATEGORIES
    name: np.ndarray  # int64 index into names
    op: np.ndarray  # int64 index into names: enclosing / launching top-level op (0 = "")
    inst: np.ndarray  # int64 instance id (the op group for host segments under an op, else unique)
    tid: np.ndarray  # int64 host thread, -1 for device nodes
    member_ts: np.ndarray  # time deciding step membership (segment start, launch start, own start)
    is_gap: np.ndarray  # bool
    pred: np.ndarray  # int64 chosen predecessor, -1 when none
    n_host: int
    names: list[str]
    edges: dict[str, int]
    # every candidate predecessor, kept for the what-if simulation (analyzers/whatif/replay.py); -1 = none
    lane_prev: np.ndarray  # thread order (host) / stream order (device)
    launch: np.ndarray  # device node <- host segment holding the start of its launch call
    join: np.ndarray  # host gap or thread's first segment <- another thread's segment
    wait: np.ndarray  # host segment ending a sync <- device node; device node <- other stream's node
    launch_ts: np.ndarray  # start of the launching runtime call (device nodes; NaN when unlinked)


class Keyer:
    """Packs (lane code, time) into one sortable float so per-lane searches vectorise."""

    def __init__(self, times: list[np.ndarray]):
        vals = [t for t in times if len(t)]
        if vals:
            allt = np.concatenate(vals)
            self.t0 = float(allt.min())
            self.span = float(allt.max()) - self.t0 + 10.0
        else:
            self.t0, self.span = 0.0, 10.0

    def __call__(self, code, t):
        return np.asarray(code, dtype=np.float64) * self.span + (np.asarray(t, dtype=np.float64) - self.t0)


class Names:
    """One deduplicated string table for every node name; categorical codes map into it."""

    def __init__(self):
        self.names: list[str] = ["", UNTRACED]
        self.ids: dict[str, int] = {"": 0, UNTRACED: 1}

    def id(self, name: str) -> int:
        i = self.ids.get(name)
        if i is None:
            i = self.ids[name] = len(self.names)
            self.names.append(name)
        return i

    def add(self, col: pd.Series) -> np.ndarray:
        if not len(col):
            return np.zeros(0, dtype=np.int64)
        if not isinstance(col.dtype, pd.CategoricalDtype):
            col = col.astype("category")
        table = np.array([self.id(str(c)) for c in col.cat.categories] + [0], dtype=np.int64)
        return table[col.cat.codes.to_numpy()]  # code -1 (missing) -> table[-1] = ""


def main_tid(ctx: RankContext) -> int:
    """The thread that drives the steps: ProfilerStep annotations' thread, else the busiest."""
    tr = ctx.trace
    ann = tr.annotations
    if len(ann):
        st = ann[ann["kind"] == "step"]
        if len(st):
            return int(st["tid"].mode().iat[0])
    ops = tr.cpu_ops
    if len(ops):
        top = ops["depth"].to_numpy() == 0
        if top.any():
            u, inv = np.unique(ops["tid"].to_numpy(np.int64)[top], return_inverse=True)
            return int(u[np.argmax(np.bincount(inv, weights=ops["dur"].to_numpy(np.float64)[top]))])
    if len(tr.runtime):
        return int(tr.runtime["tid"].value_counts().idxmax())
    return -1


def last_le(sorted_key: np.ndarray, q: np.ndarray) -> np.ndarray:
    return np.searchsorted(sorted_key, q, side="right") - 1
