"""Critical path: the chain of host work, launches, device work and waits that decided when each
step ended (docs/analysis/critical_path.md).

One dependency graph per rank, built with vectorised joins (analyzers/timeline/graph_build.py; the
graph's vocabulary in graph.py, host nodes in graph_host.py, device nodes and their edges in
graph_device.py):

* host nodes: each CPU thread's timeline cut into consecutive segments -- top-level CPU ops
  (depth 0), the CUDA/HIP runtime calls inside or between them (nested calls merged into the
  outermost), and the gaps between them (untraced host time, split where user annotations start
  or end and named after the innermost one). Edge: thread order.
* device nodes: kernels and memcpy/memset. Edges: stream order; launch -> activity
  (``trace.links``); cross-stream event waits (``Stream Wait Event`` cuda_sync rows; without
  them, an activity that starts right after one on another stream of its device ended).
* sync edges: a synchronising call (runtime kind ``sync``, or a call with a ``Stream Sync`` /
  ``Context Sync`` / ``Event Sync`` cuda_sync row) depends on the latest device activity that
  ended before the call ended on the waited stream(s) (for an event sync: the last activity
  enqueued on the recorded stream before the event was recorded). A blocking memcpy/memset call
  is split in a launch part and a waiting part; the waiting part depends on its copy.
* join edges: a host gap depends on a CPU op of another thread that ended inside the gap, close
  to its end (an untraced wake-up: autograd engine fork/join, data hand-off).

Every node's predecessor is the candidate that finished last (the one that released it), picked
for all nodes at once; per step, the predecessor chain is followed backwards (pointer doubling)
from the step's last-ending event (on the main thread, or device work launched in the step)
until it leaves the window. The path's segments tile time: a node is on the path from the moment
its releaser finished (or its own start) until it released the next node; a device activity that
starts after its releaser finished adds a ``device_idle`` piece, a host node a ``host_gap`` one.

Hands on ``ctx.shared["critical_path"][step]``: a DataFrame of the path's segments in time
order, columns ``start_us, end_us`` (float µs), ``category`` (categorical, one of
``CATEGORIES``), ``name`` (categorical: the op / runtime call / kernel / annotation name, ""
for device idle), ``op`` (categorical: the enclosing top-level CPU op of a host segment, the
launching op of a device segment, "" when none).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.critical_path import CriticalPath, CriticalPathOp, CriticalPathStep

from ..context import RankContext
from .graph import (CATEGORIES, COMM, CPU_OP, DEVICE_CATS, DEVICE_IDLE, HOST_CATS, HOST_GAP, LAUNCH, RUNTIME,
                    SYNC_WAIT, Graph, main_tid)  # fmt: skip
from .graph_build import build_graph

TOP_N = 10
_CAT_DTYPE = pd.CategoricalDtype(list(CATEGORIES))
_IS_DEVICE = np.zeros(len(CATEGORIES), dtype=bool)
_IS_DEVICE[DEVICE_CATS] = True
_OP_LABELLED = np.zeros(len(CATEGORIES), dtype=bool)  # host categories labelled by their enclosing op
_OP_LABELLED[[CPU_OP, LAUNCH, RUNTIME, SYNC_WAIT, COMM]] = True


class Walker:
    """Follows chosen predecessors backwards by pointer doubling: jump tables P_k (the 2^k-th
    predecessor of every node) are built on demand, and the path from a root is grown a power
    of two at a time, so a walk costs O(log length) array operations instead of a Python loop."""

    def __init__(self, g: Graph):
        n = len(g.pred)
        self.n = n
        p = np.where(g.pred >= 0, g.pred, n)
        self.jumps = [np.append(p, n)]  # sentinel n: no predecessor, its own predecessor
        self.end = np.append(g.end, -np.inf)

    def _jump(self, k: int) -> np.ndarray:
        while len(self.jumps) <= k:
            j = self.jumps[-1]
            self.jumps.append(j[j])
        return self.jumps[k]

    def walk(self, root: int, lo: float) -> np.ndarray:
        """Node indexes from root backwards, while the predecessors end after lo. A cycle
        (possible only with clock skew) is cut at the first repeated node."""
        nodes = np.array([root], dtype=np.int64)
        k = 0
        while True:
            tail = nodes[1:]
            if (tail == self.n).any() or (self.end[tail] <= lo).any():
                break
            if len(nodes) > self.n:  # longer than the graph: there is a cycle
                nodes = nodes[: len(np.unique(nodes))]  # first occurrences form a prefix
                break
            nodes = np.concatenate([nodes, self._jump(k)[nodes]])
            k += 1
        bad = (nodes == self.n) | (self.end[nodes] <= lo)
        bad[0] = False
        if bad.any():
            nodes = nodes[: int(np.argmax(bad))]
        return nodes


@dataclass
class Segments:
    start: np.ndarray
    end: np.ndarray
    cat: np.ndarray
    name: np.ndarray  # name ids
    op: np.ndarray  # name ids
    inst: np.ndarray
    host: np.ndarray  # bool: a host-thread segment (labelled by its enclosing op in top_ops)
    node: np.ndarray  # graph node of the segment; -1 for the idle / gap pieces between nodes

    def __len__(self) -> int:
        return len(self.start)

    @property
    def length(self) -> np.ndarray:
        return self.end - self.start

    @staticmethod
    def concat(parts: list[Segments]) -> Segments:
        fields = ("start", "end", "cat", "name", "op", "inst", "host", "node")
        return Segments(*(np.concatenate([getattr(p, f) for p in parts]) for f in fields))

    def frame(self, names: pd.CategoricalDtype) -> pd.DataFrame:
        return pd.DataFrame({
            "start_us": self.start,
            "end_us": self.end,
            "category": pd.Categorical.from_codes(self.cat, dtype=_CAT_DTYPE),
            "name": pd.Categorical.from_codes(self.name, dtype=names),
            "op": pd.Categorical.from_codes(self.op, dtype=names),
        })  # fmt: skip


def path_segments(g: Graph, path: np.ndarray, lo: float) -> Segments:
    """Segments of a path (root first) in time order: each node from its releaser's end (or its
    own start) to where it released the next node; device_idle / host_gap pieces where a node
    started after its releaser ended. Before a first node without predecessor nothing is known:
    left uncovered."""
    E = np.minimum.accumulate(g.end[path])  # hand-off times, from the root backwards
    nxt = np.empty_like(E)  # when each node's releaser finished
    nxt[:-1] = E[1:]
    nxt[-1] = lo
    np.maximum(nxt, lo, out=nxt)
    st = g.start[path]
    gap = nxt < st
    gap[-1] &= bool(g.pred[path[-1]] >= 0)  # released before the window: idle from its start
    # node segments in time order, then the idle pieces inserted before their nodes
    rev = path[::-1]
    E, nxt, st, gap = E[::-1], nxt[::-1], st[::-1], gap[::-1]
    s, e = np.minimum(np.maximum(st, nxt), E), E
    cat, nm, op, inst = g.cat[rev], g.name[rev], g.op[rev], g.inst[rev]
    host = rev < g.n_host
    node = rev.copy()
    gi = np.flatnonzero(gap)
    if len(gi):
        dev = _IS_DEVICE[cat[gi]]
        s = np.insert(s, gi, nxt[gi])
        e = np.insert(e, gi, np.minimum(st[gi], E[gi]))
        cat = np.insert(cat, gi, np.where(dev, DEVICE_IDLE, HOST_GAP).astype(np.int8))
        nm = np.insert(nm, gi, np.where(dev, 0, 1))
        op = np.insert(op, gi, op[gi])
        inst = np.insert(inst, gi, -1)
        host = np.insert(host, gi, ~dev)
        node = np.insert(node, gi, -1)
    keep = e > s
    return Segments(s[keep], e[keep], cat[keep], nm[keep], op[keep], inst[keep], host[keep], node[keep])


def _shares(seg: Segments) -> dict:
    by = np.bincount(seg.cat, weights=seg.length, minlength=len(CATEGORIES)) if len(seg) else np.zeros(9)
    total = float(by.sum())

    def r(x: float) -> float:
        return min(1.0, max(0.0, x / total)) if total > 0 else 0.0

    out: dict = {"path_length_us": total, "segments_count": int(len(seg))}
    for i, c in enumerate(CATEGORIES):
        out[f"{c}_us"] = float(by[i])
        out[f"{c}_ratio"] = r(float(by[i]))
    out["host_ratio"] = r(float(by[HOST_CATS].sum()))
    out["device_ratio"] = r(float(by[DEVICE_CATS].sum()))
    out["dominant_category"] = CATEGORIES[int(np.argmax(by))] if total > 0 else None
    return out


def _top_ops(seg: Segments, names: list[str], total: float) -> list[CriticalPathOp]:
    """Per (category, label): label = enclosing top-level op for host segments under one, else
    the segment's own name. Device idle is left out (it has no operator)."""
    m = seg.cat != DEVICE_IDLE
    if not m.any() or total <= 0:
        return []
    cat, ln, inst = seg.cat[m].astype(np.int64), seg.length[m], seg.inst[m]
    host_named = _OP_LABELLED[cat] & seg.host[m] & (seg.op[m] > 0)
    label = np.where(host_named, seg.op[m], seg.name[m])
    k = label * len(CATEGORIES) + cat  # dense small ints: sum with bincount, no sort
    t_all = np.bincount(k, weights=ln)
    nz = np.flatnonzero(t_all)
    top = nz[np.argsort(-t_all[nz], kind="stable")[:TOP_N]]
    out = []
    for kk in top:  # at most 10: distinct instances among this label's segments
        ii = np.sort(inst[k == kk])
        neg = int(np.searchsorted(ii, 0))  # unnamed pieces (-1) count once each
        n = neg + (int(np.count_nonzero(np.diff(ii[neg:]))) + 1 if len(ii) > neg else 0)
        out.append(CriticalPathOp(
            name=names[int(kk // len(CATEGORIES))],
            category=CATEGORIES[int(kk % len(CATEGORIES))],
            time_us=float(t_all[kk]),
            share_ratio=min(1.0, float(t_all[kk]) / total),
            instances_count=n,
        ))  # fmt: skip
    return out


def _evidence(seg: Segments, top: list[CriticalPathOp], edges: dict[str, int], note: str) -> Evidence:
    ranges: list[tuple[float, float]] = []
    counts: dict[str, int] = {}
    if len(seg):
        ranges.append((float(seg.start.min()), float(seg.end.max())))
        ln = seg.length
        k = min(3, len(ln))
        longest = np.argpartition(-ln, k - 1)[:k]
        longest = longest[np.argsort(-ln[longest], kind="stable")]
        ranges.extend((float(seg.start[i]), float(seg.end[i])) for i in longest)
        for c, n in enumerate(np.bincount(seg.cat, minlength=len(CATEGORIES))):
            if n:
                counts[f"path_{CATEGORIES[c]}_segments"] = int(n)
    counts.update({f"graph_{k}_edges": v for k, v in edges.items()})
    events = list(dict.fromkeys(o.name for o in top))[:5]
    return Evidence(time_ranges_us=ranges, events=events, counts=counts, note=note)


NOTE = ("backward walk from the step's last-ending event (main thread, or device work launched in the step); "
        "each node's predecessor is the thread-order / stream-order / launch / sync / event-wait / join "
        "candidate that ended last; segments tile the path; share = category time / path length")  # fmt: skip


def per_rank(ctx: RankContext) -> list[Fact]:
    shared: dict[int, pd.DataFrame] = {}
    ctx.shared["critical_path"] = shared
    if not ctx.windows:
        return []
    g = build_graph(ctx)
    N = len(g.start)
    if not N:
        return []
    mt = main_tid(ctx)
    ctx.shared["graph"] = g
    ctx.shared["main_tid"] = mt
    path_nodes: dict[int, Segments] = {}
    ctx.shared["critical_segments"] = path_nodes
    nS = g.n_host
    eligible = np.ones(N, dtype=bool)
    # the driving thread's segments, its host time between operators included (cut at step starts)
    eligible[:nS] = g.tid[:nS] == mt
    if not eligible[:nS].any():
        eligible[:nS] = ~g.is_gap[:nS]  # no main thread found: any thread's traced events
    el = np.flatnonzero(eligible)
    el_ts, el_end = g.member_ts[el], g.end[el]
    walker = Walker(g)
    names_dtype = pd.CategoricalDtype(g.names)
    facts: list[Fact] = []
    parts: list[Segments] = []
    tot_window = tot_over = tot_inside = 0.0
    for w in ctx.windows:
        m = (el_ts >= w.start_us) & (el_ts < w.end_us)
        if not m.any():
            continue
        root = int(el[m][np.argmax(el_end[m])])
        seg = path_segments(g, walker.walk(root, w.start_us), w.start_us)
        if not len(seg):
            continue
        shared[w.step] = seg.frame(names_dtype)
        path_nodes[w.step] = seg
        vals = _shares(seg)
        top = _top_ops(seg, g.names, vals["path_length_us"])
        p_end = float(seg.end[-1])
        over = max(0.0, p_end - w.end_us)
        inside = np.minimum(seg.end, w.end_us) - np.maximum(seg.start, w.start_us)
        inside = float(np.clip(inside, 0, None).sum())
        in_ratio = min(1.0, inside / w.duration_us) if w.duration_us > 0 else 0.0
        facts.append(CriticalPathStep(
            rank=ctx.rank, step=w.step, start_us=w.start_us, end_us=w.end_us,
            path_start_us=float(seg.start[0]), path_end_us=p_end, step_duration_us=w.duration_us,
            path_in_step_ratio=in_ratio, overrun_us=over,
            top_ops=top, evidence=_evidence(seg, top, g.edges, NOTE), **vals,
        ))  # fmt: skip
        parts.append(seg)
        tot_window += w.duration_us
        tot_over += over
        tot_inside += inside
    if not parts:
        return facts
    seg = Segments.concat(parts)
    vals = _shares(seg)
    top = _top_ops(seg, g.names, vals["path_length_us"])
    facts.append(CriticalPath(
        rank=ctx.rank, step=None, steps_count=len(parts), step_duration_us=tot_window, overrun_us=tot_over,
        path_in_step_ratio=min(1.0, tot_inside / tot_window) if tot_window > 0 else 0.0,
        top_ops=top, evidence=_evidence(seg, top, g.edges, NOTE + "; summed over the analysed steps"), **vals,
    ))  # fmt: skip
    return facts
