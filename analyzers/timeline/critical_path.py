"""Critical path: the chain of host work, launches, device work and waits that decided when each
step ended (docs/analysis/critical_path.md).

One dependency graph per rank, built with vectorised joins:

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

from .. import intervals as iv
from ..context import RankContext
from ..host.syncs import SYNC_OPS
from .overlap import gloo_waits

CATEGORIES = (
    "cpu_op", "host_gap", "launch", "runtime", "sync_wait", "kernel", "communication", "memcpy", "device_idle"
)
CPU_OP, HOST_GAP, LAUNCH, RUNTIME, SYNC_WAIT, KERNEL, COMM, MEMCPY, DEVICE_IDLE = range(len(CATEGORIES))
HOST_CATS = [CPU_OP, HOST_GAP, LAUNCH, RUNTIME]
DEVICE_CATS = [KERNEL, COMM, MEMCPY]
TOP_N = 10
UNTRACED = "(untraced host time)"
# a gap on one thread is joined to an op of another thread that ended at most this long before
# the gap's end (µs), or this share of the gap, whichever is larger
JOIN_TOL_US = 1000.0
JOIN_TOL_SHARE = 0.05
# without Stream Wait Event records, a device activity that starts at most this long (µs) after an
# activity on another stream of its device ended is taken to have waited for it (event wait)
DEVICE_JOIN_TOL_US = 50.0
# a launch call held back by a full launch queue (the host ran ahead of the device by the queue's
# depth) returns as soon as the running device activity ends and frees a slot: at least this long
# and this many times the median launch call, returning within QUEUE_FULL_TOL_US of the end of an
# activity that was already running when the call began
QUEUE_FULL_MIN_US = 50.0
QUEUE_FULL_FACTOR = 5.0
QUEUE_FULL_TOL_US = 30.0

# runtime kind -> category; nested calls take the strongest member (sync > launch > runtime)
_RT_CAT = {"sync": SYNC_WAIT, "launch": LAUNCH, "graph_launch": LAUNCH, "memcpy": LAUNCH, "memset": LAUNCH}
_PRIO = {RUNTIME: 1, LAUNCH: 2, SYNC_WAIT: 3}
_BLOCKING_KINDS = ("memcpy", "memset")
_JOINABLE = np.zeros(len(CATEGORIES), dtype=bool)
_JOINABLE[[CPU_OP, LAUNCH, SYNC_WAIT, COMM]] = True
_CAT_DTYPE = pd.CategoricalDtype(list(CATEGORIES))
_IS_DEVICE = np.zeros(len(CATEGORIES), dtype=bool)
_IS_DEVICE[DEVICE_CATS] = True
_OP_LABELLED = np.zeros(len(CATEGORIES), dtype=bool)  # host categories labelled by their enclosing op
_OP_LABELLED[[CPU_OP, LAUNCH, RUNTIME, SYNC_WAIT, COMM]] = True


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


class _Keyer:
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


class _Names:
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


def _group_nested(code: np.ndarray, ts: np.ndarray, end: np.ndarray, key: _Keyer):
    """Merge intervals that nest or overlap within a lane. Returns (row -> group, group's first
    row (the outermost unless two start together), group start, group end, group lane code);
    groups come out sorted by (lane, start)."""
    n = len(code)
    if not n:
        z = np.zeros(0, dtype=np.int64)
        return z, z, np.zeros(0), np.zeros(0), z
    order = np.argsort(key(code, ts), kind="stable")  # rows are nearly sorted already
    c, s, e = code[order], ts[order], end[order]
    ek = np.maximum.accumulate(key(c, e))  # running max end; lanes never mix (keys are lane-offset)
    new = np.ones(n, dtype=bool)
    new[1:] = (c[1:] != c[:-1]) | (key(c[1:], s[1:]) >= ek[:-1])
    gid = np.cumsum(new) - 1
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, n - 1)
    g_end = np.maximum(ek[last] - c[first] * key.span + key.t0, s[first])
    row_group = np.empty(n, dtype=np.int64)
    row_group[order] = gid
    return row_group, order[first], s[first], g_end, c[first]


def _innermost(starts_k: np.ndarray, ends_k: np.ndarray, q: np.ndarray) -> np.ndarray:
    """For intervals sorted by start (possibly nested), the latest-starting one containing each
    query key, -1 when none: binary lifting over a sparse table of running maxima of the ends."""
    n = len(starts_k)
    if not n or not len(q):
        return np.full(len(q), -1, dtype=np.int64)
    levels = [ends_k]  # levels[l][i] = max(ends[i - 2^l + 1 .. i]) (clipped at 0)
    w = 1
    while w < n:
        prev = levels[-1]
        cur = prev.copy()
        cur[w:] = np.maximum(prev[w:], prev[:-w])
        levels.append(cur)
        w *= 2
    pos = np.searchsorted(starts_k, q, side="right") - 1
    for lv in range(len(levels) - 1, -1, -1):
        ok = pos >= 0
        skip = ok & (levels[lv][np.clip(pos, 0, None)] <= q)
        pos = np.where(skip, pos - (1 << lv), pos)
    ok = (pos >= 0) & (ends_k[np.clip(pos, 0, None)] > q)
    return np.where(ok, pos, -1)


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


def _last_le(sorted_key: np.ndarray, q: np.ndarray) -> np.ndarray:
    return np.searchsorted(sorted_key, q, side="right") - 1


def build_graph(ctx: RankContext) -> Graph:
    tr = ctx.trace
    rt, kn, mc, links, coll = tr.runtime, tr.kernels, tr.memcpy, tr.links, tr.collectives
    edges = {"thread": 0, "stream": 0, "launch": 0, "sync": 0, "event_wait": 0, "device_join": 0, "join": 0,
             "blocking_op": 0, "host_release": 0}
    names = _Names()
    cpu = tr.cpu_ops
    top = cpu["depth"].to_numpy() == 0 if len(cpu) else np.zeros(0, dtype=bool)
    o_rows = np.flatnonzero(top)
    o_tid = cpu["tid"].to_numpy(np.int64)[top]
    rt_tid = rt["tid"].to_numpy(np.int64)
    tids = np.sort(pd.unique(np.concatenate([o_tid, rt_tid])))
    ann = tr.annotations
    if len(ann):
        am = ((ann["kind"] != "step").to_numpy() & np.isin(ann["tid"].to_numpy(np.int64), tids)
              & (ann["end"].to_numpy() > ann["ts"].to_numpy()))  # fmt: skip
    else:
        am = np.zeros(0, dtype=bool)
    a_tid = ann["tid"].to_numpy(np.int64)[am]
    a_s, a_e = ann["ts"].to_numpy(np.float64)[am], ann["end"].to_numpy(np.float64)[am]
    # CPU training with gloo: the driving thread's gaps while a gloo collective is at work are
    # waiting for it (overlap.gloo_waits): the collectives' stretches are laid on that thread as
    # annotations, and the gaps they name are communication
    mt0 = main_tid(ctx)
    (w_s, w_e), w_names = gloo_waits(tr, mt0) if mt0 in tids else (iv.EMPTY, [])
    n_ann = len(a_s)
    a_tid = np.concatenate([a_tid, np.full(len(w_s), mt0, dtype=np.int64)])
    a_s, a_e = np.concatenate([a_s, w_s]), np.concatenate([a_e, w_e])
    o_ts, o_end = cpu["ts"].to_numpy(np.float64)[top], cpu["end"].to_numpy(np.float64)[top]
    rt_ts, rt_end = rt["ts"].to_numpy(np.float64), rt["end"].to_numpy(np.float64)
    key = _Keyer([o_ts, o_end, rt_ts, rt_end, a_s, a_e])

    # ---- runtime calls: nested ones merged into the outermost ----------------------------------
    rt_code = np.searchsorted(tids, rt_tid)
    r_grp, r_rep, r_gs, r_ge, r_gc = _group_nested(rt_code, rt_ts, rt_end, key)
    nR = len(r_gs)
    rt_kind_codes = np.zeros(0, dtype=np.int64)
    row_cat = np.zeros(0, dtype=np.int8)
    rt_blocking = np.zeros(0, dtype=bool)
    if len(rt):
        kcat = rt["kind"].astype("category")
        kinds = [str(k) for k in kcat.cat.categories]
        rt_kind_codes = kcat.cat.codes.to_numpy().astype(np.int64)
        row_cat = np.array([_RT_CAT.get(k, RUNTIME) for k in kinds] + [RUNTIME], dtype=np.int8)[rt_kind_codes]
        rt_blocking = np.array([k in _BLOCKING_KINDS for k in kinds] + [False])[rt_kind_codes]
    prio_of_cat = np.zeros(len(CATEGORIES), dtype=np.int8)
    for c, p in _PRIO.items():
        prio_of_cat[c] = p
    g_prio = np.zeros(nR, dtype=np.int8)
    if nR:
        np.maximum.at(g_prio, r_grp, prio_of_cat[row_cat])
    g_cat = np.array([RUNTIME, RUNTIME, LAUNCH, SYNC_WAIT], dtype=np.int8)[g_prio]
    g_name = names.add(rt["name"])[r_rep] if nR else np.zeros(0, dtype=np.int64)
    g_sync = g_cat == SYNC_WAIT

    # ---- top-level ops ---------------------------------------------------------------------------
    op_code = np.searchsorted(tids, o_tid)
    o_grp, o_rep, o_gs, o_ge, o_gc = _group_nested(op_code, o_ts, o_end, key)
    nO = len(o_gs)
    o_name = names.add(cpu["name"])[o_rows[o_rep]] if nO else np.zeros(0, dtype=np.int64)
    o_comm = np.zeros(nO, dtype=bool)
    nK, nM = len(kn), len(mc)
    if nO and len(coll) and nK == 0:
        # CPU-only collectives (gloo): the top-level op holding record_param_comms is communication
        cidx = coll.loc[(coll["source"] == "cpu") & (coll["cpu_idx"] >= 0), "cpu_idx"].to_numpy(np.int64)
        if len(cidx):
            parent = cpu["parent"].to_numpy(np.int64)
            anc = cidx.copy()
            for _ in range(256):
                p = parent[anc]
                if not (p >= 0).any():
                    break
                anc = np.where(p >= 0, p, anc)
            pos = np.clip(np.searchsorted(o_rows, anc), 0, len(o_rows) - 1)
            hit = o_rows[pos] == anc
            o_comm[o_grp[pos[hit]]] = True

    # ---- links, and blocking memcpy/memset calls (split where their own copy starts) ------------
    d_start = np.concatenate([kn["ts"].to_numpy(np.float64), mc["ts"].to_numpy(np.float64)])
    d_end = np.concatenate([kn["end"].to_numpy(np.float64), mc["end"].to_numpy(np.float64)])
    nD = nK + nM
    d_dev = np.concatenate([kn["device"].to_numpy(np.int64), mc["device"].to_numpy(np.int64)])
    d_stream = np.concatenate([kn["stream"].to_numpy(np.int64), mc["stream"].to_numpy(np.int64)])
    d_stream_key = d_dev * (1 << 33) + d_stream
    stream_ids, d_scode = np.unique(d_stream_key, return_inverse=True)
    d_order = np.lexsort((d_end, d_start, d_scode))
    stream_prev = np.full(nD, -1, dtype=np.int64)
    if nD > 1:
        same = d_scode[d_order[1:]] == d_scode[d_order[:-1]]
        stream_prev[d_order[1:][same]] = d_order[:-1][same]
    edges["stream"] = int((stream_prev >= 0).sum())
    l_dev = l_grp = np.zeros(0, dtype=np.int64)
    if len(links) and nR and nD:
        lk = links[links["gpu_kind"].isin(("kernel", "memcpy"))]
        l_rt = lk["runtime_idx"].to_numpy(np.int64)
        l_dev = lk["gpu_idx"].to_numpy(np.int64) + np.where((lk["gpu_kind"] == "memcpy").to_numpy(), nK, 0)
        l_grp = r_grp[l_rt]
        blk = (rt_blocking[l_rt] & (d_end[l_dev] <= r_ge[l_grp]) & (d_start[l_dev] > r_gs[l_grp])
               & (d_start[l_dev] < r_ge[l_grp]))  # fmt: skip
    else:
        blk = np.zeros(0, dtype=bool)
    # The call enqueues its copy, then blocks. Split it where the copy could have started: when the
    # activity before it on its stream ended (if that was during the call: the stream, not the
    # call, held the copy back), else where the copy started (the call's own set-up held it back).
    split_t = np.full(nR, np.inf)
    if blk.any():
        bd, bg = l_dev[blk], l_grp[blk]
        sp = stream_prev[bd]
        ready = np.where(sp >= 0, d_end[np.clip(sp, 0, None)], -np.inf)
        at = np.where(ready > r_gs[bg], np.minimum(ready, d_start[bd]), d_start[bd])
        np.minimum.at(split_t, bg, at)
    blk_dev, blk_grp = l_dev[blk], l_grp[blk]
    has_split = np.isfinite(split_t)
    split_k = np.where(has_split, key(r_gc, np.where(has_split, split_t, 0.0)), np.inf)

    # ---- annotations (to split and name gaps) -----------------------------------------------------
    a_code = np.searchsorted(tids, a_tid)
    a_sk, a_ek = key(a_code, a_s), key(a_code, a_e)
    ao = np.lexsort((-a_ek, a_sk))
    a_sk, a_ek = a_sk[ao], a_ek[ao]
    a_name = (np.concatenate([names.add(ann["name"])[am] if n_ann else np.zeros(0, dtype=np.int64),
                              np.array([names.id(n) for n in w_names], dtype=np.int64)])[ao]
              if len(ao) else np.zeros(0, dtype=np.int64))  # fmt: skip
    a_comm = (np.arange(len(a_s)) >= n_ann)[ao]  # the gloo stretches

    # ---- elementary pieces of each thread's timeline, merged into segments ----------------------
    n_sp = int(has_split.sum())
    # the driving thread's time is cut at every step start, so that a stretch of host time at a
    # step's end (a log flush, a checkpoint) belongs to that step and not to the next one
    mt = main_tid(ctx)
    b_t = np.array([w.start_us for w in ctx.windows] + [ctx.windows[-1].cpu_end_us], dtype=np.float64) \
        if (mt in tids and ctx.windows) else np.zeros(0)  # fmt: skip
    b_code = np.full(len(b_t), int(np.searchsorted(tids, mt)) if len(b_t) else 0, dtype=np.int64)
    n_sp += len(b_t)
    p_code = np.concatenate([o_gc, o_gc, r_gc, r_gc, r_gc[has_split], b_code, a_code, a_code])
    p_t = np.concatenate([o_gs, o_ge, r_gs, r_ge, split_t[has_split], b_t, a_s, a_e])
    # +1 / -1 where a top-level op group (o_*) or runtime group (r_*) opens / closes, and the group
    # index at its opening: after sorting, a running sum says whether a group is open and a running
    # max which one (groups are disjoint per thread and numbered in key order)
    z_sp, z_a = np.zeros(n_sp, np.int64), np.zeros(2 * len(a_s), np.int64)
    o_d = np.concatenate([np.ones(nO, np.int64), -np.ones(nO, np.int64), np.zeros(2 * nR, np.int64), z_sp, z_a])
    r_d = np.concatenate([np.zeros(2 * nO, np.int64), np.ones(nR, np.int64), -np.ones(nR, np.int64), z_sp, z_a])
    m1 = -np.ones(2 * nO + 2 * nR + n_sp + 2 * len(a_s), np.int64)
    o_id, r_id = m1.copy(), m1.copy()
    o_id[:nO] = np.arange(nO)
    r_id[2 * nO : 2 * nO + nR] = np.arange(nR)
    pk = key(p_code, p_t)
    order = np.argsort(pk, kind="stable")
    pk, p_code, p_t = pk[order], p_code[order], p_t[order]
    o_open, r_open = np.cumsum(o_d[order]), np.cumsum(r_d[order])
    o_last, r_last = np.maximum.accumulate(o_id[order]), np.maximum.accumulate(r_id[order])
    keep = np.ones(len(pk), dtype=bool)  # the last point of each distinct key (counts include all)
    keep[:-1] = pk[:-1] != pk[1:]
    pk, p_code, p_t = pk[keep], p_code[keep], p_t[keep]
    valid = p_code[1:] == p_code[:-1]
    e_s, e_e, e_code = p_t[:-1][valid], p_t[1:][valid], p_code[:-1][valid]
    mid = (pk[:-1][valid] + pk[1:][valid]) / 2.0
    ri = np.where(r_open[keep][:-1][valid] > 0, r_last[keep][:-1][valid], -1)
    oi = np.where(o_open[keep][:-1][valid] > 0, o_last[keep][:-1][valid], -1)
    part = np.zeros(len(mid), dtype=bool)
    if nR:
        part = (ri >= 0) & (mid > split_k[np.clip(ri, 0, None)])
    gap = (ri < 0) & (oi < 0)
    ai = np.full(len(mid), -1, dtype=np.int64)
    if gap.any() and len(a_sk):
        ai[gap] = _innermost(a_sk, a_ek, mid[gap])
    label = np.where(ri >= 0, 2 * ri + part, np.where(oi >= 0, 2 * nR + oi, -2 - ai))
    new = np.ones(len(label), dtype=bool)
    new[1:] = (label[1:] != label[:-1]) | (e_code[1:] != e_code[:-1]) | (e_s[1:] != e_e[:-1])
    if len(b_t):
        new |= np.isin(key(e_code, e_s), key(b_code, b_t))
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(label) - 1) if len(first) else first
    s_start, s_end, s_code = e_s[first], e_e[last], e_code[first]
    s_label, s_op, s_ai = label[first], oi[first], ai[first]
    nS = len(first)
    s_cat = np.full(nS, HOST_GAP, dtype=np.int8)
    s_name = np.ones(nS, dtype=np.int64)  # UNTRACED
    is_rt = (s_label >= 0) & (s_label < 2 * nR)
    is_op = s_label >= 2 * nR
    if is_rt.any():
        g = s_label[is_rt] // 2
        s_cat[is_rt] = np.where(s_label[is_rt] % 2 == 1, SYNC_WAIT, g_cat[g])
        s_name[is_rt] = g_name[g]
    if is_op.any():
        j = s_label[is_op] - 2 * nR
        s_cat[is_op] = np.where(o_comm[j], COMM, CPU_OP)
        s_name[is_op] = o_name[j]
    s_gap = s_label < 0
    named_gap = s_gap & (s_ai >= 0)
    s_name[named_gap] = a_name[s_ai[named_gap]]
    if len(w_s):
        s_cat[named_gap] = np.where(a_comm[s_ai[named_gap]], COMM, HOST_GAP)
    has_op = s_op >= 0
    s_opname = np.where(has_op, o_name[np.clip(s_op, 0, None)] if nO else 0, 0)
    s_inst = np.where(has_op, s_op, nO + np.arange(nS))
    s_sk = key(s_code, s_start)
    thread_prev = np.arange(nS) - 1
    if nS:
        thread_prev[0] = -1
        thread_prev[1:][s_code[1:] != s_code[:-1]] = -1
    edges["thread"] = int((thread_prev >= 0).sum())

    def seg_at(gidx, at_end: bool):
        """Segment holding the start (launch part) or the end (waiting part) of runtime groups."""
        q = key(r_gc[gidx], r_ge[gidx] if at_end else r_gs[gidx])
        i = np.searchsorted(s_sk, q, side="left" if at_end else "right") - 1
        return np.where((i >= 0) & (s_code[np.clip(i, 0, None)] == r_gc[gidx]), i, -1)

    # ---- device nodes ---------------------------------------------------------------------------
    d_corr = np.concatenate([kn["correlation"].to_numpy(np.int64), mc["correlation"].to_numpy(np.int64)])
    d_name = np.concatenate([names.add(kn["name"]), names.add(mc["name"])])
    d_cat = np.concatenate([np.full(nK, KERNEL, dtype=np.int8), np.full(nM, MEMCPY, dtype=np.int8)])
    if nK:
        comm = np.zeros(nK, dtype=bool)
        if len(coll):
            ki = coll["kernel_idx"].to_numpy(np.int64)
            comm[ki[(ki >= 0) & (ki < nK)]] = True
        kc = kn["name"].astype("category")
        nccl = kc.cat.categories.astype(str).str.contains("nccl|rccl", case=False, regex=True)
        nccl = np.append(np.asarray(nccl, dtype=bool), False)
        comm |= nccl[kc.cat.codes.to_numpy()]
        d_cat[:nK][comm] = COMM
    d_launch = np.full(nD, -1, dtype=np.int64)
    d_launch_ts = np.full(nD, np.nan)
    d_member = d_start.copy()
    d_op = np.zeros(nD, dtype=np.int64)
    if len(l_dev):
        seg = seg_at(l_grp, at_end=False)
        ok = seg >= 0
        d_launch[l_dev[ok]] = seg[ok]
        d_member[l_dev[ok]] = r_gs[l_grp[ok]]
        d_launch_ts[l_dev[ok]] = r_gs[l_grp[ok]]
        d_op[l_dev[ok]] = s_opname[seg[ok]]
    edges["launch"] = int((d_launch >= 0).sum())

    # ---- sync edges (device -> host segment), event waits (device -> device) --------------------
    sync_dst: list[np.ndarray] = []
    sync_src: list[np.ndarray] = []
    ev_dst: list[np.ndarray] = []
    ev_src: list[np.ndarray] = []
    if nD:
        by_end = np.argsort(d_end, kind="stable")
        ends_sorted = d_end[by_end]
        ekey = _Keyer([d_end])
        se_order = np.lexsort((d_end, d_scode))
        se_key = ekey(d_scode[se_order], d_end[se_order])
        cmax = int(max(d_corr.max(), 0)) + 2
        sc_order = np.lexsort((d_corr, d_scode))
        sc_key = d_scode[sc_order] * cmax + d_corr[sc_order]

        def last_any(t):  # latest-ending device activity with end <= t
            i = _last_le(ends_sorted, t)
            return np.where(i >= 0, by_end[np.clip(i, 0, None)], -1)

        def on_stream(scode, q, order_, key_, after=False):
            ok = scode >= 0
            i = np.searchsorted(key_, q, side="right") if after else np.searchsorted(key_, q, side="left") - 1
            ic = np.clip(i, 0, len(key_) - 1)
            hit = ok & (i >= 0) & (i < len(key_)) & (d_scode[order_[ic]] == scode)
            return np.where(hit, order_[ic], -1)

        def last_on_stream(scode, t):  # latest-ending activity on the stream with end <= t
            q = ekey(np.clip(scode, 0, None), t)
            return on_stream(scode, np.nextafter(q, np.inf), se_order, se_key)

        def before_corr(scode, corr):  # activity on the stream with the largest correlation < corr
            return on_stream(scode, np.clip(scode, 0, None) * cmax + corr, sc_order, sc_key)

        def after_corr(scode, corr):  # activity on the stream with the smallest correlation > corr
            return on_stream(scode, np.clip(scode, 0, None) * cmax + corr, sc_order, sc_key, after=True)

        def scode_of(dev, stream):
            i = np.searchsorted(stream_ids, dev * (1 << 33) + stream)
            ic = np.clip(i, 0, len(stream_ids) - 1)
            return np.where(stream_ids[ic] == dev * (1 << 33) + stream, ic, -1)

        synced = np.zeros(nR, dtype=bool)
        sy = tr.syncs
        ls = links[links["gpu_kind"] == "sync"] if len(sy) and len(links) and nR else links.iloc[:0]
        if len(ls):
            row = sy.iloc[ls["gpu_idx"].to_numpy(np.int64)]
            g = r_grp[ls["runtime_idx"].to_numpy(np.int64)]
            synced[g] = True
            kind = row["sync_kind"].astype(str).to_numpy()
            dev, stream = row["device"].to_numpy(np.int64), row["stream"].to_numpy(np.int64)
            won, wcorr = row["wait_on_stream"].to_numpy(np.int64), row["wait_event_corr"].to_numpy(np.int64)
            corr = row["correlation"].to_numpy(np.int64)
            t = r_ge[g]
            dst = seg_at(g, at_end=True)
            src = np.full(len(g), -1, dtype=np.int64)
            m = kind == "Stream Sync"
            src[m] = last_on_stream(scode_of(dev[m], stream[m]), t[m])
            m = kind == "Context Sync"
            src[m] = last_any(t[m])
            ev = kind == "Event Sync"
            m = ev & (won >= 0) & (wcorr >= 0)
            src[m] = before_corr(scode_of(dev[m], won[m]), wcorr[m])
            m = ev & (won >= 0) & (wcorr < 0)
            src[m] = last_on_stream(scode_of(dev[m], won[m]), t[m])
            m = ev & (won < 0) & g_sync[g]
            src[m] = last_any(t[m])
            ok = (src >= 0) & (dst >= 0)
            sync_dst.append(dst[ok])
            sync_src.append(src[ok])
            # Stream Wait Event: the next activity on the waiting stream after the wait call waits
            # for the last one enqueued on the recorded stream before the event was recorded
            m = (kind == "Stream Wait Event") & (won >= 0)
            if m.any():
                es = before_corr(scode_of(dev[m], won[m]), np.where(wcorr[m] >= 0, wcorr[m], corr[m]))
                ed = after_corr(scode_of(dev[m], stream[m]), corr[m])
                ok = (es >= 0) & (ed >= 0) & (es != ed)
                ev_dst.append(ed[ok])
                ev_src.append(es[ok])
                edges["event_wait"] = int(ok.sum())
        has_swe = len(sy) > 0 and bool((sy["sync_kind"] == "Stream Wait Event").any())
        if not has_swe and len(stream_ids) > 1:
            # untraced cross-stream waits: the latest activity of another stream of the same device
            # that ended shortly before this one started
            dcode = np.unique(d_dev, return_inverse=True)[1]
            dkey = _Keyer([d_start, d_end])
            de = np.lexsort((d_end, dcode))
            de_key = dkey(dcode[de], d_end[de])
            de_s = d_scode[de]
            run = np.ones(nD, dtype=bool)
            run[1:] = de_s[1:] != de_s[:-1]
            prev_other = np.maximum.accumulate(np.where(run, np.arange(nD), 0)) - 1  # previous run's last
            i = np.searchsorted(de_key, dkey(dcode, d_start), side="right") - 1
            ic = np.clip(i, 0, None)
            pos = np.where(de_s[ic] != d_scode, ic, prev_other[ic])
            pc = np.clip(pos, 0, None)
            src = de[pc]
            ok = ((i >= 0) & (pos >= 0) & (dcode[src] == dcode) & (d_scode[src] != d_scode)
                  & (d_start - d_end[src] <= DEVICE_JOIN_TOL_US) & (d_end[src] <= d_start))  # fmt: skip
            ev_dst.append(np.flatnonzero(ok))
            ev_src.append(src[ok])
            edges["device_join"] = int(ok.sum())
        plain = np.flatnonzero(g_sync & ~synced)  # sync calls without a cuda_sync row: any stream
        if len(plain):
            dst, src = seg_at(plain, at_end=True), last_any(r_ge[plain])
            ok = (src >= 0) & (dst >= 0)
            sync_dst.append(dst[ok])
            sync_src.append(src[ok])
        # kernel launches only: a memcpy / memset call waits for its own copy (the blocking-copy
        # split below), and a pageable copy is slow for reasons of its own
        g_copy = np.zeros(nR, dtype=bool)
        if len(rt_blocking) and nR:
            np.logical_or.at(g_copy, r_grp, rt_blocking[: len(r_grp)])
        lg = np.flatnonzero((g_cat == LAUNCH) & ~synced & ~g_copy)
        if len(lg):
            ldur = r_ge[lg] - r_gs[lg]
            held = lg[ldur >= max(QUEUE_FULL_MIN_US, QUEUE_FULL_FACTOR * float(np.median(ldur)))]
            if len(held):
                src = last_any(r_ge[held])
                se = d_end[np.clip(src, 0, None)]
                dst = seg_at(held, at_end=True)
                # the slot is freed by the activity that was already running when the call began
                # (a full queue releases the call at the first end); a long first launch (lazy
                # module loading) that happens to return after some copy ended is not held by it
                ss = d_start[np.clip(src, 0, None)]
                ok = ((src >= 0) & (dst >= 0) & (se > r_gs[held]) & (ss <= r_gs[held])
                      & (r_ge[held] - se <= QUEUE_FULL_TOL_US))  # fmt: skip
                sync_dst.append(dst[ok])
                sync_src.append(src[ok])
                edges["launch_queue_full"] = int(ok.sum())
        if len(blk_grp):
            dst = seg_at(blk_grp, at_end=True)
            ok = dst >= 0
            sync_dst.append(dst[ok])
            sync_src.append(blk_dev[ok])
        if not nR and nO:
            # recorded without runtime calls (Ascend level 0): an operator that blocks on the device
            # (aten::item, a device-to-host copy) waited for the latest device activity that ended
            # while it ran
            blocking = np.array([n in SYNC_OPS for n in names.names], dtype=bool)
            cand = np.flatnonzero(is_op & blocking[s_name])
            if len(cand):
                src = last_any(s_end[cand])
                ok = (src >= 0) & (d_end[np.clip(src, 0, None)] > s_start[cand])
                sync_dst.append(cand[ok])
                sync_src.append(src[ok])
                edges["blocking_op"] = int(ok.sum())

    # ---- join edges: a gap (or a thread's first segment) released by another thread's op that
    # ended inside the gap close to its end (or just before the first segment started) ----------
    join = np.full(nS, -1, dtype=np.int64)
    cj = np.flatnonzero(_JOINABLE[s_cat])
    first_seg = np.flatnonzero((thread_prev < 0) & ~s_gap)
    gj = np.concatenate([np.flatnonzero(s_gap), first_seg])
    if len(cj) and len(gj) and len(tids) > 1:
        q_t = np.concatenate([s_end[s_gap], s_start[first_seg]])  # must have ended by then
        q_lo = np.concatenate([s_start[s_gap], s_start[first_seg] - JOIN_TOL_US])  # and after this
        tol = np.concatenate([np.maximum(JOIN_TOL_US, JOIN_TOL_SHARE * (s_end[s_gap] - s_start[s_gap])),
                              np.full(len(first_seg), JOIN_TOL_US)])  # fmt: skip
        cj = cj[np.argsort(s_end[cj], kind="stable")]
        i = _last_le(s_end[cj], q_t)
        c = cj[np.clip(i, 0, None)]
        ok = (i >= 0) & (s_code[c] != s_code[gj]) & (s_end[c] > q_lo) & (q_t - s_end[c] <= tol)
        join[gj[ok]] = c[ok]
        edges["join"] = int(ok.sum())

    N = nS + nD
    start = np.concatenate([s_start, d_start])
    end = np.concatenate([s_end, d_end])
    wait = np.full(N, -1, dtype=np.int64)
    for dsts, srcs, off in ((sync_dst, sync_src, 0), (ev_dst, ev_src, nS)):
        if dsts and sum(len(x) for x in dsts):
            dd = np.concatenate(dsts) + off
            ss = np.concatenate(srcs) + nS
            o = np.lexsort((end[ss], dd))  # keep the source that ended last per destination
            dd, ss = dd[o], ss[o]
            lastm = np.ones(len(dd), dtype=bool)
            lastm[:-1] = dd[1:] != dd[:-1]
            wait[dd[lastm]] = ss[lastm]
            if off == 0:
                edges["sync"] = int(lastm.sum())

    if nD and nS and not edges["launch"]:
        # recorded without launch links (Ascend level 0): a device activity nothing on the device
        # released (no event wait; its stream predecessor, if any, ended well before it started) was
        # released by the host: the latest host operator piece that ended before it started
        dn = np.arange(nD)
        sp_end = np.where(stream_prev >= 0, d_end[np.clip(stream_prev, 0, None)], -np.inf)
        orphan = dn[(wait[nS:] < 0) & (d_start - sp_end > DEVICE_JOIN_TOL_US)]
        hs = np.flatnonzero((s_cat == CPU_OP) | (s_cat == COMM))
        if len(orphan) and len(hs):
            hs = hs[np.argsort(s_end[hs], kind="stable")]
            i = _last_le(s_end[hs], d_start[orphan])
            ok = i >= 0
            wait[nS + orphan[ok]] = hs[i[ok]]
            edges["host_release"] = int(ok.sum())

    # ---- predecessor = the candidate that finished last (ties: thread / stream order) ------------
    pred = np.full(N, -1, dtype=np.int64)
    pred[:nS] = thread_prev
    if nD:
        sp = np.where(stream_prev >= 0, stream_prev + nS, -1)
        e_sp = np.where(sp >= 0, end[np.clip(sp, 0, None)], -np.inf)
        e_la = np.where(d_launch >= 0, end[np.clip(d_launch, 0, None)], -np.inf)
        pred[nS:] = np.where(e_sp >= e_la, sp, d_launch)
    for extra in (join, wait):  # join: host nodes only; wait: any node
        idx = np.flatnonzero(extra >= 0)
        if len(idx):
            cur = pred[idx]
            e_cur = np.where(cur >= 0, end[np.clip(cur, 0, None)], -np.inf)
            better = end[extra[idx]] > e_cur
            pred[idx[better]] = extra[idx][better]

    return Graph(
        start=start,
        end=end,
        cat=np.concatenate([s_cat, d_cat]),
        name=np.concatenate([s_name, d_name]),
        op=np.concatenate([s_opname, d_op]),
        inst=np.concatenate([s_inst, nO + nS + np.arange(nD)]),
        tid=np.concatenate([tids[s_code] if nS else np.zeros(0, dtype=np.int64), np.full(nD, -1, np.int64)]),
        member_ts=np.concatenate([s_start, d_member]),
        is_gap=np.concatenate([s_gap, np.zeros(nD, dtype=bool)]),
        pred=pred,
        n_host=nS,
        names=names.names,
        edges=edges,
        lane_prev=np.concatenate([thread_prev, np.where(stream_prev >= 0, stream_prev + nS, -1)]),
        launch=np.concatenate([np.full(nS, -1, np.int64), d_launch]),
        join=np.concatenate([join, np.full(nD, -1, np.int64)]),
        wait=wait,
        launch_ts=np.concatenate([np.full(nS, np.nan), d_launch_ts]),
    )


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
