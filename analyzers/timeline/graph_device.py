"""The dependency graph's device nodes and the edges into and out of them: kernels and
memcpy/memset in stream order, launch -> activity (``trace.links``), cross-stream event waits
(``Stream Wait Event`` cuda_sync rows; without them, an activity that starts right after one on
another stream of its device ended), and the sync edges a host segment waits on (a synchronising
call, a blocking copy, a launch held by a full queue, a blocking operator without runtime calls).
analyzers/timeline/graph_build.py assembles the graph."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from hermes_kb.trace.bundle import RankTrace

from ..host.syncs import SYNC_OPS
from .graph import COMM, KERNEL, LAUNCH, MEMCPY, Keyer, Names, last_le
from .graph_host import CallSplit, HostNodes, RuntimeGroups

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


@dataclass
class DeviceLanes:
    """Kernels then memcpy/memset, each stream a lane."""

    start: np.ndarray
    end: np.ndarray
    dev: np.ndarray
    scode: np.ndarray  # stream code: index into stream_ids
    stream_ids: np.ndarray  # device * 2^33 + stream, sorted
    stream_prev: np.ndarray  # the stream's previous activity, -1 for its first
    n: int
    n_kernels: int
    n_memcpy: int


def device_lanes(tr: RankTrace, edges: dict[str, int]) -> DeviceLanes:
    kn, mc = tr.kernels, tr.memcpy
    nK, nM = len(kn), len(mc)
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
    return DeviceLanes(start=d_start, end=d_end, dev=d_dev, scode=d_scode, stream_ids=stream_ids,
                       stream_prev=stream_prev, n=nD, n_kernels=nK, n_memcpy=nM)  # fmt: skip


@dataclass
class Launches:
    dev: np.ndarray  # device node of each kernel / memcpy link
    grp: np.ndarray  # the runtime group that launched it
    blk_dev: np.ndarray  # the copies of blocking memcpy/memset calls
    blk_grp: np.ndarray  # and their calls


def launches(links: pd.DataFrame, rg: RuntimeGroups, dl: DeviceLanes, key: Keyer) -> tuple[Launches, CallSplit]:
    """Links, and blocking memcpy/memset calls (split where their own copy starts)."""
    nR, nD, nK, d_start, d_end = rg.n, dl.n, dl.n_kernels, dl.start, dl.end
    r_gs, r_ge = rg.gs, rg.ge
    l_dev = l_grp = np.zeros(0, dtype=np.int64)
    if len(links) and nR and nD:
        lk = links[links["gpu_kind"].isin(("kernel", "memcpy"))]
        l_rt = lk["runtime_idx"].to_numpy(np.int64)
        l_dev = lk["gpu_idx"].to_numpy(np.int64) + np.where((lk["gpu_kind"] == "memcpy").to_numpy(), nK, 0)
        l_grp = rg.grp[l_rt]
        blk = (rg.blocking[l_rt] & (d_end[l_dev] <= r_ge[l_grp]) & (d_start[l_dev] > r_gs[l_grp])
               & (d_start[l_dev] < r_ge[l_grp]))  # fmt: skip
    else:
        blk = np.zeros(0, dtype=bool)
    # The call enqueues its copy, then blocks. Split it where the copy could have started: when the
    # activity before it on its stream ended (if that was during the call: the stream, not the
    # call, held the copy back), else where the copy started (the call's own set-up held it back).
    split_t = np.full(nR, np.inf)
    if blk.any():
        bd, bg = l_dev[blk], l_grp[blk]
        sp = dl.stream_prev[bd]
        ready = np.where(sp >= 0, d_end[np.clip(sp, 0, None)], -np.inf)
        at = np.where(ready > r_gs[bg], np.minimum(ready, d_start[bd]), d_start[bd])
        np.minimum.at(split_t, bg, at)
    blk_dev, blk_grp = l_dev[blk], l_grp[blk]
    has_split = np.isfinite(split_t)
    split_k = np.where(has_split, key(rg.gc, np.where(has_split, split_t, 0.0)), np.inf)
    return Launches(l_dev, l_grp, blk_dev, blk_grp), CallSplit(split_t, has_split, split_k)


@dataclass
class DeviceNodes:
    corr: np.ndarray
    name: np.ndarray
    cat: np.ndarray
    launch: np.ndarray  # host segment holding the start of the launch call, -1 when unlinked
    launch_ts: np.ndarray
    member: np.ndarray  # time deciding step membership
    op: np.ndarray  # the launching top-level op's name id


def device_nodes(tr: RankTrace, dl: DeviceLanes, names: Names, host: HostNodes, ln: Launches,
                 edges: dict[str, int]) -> DeviceNodes:  # fmt: skip
    kn, mc, coll = tr.kernels, tr.memcpy, tr.collectives
    nK, nM, nD = dl.n_kernels, dl.n_memcpy, dl.n
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
    d_member = dl.start.copy()
    d_op = np.zeros(nD, dtype=np.int64)
    l_dev, l_grp, r_gs = ln.dev, ln.grp, host.rt.gs
    if len(l_dev):
        seg = host.seg_at(l_grp, at_end=False)
        ok = seg >= 0
        d_launch[l_dev[ok]] = seg[ok]
        d_member[l_dev[ok]] = r_gs[l_grp[ok]]
        d_launch_ts[l_dev[ok]] = r_gs[l_grp[ok]]
        d_op[l_dev[ok]] = host.seg.opname[seg[ok]]
    edges["launch"] = int((d_launch >= 0).sum())
    return DeviceNodes(corr=d_corr, name=d_name, cat=d_cat, launch=d_launch, launch_ts=d_launch_ts,
                       member=d_member, op=d_op)  # fmt: skip


class DeviceIndex:
    """Searches over the device activities: by end time, per stream by end time or by
    correlation id."""

    def __init__(self, dl: DeviceLanes, d_corr: np.ndarray):
        d_end, d_scode = dl.end, dl.scode
        self.scode, self.stream_ids = d_scode, dl.stream_ids
        self.by_end = np.argsort(d_end, kind="stable")
        self.ends_sorted = d_end[self.by_end]
        self.ekey = Keyer([d_end])
        self.se_order = np.lexsort((d_end, d_scode))
        self.se_key = self.ekey(d_scode[self.se_order], d_end[self.se_order])
        self.cmax = int(max(d_corr.max(), 0)) + 2
        self.sc_order = np.lexsort((d_corr, d_scode))
        self.sc_key = d_scode[self.sc_order] * self.cmax + d_corr[self.sc_order]

    def last_any(self, t):  # latest-ending device activity with end <= t
        i = last_le(self.ends_sorted, t)
        return np.where(i >= 0, self.by_end[np.clip(i, 0, None)], -1)

    def on_stream(self, scode, q, order_, key_, after=False):
        ok = scode >= 0
        i = np.searchsorted(key_, q, side="right") if after else np.searchsorted(key_, q, side="left") - 1
        ic = np.clip(i, 0, len(key_) - 1)
        hit = ok & (i >= 0) & (i < len(key_)) & (self.scode[order_[ic]] == scode)
        return np.where(hit, order_[ic], -1)

    def last_on_stream(self, scode, t):  # latest-ending activity on the stream with end <= t
        q = self.ekey(np.clip(scode, 0, None), t)
        return self.on_stream(scode, np.nextafter(q, np.inf), self.se_order, self.se_key)

    def before_corr(self, scode, corr):  # activity on the stream with the largest correlation < corr
        return self.on_stream(scode, np.clip(scode, 0, None) * self.cmax + corr, self.sc_order, self.sc_key)

    def after_corr(self, scode, corr):  # activity on the stream with the smallest correlation > corr
        return self.on_stream(scode, np.clip(scode, 0, None) * self.cmax + corr, self.sc_order, self.sc_key,
                              after=True)  # fmt: skip

    def scode_of(self, dev, stream):
        stream_ids = self.stream_ids
        i = np.searchsorted(stream_ids, dev * (1 << 33) + stream)
        ic = np.clip(i, 0, len(stream_ids) - 1)
        return np.where(stream_ids[ic] == dev * (1 << 33) + stream, ic, -1)


@dataclass
class Waits:
    """Wait edges, destination <- source: sync (device node -> host segment), event waits
    (device -> device)."""

    sync_dst: list[np.ndarray] = field(default_factory=list)
    sync_src: list[np.ndarray] = field(default_factory=list)
    ev_dst: list[np.ndarray] = field(default_factory=list)
    ev_src: list[np.ndarray] = field(default_factory=list)


def _sync_rows(tr: RankTrace, host: HostNodes, ix: DeviceIndex, w: Waits, edges: dict[str, int]) -> np.ndarray:
    """Edges from the cuda_sync rows linked to runtime calls; returns which runtime groups had one."""
    rg, links, sy = host.rt, tr.links, tr.syncs
    nR = rg.n
    synced = np.zeros(nR, dtype=bool)
    ls = links[links["gpu_kind"] == "sync"] if len(sy) and len(links) and nR else links.iloc[:0]
    if len(ls):
        row = sy.iloc[ls["gpu_idx"].to_numpy(np.int64)]
        g = rg.grp[ls["runtime_idx"].to_numpy(np.int64)]
        synced[g] = True
        kind = row["sync_kind"].astype(str).to_numpy()
        dev, stream = row["device"].to_numpy(np.int64), row["stream"].to_numpy(np.int64)
        won, wcorr = row["wait_on_stream"].to_numpy(np.int64), row["wait_event_corr"].to_numpy(np.int64)
        corr = row["correlation"].to_numpy(np.int64)
        t = rg.ge[g]
        dst = host.seg_at(g, at_end=True)
        src = np.full(len(g), -1, dtype=np.int64)
        m = kind == "Stream Sync"
        src[m] = ix.last_on_stream(ix.scode_of(dev[m], stream[m]), t[m])
        m = kind == "Context Sync"
        src[m] = ix.last_any(t[m])
        ev = kind == "Event Sync"
        m = ev & (won >= 0) & (wcorr >= 0)
        src[m] = ix.before_corr(ix.scode_of(dev[m], won[m]), wcorr[m])
        m = ev & (won >= 0) & (wcorr < 0)
        src[m] = ix.last_on_stream(ix.scode_of(dev[m], won[m]), t[m])
        m = ev & (won < 0) & rg.sync[g]
        src[m] = ix.last_any(t[m])
        ok = (src >= 0) & (dst >= 0)
        w.sync_dst.append(dst[ok])
        w.sync_src.append(src[ok])
        # Stream Wait Event: the next activity on the waiting stream after the wait call waits
        # for the last one enqueued on the recorded stream before the event was recorded
        m = (kind == "Stream Wait Event") & (won >= 0)
        if m.any():
            es = ix.before_corr(ix.scode_of(dev[m], won[m]), np.where(wcorr[m] >= 0, wcorr[m], corr[m]))
            ed = ix.after_corr(ix.scode_of(dev[m], stream[m]), corr[m])
            ok = (es >= 0) & (ed >= 0) & (es != ed)
            w.ev_dst.append(ed[ok])
            w.ev_src.append(es[ok])
            edges["event_wait"] = int(ok.sum())
    return synced


def _device_joins(sy: pd.DataFrame, dl: DeviceLanes, w: Waits, edges: dict[str, int]) -> None:
    has_swe = len(sy) > 0 and bool((sy["sync_kind"] == "Stream Wait Event").any())
    if has_swe or len(dl.stream_ids) <= 1:
        return
    # untraced cross-stream waits: the latest activity of another stream of the same device
    # that ended shortly before this one started
    nD, d_start, d_end, d_scode = dl.n, dl.start, dl.end, dl.scode
    dcode = np.unique(dl.dev, return_inverse=True)[1]
    dkey = Keyer([d_start, d_end])
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
    w.ev_dst.append(np.flatnonzero(ok))
    w.ev_src.append(src[ok])
    edges["device_join"] = int(ok.sum())


def _plain_syncs(host: HostNodes, synced: np.ndarray, ix: DeviceIndex, w: Waits) -> None:
    plain = np.flatnonzero(host.rt.sync & ~synced)  # sync calls without a cuda_sync row: any stream
    if len(plain):
        dst, src = host.seg_at(plain, at_end=True), ix.last_any(host.rt.ge[plain])
        ok = (src >= 0) & (dst >= 0)
        w.sync_dst.append(dst[ok])
        w.sync_src.append(src[ok])


def _launch_queue_full(host: HostNodes, synced: np.ndarray, ix: DeviceIndex, dl: DeviceLanes, w: Waits,
                       edges: dict[str, int]) -> None:  # fmt: skip
    # kernel launches only: a memcpy / memset call waits for its own copy (the blocking-copy
    # split below), and a pageable copy is slow for reasons of its own
    rg = host.rt
    nR, r_gs, r_ge = rg.n, rg.gs, rg.ge
    g_copy = np.zeros(nR, dtype=bool)
    if len(rg.blocking) and nR:
        np.logical_or.at(g_copy, rg.grp, rg.blocking[: len(rg.grp)])
    lg = np.flatnonzero((rg.cat == LAUNCH) & ~synced & ~g_copy)
    if len(lg):
        ldur = r_ge[lg] - r_gs[lg]
        held = lg[ldur >= max(QUEUE_FULL_MIN_US, QUEUE_FULL_FACTOR * float(np.median(ldur)))]
        if len(held):
            src = ix.last_any(r_ge[held])
            se = dl.end[np.clip(src, 0, None)]
            dst = host.seg_at(held, at_end=True)
            # the slot is freed by the activity that was already running when the call began
            # (a full queue releases the call at the first end); a long first launch (lazy
            # module loading) that happens to return after some copy ended is not held by it
            ss = dl.start[np.clip(src, 0, None)]
            ok = ((src >= 0) & (dst >= 0) & (se > r_gs[held]) & (ss <= r_gs[held])
                  & (r_ge[held] - se <= QUEUE_FULL_TOL_US))  # fmt: skip
            w.sync_dst.append(dst[ok])
            w.sync_src.append(src[ok])
            edges["launch_queue_full"] = int(ok.sum())


def _blocking_ops(host: HostNodes, names: Names, ix: DeviceIndex, dl: DeviceLanes, w: Waits,
                  edges: dict[str, int]) -> None:  # fmt: skip
    if host.rt.n or not host.ops.n:
        return
    # recorded without runtime calls (Ascend level 0): an operator that blocks on the device
    # (aten::item, a device-to-host copy) waited for the latest device activity that ended
    # while it ran
    seg = host.seg
    blocking = np.array([n in SYNC_OPS for n in names.names], dtype=bool)
    cand = np.flatnonzero(seg.is_op & blocking[seg.name])
    if len(cand):
        src = ix.last_any(seg.end[cand])
        ok = (src >= 0) & (dl.end[np.clip(src, 0, None)] > seg.start[cand])
        w.sync_dst.append(cand[ok])
        w.sync_src.append(src[ok])
        edges["blocking_op"] = int(ok.sum())


def wait_edges(tr: RankTrace, dl: DeviceLanes, dn: DeviceNodes, host: HostNodes, ln: Launches, names: Names,
               edges: dict[str, int]) -> Waits:  # fmt: skip
    """Sync edges (device -> host segment), event waits (device -> device)."""
    w = Waits()
    if not dl.n:
        return w
    ix = DeviceIndex(dl, dn.corr)
    synced = _sync_rows(tr, host, ix, w, edges)
    _device_joins(tr.syncs, dl, w, edges)
    _plain_syncs(host, synced, ix, w)
    _launch_queue_full(host, synced, ix, dl, w, edges)
    if len(ln.blk_grp):
        dst = host.seg_at(ln.blk_grp, at_end=True)
        ok = dst >= 0
        w.sync_dst.append(dst[ok])
        w.sync_src.append(ln.blk_dev[ok])
    _blocking_ops(host, names, ix, dl, w, edges)
    return w
