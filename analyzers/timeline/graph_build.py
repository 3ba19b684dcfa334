"""One rank's dependency graph, built with vectorised joins (analyzers/timeline/critical_path.py
describes it): host nodes (analyzers/timeline/graph_host.py), device nodes and the launch, sync
and event-wait edges (analyzers/timeline/graph_device.py), the join edges between threads, and
each node's predecessor: the candidate that finished last (the one that released it)."""

from __future__ import annotations

import numpy as np

from ..context import RankContext
from .graph import CATEGORIES, COMM, CPU_OP, LAUNCH, SYNC_WAIT, Graph, Names, last_le
from .graph_device import (DEVICE_JOIN_TOL_US, DeviceLanes, DeviceNodes, Waits, device_lanes, device_nodes, launches,
                           wait_edges)  # fmt: skip
from .graph_host import HostNodes, HostSegments, annotation_spans, host_segments, op_groups, runtime_groups, \
    thread_lanes

# a gap on one thread is joined to an op of another thread that ended at most this long before
# the gap's end (µs), or this share of the gap, whichever is larger
JOIN_TOL_US = 1000.0
JOIN_TOL_SHARE = 0.05
_JOINABLE = np.zeros(len(CATEGORIES), dtype=bool)
_JOINABLE[[CPU_OP, LAUNCH, SYNC_WAIT, COMM]] = True


def join_edges(seg: HostSegments, n_threads: int, edges: dict[str, int]) -> np.ndarray:
    """A gap (or a thread's first segment) released by another thread's op that ended inside the
    gap close to its end (or just before the first segment started); -1 when none."""
    s_gap, s_start, s_end, s_code = seg.gap, seg.start, seg.end, seg.code
    join = np.full(seg.n, -1, dtype=np.int64)
    cj = np.flatnonzero(_JOINABLE[seg.cat])
    first_seg = np.flatnonzero((seg.thread_prev < 0) & ~s_gap)
    gj = np.concatenate([np.flatnonzero(s_gap), first_seg])
    if len(cj) and len(gj) and n_threads > 1:
        q_t = np.concatenate([s_end[s_gap], s_start[first_seg]])  # must have ended by then
        q_lo = np.concatenate([s_start[s_gap], s_start[first_seg] - JOIN_TOL_US])  # and after this
        tol = np.concatenate([np.maximum(JOIN_TOL_US, JOIN_TOL_SHARE * (s_end[s_gap] - s_start[s_gap])),
                              np.full(len(first_seg), JOIN_TOL_US)])  # fmt: skip
        cj = cj[np.argsort(s_end[cj], kind="stable")]
        i = last_le(s_end[cj], q_t)
        c = cj[np.clip(i, 0, None)]
        ok = (i >= 0) & (s_code[c] != s_code[gj]) & (s_end[c] > q_lo) & (q_t - s_end[c] <= tol)
        join[gj[ok]] = c[ok]
        edges["join"] = int(ok.sum())
    return join


def _merge_waits(waits: Waits, end: np.ndarray, nS: int, N: int, edges: dict[str, int]) -> np.ndarray:
    """Each node's wait edge: of several, the source that ended last."""
    wait = np.full(N, -1, dtype=np.int64)
    for dsts, srcs, off in ((waits.sync_dst, waits.sync_src, 0), (waits.ev_dst, waits.ev_src, nS)):
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
    return wait


def _host_release(seg: HostSegments, dl: DeviceLanes, wait: np.ndarray, edges: dict[str, int]) -> None:
    # recorded without launch links (Ascend level 0): a device activity nothing on the device
    # released (no event wait; its stream predecessor, if any, ended well before it started) was
    # released by the host: the latest host operator piece that ended before it started
    nS, nD, stream_prev, d_end, d_start, s_end = seg.n, dl.n, dl.stream_prev, dl.end, dl.start, seg.end
    dn = np.arange(nD)
    sp_end = np.where(stream_prev >= 0, d_end[np.clip(stream_prev, 0, None)], -np.inf)
    orphan = dn[(wait[nS:] < 0) & (d_start - sp_end > DEVICE_JOIN_TOL_US)]
    hs = np.flatnonzero((seg.cat == CPU_OP) | (seg.cat == COMM))
    if len(orphan) and len(hs):
        hs = hs[np.argsort(s_end[hs], kind="stable")]
        i = last_le(s_end[hs], d_start[orphan])
        ok = i >= 0
        wait[nS + orphan[ok]] = hs[i[ok]]
        edges["host_release"] = int(ok.sum())


def _predecessors(seg: HostSegments, dl: DeviceLanes, dn: DeviceNodes, join: np.ndarray, wait: np.ndarray,
                  end: np.ndarray) -> np.ndarray:  # fmt: skip
    """Predecessor = the candidate that finished last (ties: thread / stream order)."""
    nS, nD, stream_prev, d_launch = seg.n, dl.n, dl.stream_prev, dn.launch
    pred = np.full(nS + nD, -1, dtype=np.int64)
    pred[:nS] = seg.thread_prev
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
    return pred


def build_graph(ctx: RankContext) -> Graph:
    tr = ctx.trace
    edges = {"thread": 0, "stream": 0, "launch": 0, "sync": 0, "event_wait": 0, "device_join": 0, "join": 0,
             "blocking_op": 0, "host_release": 0}
    names = Names()
    lanes = thread_lanes(ctx)
    rg = runtime_groups(tr.runtime, lanes, names)
    og = op_groups(tr, lanes, names)
    dl = device_lanes(tr, edges)
    ln, split = launches(tr.links, rg, dl, lanes.key)
    spans = annotation_spans(tr.annotations, lanes, names)
    seg = host_segments(ctx, lanes, rg, og, split, spans)
    edges["thread"] = int((seg.thread_prev >= 0).sum())
    host = HostNodes(lanes, rg, og, seg)
    dn = device_nodes(tr, dl, names, host, ln, edges)
    waits = wait_edges(tr, dl, dn, host, ln, names, edges)
    join = join_edges(seg, len(lanes.tids), edges)

    nS, nD = seg.n, dl.n
    start = np.concatenate([seg.start, dl.start])
    end = np.concatenate([seg.end, dl.end])
    wait = _merge_waits(waits, end, nS, nS + nD, edges)
    if nD and nS and not edges["launch"]:
        _host_release(seg, dl, wait, edges)
    pred = _predecessors(seg, dl, dn, join, wait, end)
    return Graph(
        start=start,
        end=end,
        cat=np.concatenate([seg.cat, dn.cat]),
        name=np.concatenate([seg.name, dn.name]),
        op=np.concatenate([seg.opname, dn.op]),
        inst=np.concatenate([seg.inst, og.n + nS + np.arange(nD)]),
        tid=np.concatenate([lanes.tids[seg.code] if nS else np.zeros(0, dtype=np.int64), np.full(nD, -1, np.int64)]),
        member_ts=np.concatenate([seg.start, dn.member]),
        is_gap=np.concatenate([seg.gap, np.zeros(nD, dtype=bool)]),
        pred=pred,
        n_host=nS,
        names=names.names,
        edges=edges,
        lane_prev=np.concatenate([seg.thread_prev, np.where(dl.stream_prev >= 0, dl.stream_prev + nS, -1)]),
        launch=np.concatenate([np.full(nS, -1, np.int64), dn.launch]),
        join=np.concatenate([join, np.full(nD, -1, np.int64)]),
        wait=wait,
        launch_ts=np.concatenate([np.full(nS, np.nan), dn.launch_ts]),
    )
