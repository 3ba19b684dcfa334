"""The dependency graph's host nodes: each CPU thread's timeline cut into consecutive segments --
top-level CPU ops (depth 0), the CUDA/HIP runtime calls inside or between them (nested calls
merged into the outermost; a blocking memcpy/memset call split in a launch part and a waiting
part), and the gaps between them (untraced host time, split where user annotations start or end
and named after the innermost one). analyzers/timeline/graph_build.py assembles the graph."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from hermes_kb.trace.bundle import RankTrace

from .. import intervals as iv
from ..context import RankContext
from .graph import CATEGORIES, COMM, CPU_OP, HOST_GAP, LAUNCH, RUNTIME, SYNC_WAIT, Keyer, Names, main_tid
from .host_sets import gloo_waits

# runtime kind -> category; nested calls take the strongest member (sync > launch > runtime)
_RT_CAT = {"sync": SYNC_WAIT, "launch": LAUNCH, "graph_launch": LAUNCH, "memcpy": LAUNCH, "memset": LAUNCH}
_PRIO = {RUNTIME: 1, LAUNCH: 2, SYNC_WAIT: 3}
_BLOCKING_KINDS = ("memcpy", "memset")


def _group_nested(code: np.ndarray, ts: np.ndarray, end: np.ndarray, key: Keyer):
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


@dataclass
class Lanes:
    """Each host thread's raw intervals (a thread's lane code is its index in ``tids``)."""

    tids: np.ndarray  # sorted threads with top-level ops or runtime calls
    o_rows: np.ndarray  # rows of the top-level CPU ops in cpu_ops
    o_tid: np.ndarray
    o_ts: np.ndarray
    o_end: np.ndarray
    rt_tid: np.ndarray
    rt_ts: np.ndarray
    rt_end: np.ndarray
    am: np.ndarray  # the annotations (of the trace) that cut and name gaps
    n_ann: int  # how many; the gloo stretches follow them in a_*
    a_tid: np.ndarray
    a_s: np.ndarray
    a_e: np.ndarray
    n_gloo: int  # gloo stretches laid on the driving thread
    w_names: list[str]
    key: Keyer


def thread_lanes(ctx: RankContext) -> Lanes:
    tr = ctx.trace
    rt = tr.runtime
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
    # waiting for it (host_sets.gloo_waits): the collectives' stretches are laid on that thread as
    # annotations, and the gaps they name are communication
    mt0 = main_tid(ctx)
    (w_s, w_e), w_names = gloo_waits(tr, mt0) if mt0 in tids else (iv.EMPTY, [])
    n_ann = len(a_s)
    a_tid = np.concatenate([a_tid, np.full(len(w_s), mt0, dtype=np.int64)])
    a_s, a_e = np.concatenate([a_s, w_s]), np.concatenate([a_e, w_e])
    o_ts, o_end = cpu["ts"].to_numpy(np.float64)[top], cpu["end"].to_numpy(np.float64)[top]
    rt_ts, rt_end = rt["ts"].to_numpy(np.float64), rt["end"].to_numpy(np.float64)
    key = Keyer([o_ts, o_end, rt_ts, rt_end, a_s, a_e])
    return Lanes(tids=tids, o_rows=o_rows, o_tid=o_tid, o_ts=o_ts, o_end=o_end, rt_tid=rt_tid, rt_ts=rt_ts,
                 rt_end=rt_end, am=am, n_ann=n_ann, a_tid=a_tid, a_s=a_s, a_e=a_e, n_gloo=len(w_s),
                 w_names=w_names, key=key)  # fmt: skip


@dataclass
class RuntimeGroups:
    """Runtime calls, nested ones merged into the outermost (a group), sorted by (lane, start)."""

    grp: np.ndarray  # runtime row -> group
    gs: np.ndarray
    ge: np.ndarray
    gc: np.ndarray  # lane code
    n: int
    blocking: np.ndarray  # per runtime row: a memcpy / memset call
    cat: np.ndarray
    name: np.ndarray
    sync: np.ndarray  # the group synchronises


def runtime_groups(rt: pd.DataFrame, lanes: Lanes, names: Names) -> RuntimeGroups:
    rt_code = np.searchsorted(lanes.tids, lanes.rt_tid)
    r_grp, r_rep, r_gs, r_ge, r_gc = _group_nested(rt_code, lanes.rt_ts, lanes.rt_end, lanes.key)
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
    return RuntimeGroups(grp=r_grp, gs=r_gs, ge=r_ge, gc=r_gc, n=nR, blocking=rt_blocking, cat=g_cat, name=g_name,
                         sync=g_sync)  # fmt: skip


@dataclass
class OpGroups:
    """Top-level CPU ops, overlapping ones merged (a group), sorted by (lane, start)."""

    gs: np.ndarray
    ge: np.ndarray
    gc: np.ndarray  # lane code
    n: int
    name: np.ndarray
    comm: np.ndarray  # a CPU-only collective (gloo)


def op_groups(tr: RankTrace, lanes: Lanes, names: Names) -> OpGroups:
    cpu, coll = tr.cpu_ops, tr.collectives
    op_code = np.searchsorted(lanes.tids, lanes.o_tid)
    o_grp, o_rep, o_gs, o_ge, o_gc = _group_nested(op_code, lanes.o_ts, lanes.o_end, lanes.key)
    nO = len(o_gs)
    o_rows = lanes.o_rows
    o_name = names.add(cpu["name"])[o_rows[o_rep]] if nO else np.zeros(0, dtype=np.int64)
    o_comm = np.zeros(nO, dtype=bool)
    if nO and len(coll) and len(tr.kernels) == 0:
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
    return OpGroups(gs=o_gs, ge=o_ge, gc=o_gc, n=nO, name=o_name, comm=o_comm)


@dataclass
class CallSplit:
    """Where each runtime group is split in a launch part and a waiting part (a blocking
    memcpy/memset call: graph_device.launches); +inf when it is not."""

    t: np.ndarray
    has: np.ndarray
    k: np.ndarray  # the split time as a (lane, time) key


@dataclass
class Spans:
    """The annotations that cut and name gaps (the gloo stretches last), sorted by key (start,
    then the longest first)."""

    code: np.ndarray  # lane code, in lanes.a_* order
    sk: np.ndarray
    ek: np.ndarray
    name: np.ndarray
    comm: np.ndarray  # a gloo stretch


def annotation_spans(ann: pd.DataFrame, lanes: Lanes, names: Names) -> Spans:
    a_code = np.searchsorted(lanes.tids, lanes.a_tid)
    a_sk, a_ek = lanes.key(a_code, lanes.a_s), lanes.key(a_code, lanes.a_e)
    ao = np.lexsort((-a_ek, a_sk))
    a_sk, a_ek = a_sk[ao], a_ek[ao]
    a_name = (np.concatenate([names.add(ann["name"])[lanes.am] if lanes.n_ann else np.zeros(0, dtype=np.int64),
                              np.array([names.id(n) for n in lanes.w_names], dtype=np.int64)])[ao]
              if len(ao) else np.zeros(0, dtype=np.int64))  # fmt: skip
    a_comm = (np.arange(len(lanes.a_s)) >= lanes.n_ann)[ao]  # the gloo stretches
    return Spans(code=a_code, sk=a_sk, ek=a_ek, name=a_name, comm=a_comm)


def _step_cuts(ctx: RankContext, tids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # the driving thread's time is cut at every step start, so that a stretch of host time at a
    # step's end (a log flush, a checkpoint) belongs to that step and not to the next one
    mt = main_tid(ctx)
    b_t = np.array([w.start_us for w in ctx.windows] + [ctx.windows[-1].cpu_end_us], dtype=np.float64) \
        if (mt in tids and ctx.windows) else np.zeros(0)  # fmt: skip
    b_code = np.full(len(b_t), int(np.searchsorted(tids, mt)) if len(b_t) else 0, dtype=np.int64)
    return b_t, b_code


@dataclass
class _Points:
    """Every lane's cut points sorted by key, with the running open count and latest index of
    the top-level op groups (o_*) and runtime groups (r_*)."""

    pk: np.ndarray
    code: np.ndarray
    t: np.ndarray
    o_open: np.ndarray
    r_open: np.ndarray
    o_last: np.ndarray
    r_last: np.ndarray


def _cut_points(lanes: Lanes, rg: RuntimeGroups, og: OpGroups, split: CallSplit, spans: Spans,
                b_t: np.ndarray, b_code: np.ndarray) -> _Points:  # fmt: skip
    nO, nR, has_split = og.n, rg.n, split.has
    n_sp = int(has_split.sum())
    n_sp += len(b_t)
    p_code = np.concatenate([og.gc, og.gc, rg.gc, rg.gc, rg.gc[has_split], b_code, spans.code, spans.code])
    p_t = np.concatenate([og.gs, og.ge, rg.gs, rg.ge, split.t[has_split], b_t, lanes.a_s, lanes.a_e])
    # +1 / -1 where a top-level op group (o_*) or runtime group (r_*) opens / closes, and the group
    # index at its opening: after sorting, a running sum says whether a group is open and a running
    # max which one (groups are disjoint per thread and numbered in key order)
    z_sp, z_a = np.zeros(n_sp, np.int64), np.zeros(2 * len(lanes.a_s), np.int64)
    o_d = np.concatenate([np.ones(nO, np.int64), -np.ones(nO, np.int64), np.zeros(2 * nR, np.int64), z_sp, z_a])
    r_d = np.concatenate([np.zeros(2 * nO, np.int64), np.ones(nR, np.int64), -np.ones(nR, np.int64), z_sp, z_a])
    m1 = -np.ones(2 * nO + 2 * nR + n_sp + 2 * len(lanes.a_s), np.int64)
    o_id, r_id = m1.copy(), m1.copy()
    o_id[:nO] = np.arange(nO)
    r_id[2 * nO : 2 * nO + nR] = np.arange(nR)
    pk = lanes.key(p_code, p_t)
    order = np.argsort(pk, kind="stable")
    pk, p_code, p_t = pk[order], p_code[order], p_t[order]
    o_open, r_open = np.cumsum(o_d[order]), np.cumsum(r_d[order])
    o_last, r_last = np.maximum.accumulate(o_id[order]), np.maximum.accumulate(r_id[order])
    return _Points(pk, p_code, p_t, o_open, r_open, o_last, r_last)


@dataclass
class _Pieces:
    """Elementary pieces between consecutive cut points of a lane, labelled: 2 * runtime group
    (+1 for a waiting part), 2 * nR + op group, or -2 - innermost annotation (-1: none) for gaps."""

    s: np.ndarray
    e: np.ndarray
    code: np.ndarray
    label: np.ndarray
    oi: np.ndarray  # enclosing op group, -1 when none
    ai: np.ndarray  # innermost annotation of a gap, -1 when none


def _pieces(pts: _Points, nR: int, split: CallSplit, spans: Spans) -> _Pieces:
    keep = np.ones(len(pts.pk), dtype=bool)  # the last point of each distinct key (counts include all)
    keep[:-1] = pts.pk[:-1] != pts.pk[1:]
    pk, p_code, p_t = pts.pk[keep], pts.code[keep], pts.t[keep]
    valid = p_code[1:] == p_code[:-1]
    e_s, e_e, e_code = p_t[:-1][valid], p_t[1:][valid], p_code[:-1][valid]
    mid = (pk[:-1][valid] + pk[1:][valid]) / 2.0
    ri = np.where(pts.r_open[keep][:-1][valid] > 0, pts.r_last[keep][:-1][valid], -1)
    oi = np.where(pts.o_open[keep][:-1][valid] > 0, pts.o_last[keep][:-1][valid], -1)
    part = np.zeros(len(mid), dtype=bool)
    if nR:
        part = (ri >= 0) & (mid > split.k[np.clip(ri, 0, None)])
    gap = (ri < 0) & (oi < 0)
    ai = np.full(len(mid), -1, dtype=np.int64)
    if gap.any() and len(spans.sk):
        ai[gap] = _innermost(spans.sk, spans.ek, mid[gap])
    label = np.where(ri >= 0, 2 * ri + part, np.where(oi >= 0, 2 * nR + oi, -2 - ai))
    return _Pieces(e_s, e_e, e_code, label, oi, ai)


@dataclass
class HostSegments:
    """The host nodes: consecutive segments of each thread, in (thread, time) order."""

    start: np.ndarray
    end: np.ndarray
    code: np.ndarray  # lane code
    cat: np.ndarray
    name: np.ndarray
    gap: np.ndarray  # untraced host time (named or not)
    opname: np.ndarray  # the enclosing top-level op's name id (0 when none)
    inst: np.ndarray
    sk: np.ndarray  # the start as a (lane, time) key
    thread_prev: np.ndarray  # the thread's previous segment, -1 for its first
    is_op: np.ndarray  # a top-level op segment
    n: int


def _segments(pc: _Pieces, b_t: np.ndarray, b_code: np.ndarray, lanes: Lanes, rg: RuntimeGroups, og: OpGroups,
              spans: Spans) -> HostSegments:  # fmt: skip
    """Consecutive pieces with one label merged into segments (cut at the driving thread's step
    starts), with their category and name."""
    label, e_s, e_e, e_code, key, nR, nO = pc.label, pc.s, pc.e, pc.code, lanes.key, rg.n, og.n
    new = np.ones(len(label), dtype=bool)
    new[1:] = (label[1:] != label[:-1]) | (e_code[1:] != e_code[:-1]) | (e_s[1:] != e_e[:-1])
    if len(b_t):
        new |= np.isin(key(e_code, e_s), key(b_code, b_t))
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(label) - 1) if len(first) else first
    s_start, s_end, s_code = e_s[first], e_e[last], e_code[first]
    s_label, s_op, s_ai = label[first], pc.oi[first], pc.ai[first]
    nS = len(first)
    s_cat = np.full(nS, HOST_GAP, dtype=np.int8)
    s_name = np.ones(nS, dtype=np.int64)  # UNTRACED
    is_rt = (s_label >= 0) & (s_label < 2 * nR)
    is_op = s_label >= 2 * nR
    if is_rt.any():
        g = s_label[is_rt] // 2
        s_cat[is_rt] = np.where(s_label[is_rt] % 2 == 1, SYNC_WAIT, rg.cat[g])
        s_name[is_rt] = rg.name[g]
    if is_op.any():
        j = s_label[is_op] - 2 * nR
        s_cat[is_op] = np.where(og.comm[j], COMM, CPU_OP)
        s_name[is_op] = og.name[j]
    s_gap = s_label < 0
    named_gap = s_gap & (s_ai >= 0)
    s_name[named_gap] = spans.name[s_ai[named_gap]]
    if lanes.n_gloo:
        s_cat[named_gap] = np.where(spans.comm[s_ai[named_gap]], COMM, HOST_GAP)
    has_op = s_op >= 0
    s_opname = np.where(has_op, og.name[np.clip(s_op, 0, None)] if nO else 0, 0)
    s_inst = np.where(has_op, s_op, nO + np.arange(nS))
    s_sk = key(s_code, s_start)
    thread_prev = np.arange(nS) - 1
    if nS:
        thread_prev[0] = -1
        thread_prev[1:][s_code[1:] != s_code[:-1]] = -1
    return HostSegments(start=s_start, end=s_end, code=s_code, cat=s_cat, name=s_name, gap=s_gap, opname=s_opname,
                        inst=s_inst, sk=s_sk, thread_prev=thread_prev, is_op=is_op, n=nS)  # fmt: skip


def host_segments(ctx: RankContext, lanes: Lanes, rg: RuntimeGroups, og: OpGroups, split: CallSplit,
                  spans: Spans) -> HostSegments:  # fmt: skip
    """The elementary pieces of each thread's timeline, merged into segments."""
    b_t, b_code = _step_cuts(ctx, lanes.tids)
    pts = _cut_points(lanes, rg, og, split, spans, b_t, b_code)
    return _segments(_pieces(pts, rg.n, split, spans), b_t, b_code, lanes, rg, og, spans)


@dataclass
class HostNodes:
    lanes: Lanes
    rt: RuntimeGroups
    ops: OpGroups
    seg: HostSegments

    def seg_at(self, gidx: np.ndarray, at_end: bool) -> np.ndarray:
        """Segment holding the start (launch part) or the end (waiting part) of runtime groups."""
        key, rt, seg = self.lanes.key, self.rt, self.seg
        q = key(rt.gc[gidx], rt.ge[gidx] if at_end else rt.gs[gidx])
        i = np.searchsorted(seg.sk, q, side="left" if at_end else "right") - 1
        return np.where((i >= 0) & (seg.code[np.clip(i, 0, None)] == rt.gc[gidx]), i, -1)
