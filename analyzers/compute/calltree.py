"""The CPU operators of a rank as call trees, and the per-row helpers the compute analysis runs over
its frames: a function applied once per category value, the rows inside the analysed step windows,
values carried down the trees, operators' self time, the outermost recognised operator of each
call, and the operator that launched each kernel."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..context import RankContext


def cat_apply(cat: pd.Series, fn, dtype=object) -> tuple[np.ndarray, np.ndarray]:
    """fn applied once per category value: (values per category + one for missing, row codes)."""
    cats = cat.cat.categories
    vals = np.array([fn(str(c)) for c in cats] + [fn("")], dtype=dtype)
    codes = cat.cat.codes.to_numpy().astype(np.int64)
    return vals, np.where(codes < 0, len(cats), codes)


def in_windows(ctx: RankContext, ts: np.ndarray) -> np.ndarray:
    return ctx.step_of(ts) >= 0


def spread(parent: np.ndarray, depth: np.ndarray, values: np.ndarray, combine) -> np.ndarray:
    """Values carried down the call trees, level by level: each op's becomes
    ``combine(its own, its parent's)``."""
    out = values.copy()
    if not len(out):
        return out
    for d in range(1, int(depth.max()) + 1):
        rows = np.flatnonzero(depth == d)
        p = parent[rows]
        ok = p >= 0
        out[rows[ok]] = combine(out[rows[ok]], out[p[ok]])
    return out


def down(parent: np.ndarray, depth: np.ndarray, flag: np.ndarray) -> np.ndarray:
    """flag spread down the call trees: an op is flagged when it or an ancestor is."""
    return spread(parent, depth, flag, np.logical_or)


def root_rows(parent: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Row of each op's top-level (depth 0) ancestor, itself at the top."""
    return spread(parent, depth, np.arange(len(parent)), lambda own, up: up)


def cpu_self_time(ops: pd.DataFrame) -> np.ndarray:
    dur = ops["dur"].to_numpy()
    parent = ops["parent"].to_numpy()
    has = parent >= 0
    child = np.bincount(parent[has], weights=dur[has], minlength=len(ops))
    return np.clip(dur - child, 0.0, None)


def outermost_recognised(parent: np.ndarray, depth_max: int, rec: np.ndarray) -> np.ndarray:
    """For each cpu op, the row of its outermost recognised ancestor (itself included), else -1."""
    n = len(parent)
    anc = np.where(rec, np.arange(n), -1)
    cur = parent.copy()
    for _ in range(depth_max + 1):
        live = np.flatnonzero(cur >= 0)
        if not len(live):
            break
        idx = cur[live]
        hit = rec[idx]
        anc[live[hit]] = idx[hit]
        nxt = np.full(n, -1, dtype=np.int64)
        nxt[live] = parent[idx]
        cur = nxt
    return anc


def launching_op(tr, ops: pd.DataFrame, krow: np.ndarray) -> np.ndarray:
    """cpu_ops row that launched each kernel (rows of tr.kernels); -1 when unknown.

    The kernel's External id names the operator that launched it when that operator encloses the
    launch call on its thread; elsewhere (traces of 2022-early 2024 write the correlation id there,
    which can collide with an unrelated op's id) the innermost op enclosing the launch call."""
    res = np.full(len(krow), -1, dtype=np.int64)
    if not len(krow) or not len(ops):
        return res
    ext_k = tr.kernels["ext_id"].to_numpy()[krow]
    ext_c = ops["ext_id"].to_numpy()
    valid = np.flatnonzero(ext_c >= 0)
    idx = pd.Index(ext_c[valid])
    if not idx.is_unique:
        keep = ~idx.duplicated(keep="last")
        idx, valid = idx[keep], valid[keep]
    pos = idx.get_indexer(ext_k)
    hit = (pos >= 0) & (ext_k >= 0)
    res[hit] = valid[pos[hit]]
    links = tr.links
    lk = links[links["gpu_kind"] == "kernel"] if len(links) else links
    lpos = pd.Index(lk["gpu_idx"].to_numpy()).get_indexer(krow) if len(lk) else np.full(len(krow), -1)
    if len(lk):
        # a match by id counts only when the op holds the launch call (same thread, in its span)
        chk = np.flatnonzero(hit & (lpos >= 0))
        ri = lk["runtime_idx"].to_numpy(np.int64)[lpos[chk]]  # the runtime frame is on the bundle's clock
        lts = tr.runtime["ts"].to_numpy()[ri]
        ltid = tr.runtime["tid"].to_numpy()[ri]
        r = res[chk]
        ok = ((ops["tid"].to_numpy()[r] == ltid) & (ops["ts"].to_numpy()[r] <= lts + 1e-3)
              & (ops["end"].to_numpy()[r] >= lts - 1e-3))  # fmt: skip
        res[chk[~ok]] = -1
        hit[chk[~ok]] = False
    miss = np.flatnonzero(~hit)
    if len(miss) and len(lk):
        lpos = lpos[miss]
        has = lpos >= 0
        if has.any():
            ri = lk["runtime_idx"].to_numpy(np.int64)[lpos[has]]
            res[miss[has]] = _enclosing(ops, tr.runtime["ts"].to_numpy()[ri], tr.runtime["tid"].to_numpy()[ri])
    return res


def _enclosing(ops: pd.DataFrame, ts: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """Innermost cpu op on thread ``tid`` with start <= ts < end (vectorised per thread)."""
    res = np.full(len(ts), -1, dtype=np.int64)
    otid = ops["tid"].to_numpy()
    ots = ops["ts"].to_numpy()
    oend = ops["end"].to_numpy()
    parent = ops["parent"].to_numpy()
    maxd = int(ops["depth"].max()) + 1
    for t in np.unique(tid):
        sel = np.flatnonzero(otid == t)
        q = np.flatnonzero(tid == t)
        if not len(sel):
            continue
        order = sel[np.argsort(ots[sel], kind="stable")]
        i = np.searchsorted(ots[order], ts[q], side="right") - 1
        cand = np.where(i >= 0, order[np.clip(i, 0, None)], -1)
        for _ in range(maxd + 1):
            bad = (cand >= 0) & (oend[np.clip(cand, 0, None)] <= ts[q])
            if not bad.any():
                break
            cand[bad] = parent[cand[bad]]
        res[q] = cand
    return res
