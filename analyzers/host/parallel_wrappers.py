"""Data-parallel wrappers at work on the host: ``ddp_buffer_broadcast`` (DistributedDataParallel's
buffer broadcast at each forward), ``data_parallel`` (nn.DataParallel's replicate / scatter /
gather / reduce functions) and ``sync_batchnorm`` (SyncBatchNorm's functions and the device
waits inside them); each registers the host time it measures as a what-if set."""

from __future__ import annotations

import numpy as np

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.cpu import DataParallelReplication, DdpBufferBroadcast, SyncBatchNormSync

from .. import intervals as iv
from ..context import RankContext
from ..selection import div
from ..whatif.sets import WhatIfSet, register
from .syncs import blocking_dtoh_rows

DDP_FORWARD = "DistributedDataParallel.forward"
BUFFER_SYNC_OPS = ("aten::flatten_dense_tensors", "aten::unflatten_dense_tensors", "c10d::broadcast_")
# torch.nn.parallel._functions: the autograd functions DataParallel runs (their backward nodes
# are named <Function>Backward)
DP_REPLICATE, DP_REDUCE = ("Broadcast",), ("ReduceAddCoalesced",)
DP_SCATTER_GATHER = ("Scatter", "Gather")
SYNCBN_FWD, SYNCBN_BWD = "SyncBatchNorm", "SyncBatchNormBackward"


def ddp_buffer_broadcast(ctx: RankContext) -> list[Fact]:
    """DistributedDataParallel's buffer broadcast at the start of each forward."""
    tr = ctx.trace
    ann, ops = tr.annotations, tr.cpu_ops
    if not len(ann) or not len(ops):
        return []
    fwd = ann[(ann["name"].astype(str) == DDP_FORWARD).to_numpy() & (ctx.step_of(ann["ts"].to_numpy()) >= 0)]
    if not len(fwd):
        return []
    phase_ok = set(BUFFER_SYNC_OPS) | {"aten::copy_", "record_param_comms"}
    top = ops[(ops["depth"].to_numpy() == 0)]
    spans: list[tuple[int, float, float]] = []
    n_bc = n_cp = 0
    for r in fwd.itertuples():
        t = top[(top["tid"].to_numpy() == r.tid) & (top["ts"].to_numpy() >= r.ts) & (top["ts"].to_numpy() < r.end)]
        t = t.sort_values("ts")
        nm = t["name"].astype(str).to_numpy()
        first = np.flatnonzero(np.isin(nm, BUFFER_SYNC_OPS))
        if not len(first):
            continue
        i0 = j = int(first[0])
        while j + 1 < len(nm) and nm[j + 1] in phase_ok:
            j += 1
        seg = nm[i0:j + 1]
        n_bc += int((seg == "c10d::broadcast_").sum())
        n_cp += int((seg == "aten::copy_").sum())
        spans.append((int(r.tid), float(t["ts"].iloc[i0]), float(t["end"].iloc[j])))
    if not spans:
        return []
    tid, s, e = (np.array(x) for x in zip(*spans))
    register(ctx, WhatIfSet.of_intervals("ddp_buffer_sync", "DistributedDataParallel's buffer broadcast at each forward",
                                         tid.astype(np.int64), s.astype(float), e.astype(float)))  # fmt: skip
    total = float((e - s).sum())
    window = ctx.windows_us
    longest = np.argsort(-(e - s))[:3]
    return [DdpBufferBroadcast(
        rank=tr.rank, steps_count=len(ctx.windows), window_us=window, forward_calls_count=len(spans),
        broadcasts_count=n_bc, copies_count=n_cp, broadcast_host_us=total, broadcast_ratio=div(total, window),
        evidence=Evidence(time_ranges_us=[(float(s[i]), float(e[i])) for i in longest], events=list(BUFFER_SYNC_OPS),
                          counts={"c10d::broadcast_": n_bc, "aten::copy_": n_cp, DDP_FORWARD: len(spans)},
                          note="per forward: from the first flatten / broadcast to the last copy back into the buffers"),
    )]  # fmt: skip


def _named_ops(ctx: RankContext, names) -> np.ndarray:
    ops = ctx.trace.cpu_ops
    if not len(ops):
        return np.zeros(0, dtype=bool)
    return ops["name"].isin(list(names)).to_numpy() & (ctx.step_of(ops["ts"].to_numpy()) >= 0)


def data_parallel(ctx: RankContext) -> list[Fact]:
    """torch.nn.DataParallel's replicate / scatter / gather / reduce functions."""
    tr = ctx.trace
    rep = _named_ops(ctx, DP_REPLICATE)
    if not rep.any():  # Scatter / Gather alone are too generic a name to stand for DataParallel
        return []
    sg = _named_ops(ctx, DP_SCATTER_GATHER)
    red = _named_ops(ctx, DP_REDUCE)
    bwd = _named_ops(ctx, [f"{n}Backward" for n in DP_REPLICATE + DP_REDUCE + DP_SCATTER_GATHER])
    ops = tr.cpu_ops
    allm = rep | sg | red | bwd
    t, s, e = (ops[c].to_numpy()[allm] for c in ("tid", "ts", "end"))
    u = iv.union(s, e)
    register(ctx, WhatIfSet.of_intervals("data_parallel", "DataParallel's replicate, scatter, gather and reduce",
                                         t.astype(np.int64), s, e))  # fmt: skip
    total = iv.length(u)
    window = ctx.windows_us
    st = ctx.step_of(ops["ts"].to_numpy())
    threads = len(np.unique(ops["tid"].to_numpy()[st >= 0]))
    return [DataParallelReplication(
        rank=tr.rank, steps_count=len(ctx.windows), window_us=window, replicate_calls_count=int(rep.sum()),
        scatter_gather_calls_count=int(sg.sum()), reduce_calls_count=int(red.sum()), dp_host_us=total,
        dp_ratio=div(total, window), threads_count=threads,
        evidence=Evidence(events=["Broadcast", "Scatter", "Gather", "ReduceAddCoalesced"],
                          counts={"Broadcast": int(rep.sum()), "Scatter/Gather": int(sg.sum()),
                                  "ReduceAddCoalesced": int(red.sum())}),
    )]  # fmt: skip


def sync_batchnorm(ctx: RankContext) -> list[Fact]:
    """SyncBatchNorm's forward / backward functions and the host time blocked inside them."""
    tr = ctx.trace
    fwd, bwd = _named_ops(ctx, [SYNCBN_FWD]), _named_ops(ctx, [SYNCBN_BWD])
    if not fwd.any() and not bwd.any():
        return []
    ops = tr.cpu_ops
    m = fwd | bwd
    t, s, e = (ops[c].to_numpy()[m] for c in ("tid", "ts", "end"))
    u = iv.union(s, e)
    register(ctx, WhatIfSet.of_intervals("sync_batchnorm", "SyncBatchNorm forward and backward functions",
                                         t.astype(np.int64), s, e))  # fmt: skip
    blocking_us, n_block = 0.0, 0
    rt = tr.runtime
    if len(rt):
        rows = np.union1d(np.flatnonzero((rt["kind"] == "sync").to_numpy()), blocking_dtoh_rows(tr))
        if len(rows):
            FW = iv.union(ops["ts"].to_numpy()[fwd], ops["end"].to_numpy()[fwd]) if fwd.any() else iv.EMPTY
            rs, re_ = rt["ts"].to_numpy()[rows], rt["end"].to_numpy()[rows]
            hit = iv.covered_by(rs, FW) if len(FW[0]) else np.zeros(len(rows), dtype=bool)
            n_block, blocking_us = int(hit.sum()), float((re_ - rs)[hit].sum())
    total = iv.length(u)
    window = ctx.windows_us
    return [SyncBatchNormSync(
        rank=tr.rank, steps_count=len(ctx.windows), window_us=window, forward_calls_count=int(fwd.sum()),
        backward_calls_count=int(bwd.sum()), syncbn_us=total, blocking_us=blocking_us, blocking_calls_count=n_block,
        syncbn_ratio=div(total, window), blocking_ratio=div(blocking_us, window),
        evidence=Evidence(events=[SYNCBN_FWD, SYNCBN_BWD],
                          counts={SYNCBN_FWD: int(fwd.sum()), SYNCBN_BWD: int(bwd.sum()), "blocking_calls": n_block}),
    )]  # fmt: skip
