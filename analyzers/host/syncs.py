"""Synchronisations (``host_sync``): per step with syncs (at most ``MAX_STEP_FACTS``) and aggregate,
the runtime calls that wait for the device, blocking device-to-host copies, cuda_sync events and
(aggregate) the operators behind them; the ``syncs`` what-if sets. Also the host time blocked
waiting for the device, which the other host analyses leave out of their own."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.cpu import HostSync, SyncSource

from .. import intervals as iv
from ..context import RankContext
from ..selection import GC_NAME, div, host_window_arrays, memcpy_runtime, name_is, name_mask, pick_steps, step_pos
from ..whatif.sets import WhatIfSet, register

TOP_SOURCES = 10

# ops whose purpose implies a device-to-host synchronisation; the outermost one in a call's op
# chain names the cause (aten::item > aten::_local_scalar_dense > aten::to > aten::copy_)
SYNC_OPS = frozenset({
    "aten::item", "aten::_local_scalar_dense", "aten::cpu", "aten::numpy", "aten::tolist", "aten::nonzero",
    "aten::nonzero_numpy", "aten::masked_select", "aten::to", "aten::_to_copy", "aten::copy_", "aten::unique",
    "aten::_unique", "aten::_unique2", "aten::unique_consecutive", "aten::unique_dim", "aten::is_nonzero",
    "aten::equal", "aten::allclose", "aten::repeat_interleave", "aten::bincount", "aten::histc",
    "aten::masked_scatter", "aten::index", "aten::index_put_", "aten::_assert_async", "aten::multinomial",
    "aten::where", "aten::argwhere",
})  # fmt: skip


def blocking_dtoh_rows(tr) -> np.ndarray:
    """Runtime rows of DtoH copies that block the host: a synchronous copy call, or a pageable
    destination (the host waits for the copy either way)."""
    mi, ri = memcpy_runtime(tr, "DtoH")
    if not len(mi):
        return np.zeros(0, np.int64)
    blocking = ~name_mask(tr.runtime["name"], r"Async")[ri] | (tr.memcpy["dst"] == "Pageable").to_numpy()[mi]
    return ri[blocking]


def blocked_union(tr, tids: np.ndarray) -> iv.Intervals:
    """Host time blocked waiting for the device: sync calls and blocking DtoH copy calls."""
    rt = tr.runtime
    if not len(rt):
        return iv.EMPTY
    rows = np.union1d(np.flatnonzero((rt["kind"] == "sync").to_numpy()), blocking_dtoh_rows(tr))
    rows = rows[np.isin(rt["tid"].to_numpy()[rows], tids)]
    return iv.union(rt["ts"].to_numpy()[rows], rt["end"].to_numpy()[rows])


def enclosing_op(ops: pd.DataFrame, tid: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Row of the innermost cpu op on thread ``tid`` spanning [ts, end] (-1 when none)."""
    out = np.full(len(ts), -1, dtype=np.int64)
    otid, ots, oend, parent = (ops[c].to_numpy() for c in ("tid", "ts", "end", "parent"))
    for t in np.unique(tid):  # a handful of threads
        rows = np.flatnonzero(otid == t)
        if not len(rows):
            continue
        rows = rows[np.argsort(ots[rows], kind="stable")]
        sel = np.flatnonzero(tid == t)
        i = np.searchsorted(ots[rows], ts[sel], side="right") - 1
        cur = np.where(i >= 0, rows[np.clip(i, 0, None)], -1)
        # the last op starting before the call may have ended already: climb to an enclosing one
        for _ in range(int(ops["depth"].max()) + 2):
            bad = (cur >= 0) & (oend[np.clip(cur, 0, None)] < end[sel])
            if not bad.any():
                break
            cur[bad] = parent[cur[bad]]
        out[sel] = cur
    return out


def _sync_causes(ctx: RankContext, calls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per runtime row: the op behind it (walk from the call's External id to its cpu op, then up
    the op tree; the outermost op of SYNC_OPS names the cause) and the outermost op around it."""
    tr = ctx.trace
    rt, ops = tr.runtime, tr.cpu_ops
    n = len(calls)
    dur = rt["dur"].to_numpy()[calls]
    cause = np.full(n, "(no op)", dtype=object)
    outer = np.full(n, "(no op)", dtype=object)
    found = np.zeros(n, dtype=bool)
    if len(ops):
        eid = ops["ext_id"].to_numpy()
        has = np.flatnonzero(eid >= 0)
        # the innermost op with that id (a deeper op starts later)
        emap = pd.Series(has, index=eid[has])
        emap = emap[~emap.index.duplicated(keep="last")]
        row = (
            pd.Series(rt["ext_id"].to_numpy()[calls]).map(emap).fillna(-1).to_numpy(dtype=np.int64, copy=True)
        )
        # traces whose runtime External id is not the op's (older Kineto): the innermost op of the
        # same thread that encloses the call in time
        c_tid, c_ts, c_end = (rt[c].to_numpy()[calls] for c in ("tid", "ts", "end"))
        r = np.clip(row, 0, None)
        encloses = (ops["tid"].to_numpy()[r] == c_tid) & (ops["ts"].to_numpy()[r] <= c_ts + 1e-3)
        encloses &= ops["end"].to_numpy()[r] >= c_end - 1e-3
        row[~encloses] = -1
        lost = np.flatnonzero(row < 0)
        if len(lost):
            row[lost] = enclosing_op(ops, c_tid[lost], c_ts[lost], c_end[lost])
        found = row >= 0
        if found.any():
            parent = ops["parent"].to_numpy()
            nm = (
                ops["name"]
                if isinstance(ops["name"].dtype, pd.CategoricalDtype)
                else ops["name"].astype("category")
            )
            codes = nm.cat.codes.to_numpy()
            known_cat = np.isin(nm.cat.categories.astype(str), list(SYNC_OPS))
            cur = row.copy()
            best = np.where(found, row, -1)  # innermost op by default
            top = cur.copy()
            for _ in range(int(ops["depth"].max()) + 2):
                live = cur >= 0
                if not live.any():
                    break
                k = np.zeros(n, dtype=bool)
                c = codes[cur[live]]
                k[live] = (c >= 0) & known_cat[np.clip(c, 0, None)]
                best = np.where(k, cur, best)
                top = np.where(live, cur, top)
                nxt = np.full(n, -1, dtype=np.int64)
                nxt[live] = parent[cur[live]]
                cur = nxt
            cause[found] = nm.iloc[best[found]].astype(str).to_numpy()
            outer[found] = nm.iloc[top[found]].astype(str).to_numpy()
    # calls outside every op: the innermost Python function around the longest of them
    py = tr.python
    lost = np.flatnonzero(~found)
    if len(lost) and len(py):
        lost = lost[np.argsort(-dur[lost])][:20]
        pts, pend, ptid = py["ts"].to_numpy(), py["end"].to_numpy(), py["tid"].to_numpy()
        not_gc = ~name_is(py["name"], GC_NAME)
        cts, cend, ctid = (rt[c].to_numpy()[calls[lost]] for c in ("ts", "end", "tid"))
        for j, a, b, t in zip(lost, cts, cend, ctid):  # at most 20 calls
            m = np.flatnonzero((ptid == t) & (pts <= a) & (pend >= b) & not_gc)
            if len(m):
                outer[j] = f"(python) {py['name'].iat[m[np.argmax(pts[m])]]}"
    return cause, outer


def _sync_sources(ctx: RankContext, calls: np.ndarray, cause: np.ndarray, outer: np.ndarray) -> list[SyncSource]:
    """The ops behind the given runtime rows, by host time."""
    if not len(calls):
        return []
    dur = ctx.trace.runtime["dur"].to_numpy()[calls]
    df = pd.DataFrame({"op": cause, "outer": outer, "dur": dur})
    g = (
        df.groupby(["op", "outer"], sort=False)["dur"]
        .agg(["size", "sum"])
        .sort_values("sum", ascending=False)
    )
    return [SyncSource(op=str(o), outer_op=str(u), count=int(r["size"]), host_us=float(r["sum"]))
            for (o, u), r in g.head(TOP_SOURCES).iterrows()]  # fmt: skip


def host_sync(ctx: RankContext) -> list[Fact]:
    """``host_sync`` facts: the steps with the longest blocking time, and the aggregate with the
    operators behind the waits."""
    tr = ctx.trace
    rt = tr.runtime
    steps = np.array([w.step for w in ctx.windows])
    hs, he = host_window_arrays(ctx)
    n = len(steps)
    rows_sync = np.zeros(0, np.int64)
    if len(rt):
        sm = (rt["kind"] == "sync").to_numpy()
        rows_sync = np.flatnonzero(sm)
    s_step = ctx.host_step_of(rt["ts"].to_numpy()[rows_sync]) if len(rows_sync) else np.zeros(0, np.int64)
    rows_sync, s_step = rows_sync[s_step >= 0], s_step[s_step >= 0]
    # device-to-host copies, and the blocking ones: a synchronous copy call, or pageable destination
    mc = tr.memcpy
    d_idx = np.flatnonzero((mc["kind"] == "DtoH").to_numpy()) if len(mc) else np.zeros(0, np.int64)
    d_step = ctx.step_of(mc["ts"].to_numpy()[d_idx]) if len(d_idx) else np.zeros(0, np.int64)
    blk_rows = blocking_dtoh_rows(tr)
    blk_step = ctx.host_step_of(rt["ts"].to_numpy()[blk_rows])
    blk_rows, blk_step = blk_rows[blk_step >= 0], blk_step[blk_step >= 0]
    blk_dur = rt["dur"].to_numpy()[blk_rows]
    sy = tr.syncs
    e_step = ctx.step_of(sy["ts"].to_numpy()) if len(sy) else np.zeros(0, np.int64)
    if not len(rows_sync) and not len(blk_rows) and not (d_step >= 0).any() and not (e_step >= 0).any():
        return []

    def per_step(st, vals=None):
        out = np.zeros(n)
        pos, ok = step_pos(steps, st)
        np.add.at(out, pos[ok], 1 if vals is None else vals[ok])
        return out

    sdur = rt["dur"].to_numpy()[rows_sync] if len(rows_sync) else np.zeros(0)
    sc, su = per_step(s_step), per_step(s_step, sdur)
    longest = np.zeros(n)
    pos, ok = step_pos(steps, s_step)
    np.maximum.at(longest, pos[ok], sdur[ok])
    dbytes = mc["bytes"].to_numpy()[d_idx].clip(0) if len(d_idx) else np.zeros(0)
    dc, db = per_step(d_step), per_step(d_step, dbytes.astype(np.float64))
    bc, bu = per_step(blk_step), per_step(blk_step, blk_dur)
    ec = per_step(e_step)
    eu = per_step(e_step, sy["dur"].to_numpy()) if len(sy) else np.zeros(n)
    api = rt["name"].to_numpy()[rows_sync].astype(str) if len(rows_sync) else np.zeros(0, dtype=object)

    def make(idx, step, sources):
        sel = np.isin(s_step, steps[idx])
        cnt = pd.Series(api[sel]).value_counts().head(6)
        top3 = rows_sync[sel][np.argsort(-sdur[sel])[:3]]
        w = float((he - hs)[idx].sum())
        blocking_us = float(su[idx].sum() + bu[idx].sum())
        return HostSync(
            rank=tr.rank, step=step, window_us=w,
            sync_calls_count=int(sc[idx].sum()), sync_calls_us=float(su[idx].sum()), longest_sync_us=float(longest[idx].max()),
            dtoh_count=int(dc[idx].sum()), dtoh_bytes=int(db[idx].sum()),
            dtoh_blocking_count=int(bc[idx].sum()), dtoh_blocking_us=float(bu[idx].sum()),
            blocking_us=blocking_us, blocking_ratio=div(blocking_us, w),
            sync_events_count=int(ec[idx].sum()), sync_events_us=float(eu[idx].sum()), top_sources=sources,
            evidence=Evidence(
                time_ranges_us=[(float(rt["ts"].iat[r]), float(rt["end"].iat[r])) for r in top3],
                events=[str(k) for k in cnt.index], counts={str(k): int(v) for k, v in cnt.items()},
                note="sync calls: runtime kind 'sync'; blocking DtoH: copy call without 'Async' or to pageable memory; "
                     "time ranges: the longest sync calls",
            ),
        )  # fmt: skip

    active = {int(s): float(su[i] + bu[i]) for i, s in enumerate(steps) if sc[i] + bc[i] + dc[i] + ec[i] > 0}
    keep = pick_steps(active)
    facts: list[Fact] = [make(np.array([i]), int(s), []) for i, s in enumerate(steps) if int(s) in keep]
    calls = np.concatenate([rows_sync, blk_rows])
    cause, outer = _sync_causes(ctx, calls)
    _register_syncs(ctx, calls, cause)
    facts.append(make(np.arange(n), None, _sync_sources(ctx, calls, cause, outer)))
    return facts


def _register_syncs(ctx: RankContext, calls: np.ndarray, cause: np.ndarray) -> None:
    """What-if sets of the synchronising calls: removing one removes its wait. Implicit: behind an
    op that reads device data back (.item(), .cpu(), nonzero...); explicit: the others."""
    if not len(calls):
        return
    rt = ctx.trace.runtime
    tid, ts, end = (rt[c].to_numpy()[calls] for c in ("tid", "ts", "end"))
    implicit = np.isin(cause.astype(str), list(SYNC_OPS))
    for name, m, what in (("implicit_syncs", implicit, "device-to-host reads that wait for the device"),
                          ("explicit_syncs", ~implicit, "synchronize calls that wait for the device"),
                          ("syncs", np.ones(len(calls), dtype=bool), "every call that waits for the device")):
        if m.any():
            register(ctx, WhatIfSet.of_intervals(name, what, tid[m], ts[m], end[m], drop_waits=True))
