"""HCCL transfers on an Ascend NPU: small packets (``npu_small_packets``), SDMA bandwidth with and
without a Cube task running (``npu_sdma_contention``), unaligned transfer tasks
(``npu_byte_alignment``) and RDMA retransmissions (``npu_rdma_retransmission``)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.npu import NpuByteAlignment, NpuRdmaRetransmission, NpuSdmaContention, NpuSmallPackets

from .. import intervals as iv
from ..context import RankContext
from .tasks import compute_union, ratio, window_mask, window_us

SMALL_PACKET_BYTES = 16e6  # msprof-analyze packet analysis: SDMA packets under 16 MB
CUBE_RE = re.compile(r"matmul|batchmatmul|conv|gemm|flashattention|grouped_matmul", re.I)
ALIGN_BYTES = 512  # the paper's HCCS rule; msprof-analyze's ByteAlignmentChecker (_BASE_SIZE, _MIN_SIZE)
TRANSFER_TASKS = ("Memcpy", "Reduce_Inline")


def small_packets(ctx: RankContext) -> Fact | None:
    pk = ctx.trace.extras.get("comm_packets")
    ops = ctx.trace.extras.get("comm_ops")
    if pk is None or not len(pk) or ops is None:
        return None
    pk = pk[pk["transport"].isin(["HCCS", "RDMA", "PCIE", "SIO"])]  # per link; SDMA is their total
    if not len(pk):
        return None
    vol = pk["packet_bytes"] * pk["count"]
    small = pk["packet_bytes"] < SMALL_PACKET_BYTES
    transport = "RDMA" if (pk["transport"] == "RDMA").any() and vol[pk["transport"] == "RDMA"].sum() > vol[pk["transport"] != "RDMA"].sum() else "SDMA"  # fmt: skip
    return NpuSmallPackets(
        rank=ctx.rank, transport=transport, threshold_bytes=SMALL_PACKET_BYTES, volume_bytes=float(vol.sum()),
        small_volume_bytes=float(vol[small].sum()), small_volume_ratio=ratio(vol[small].sum(), vol.sum()),
        small_count=int(pk.loc[small, "count"].sum()),
        small_count_ratio=ratio(pk.loc[small, "count"].sum(), pk["count"].sum()), small_us=float(pk.loc[small, "time_us"].sum()),
        transit_us=float(pk["time_us"].sum()),
        evidence=Evidence(events=list(dict.fromkeys(pk.loc[small, "name"].astype(str)))[:5],
                          note="communication.json Size Distribution (HCCS / PCIE / SIO / RDMA packets)"),
    )  # fmt: skip


def sdma_contention(ctx: RankContext) -> Fact | None:
    t = ctx.trace.extras.get("hccl_tasks")
    k = ctx.trace.kernels
    if t is None or not len(t) or not len(k) or "op_type" not in k.columns:
        return None
    t = t[(t["transport"].astype(str) == "SDMA") & (t["size_bytes"].fillna(0) > 0) & (t["dur"] > 0)]
    t = t[t["link_type"].astype(str).isin(["HCCS", "PCIE", "SIO"])]
    if len(t) < 2:
        return None
    label = k["op_type"].astype(str) + " " + k["name"].astype(str)
    cube = k[label.str.contains(CUBE_RE).to_numpy() & (k["task_type"].astype(str) != "HCCL").to_numpy()]
    cu = iv.union(cube["ts"].to_numpy(float), cube["end"].to_numpy(float))
    ov = iv.overlap_length(t["ts"].to_numpy(float), t["end"].to_numpy(float), cu) > 0
    size, dur = t["size_bytes"].to_numpy(float), t["dur"].to_numpy(float)
    if not ov.any() or ov.all():
        return None
    bw_ov = size[ov].sum() / dur[ov].sum() / 1e3  # bytes/µs -> GB/s
    bw_al = size[~ov].sum() / dur[~ov].sum() / 1e3
    loss = max(0.0, 1.0 - bw_ov / bw_al) if bw_al > 0 else 0.0
    return NpuSdmaContention(
        rank=ctx.rank, overlapped_count=int(ov.sum()), overlapped_bytes=float(size[ov].sum()), overlapped_gbps=float(bw_ov),
        alone_count=int((~ov).sum()), alone_gbps=float(bw_al), bandwidth_loss_ratio=float(min(loss, 1.0)),
        overlapped_us=float(dur[ov].sum()), lost_us=float(dur[ov].sum() * min(loss, 1.0)),
    )  # fmt: skip


def byte_alignment(ctx: RankContext) -> Fact | None:
    """Per transfer task, as msprof-analyze's byte-alignment check: SDMA Memcpy / Reduce_Inline tasks
    off the chip and over 512 bytes, unaligned when size % 512 != 0. What it costs is measured, not
    assumed: each unaligned task against the bandwidth of the aligned tasks of its type in the same
    HCCL operation (they run side by side on the other links), else of its type and link on the rank."""
    t = ctx.trace.extras.get("hccl_tasks")
    need = {"ts", "end", "dur", "size_bytes", "transport", "link_type"}
    if t is None or not len(t) or not need <= set(t.columns):
        return None
    if "task_type" not in t.columns:  # the task's name is its type in trace_view.json and the db
        t = t.assign(task_type=t["name"] if "name" in t.columns else "")
    size = t["size_bytes"].fillna(0).to_numpy(float)
    keep = ((t["transport"].astype(str).to_numpy() == "SDMA") & (t["link_type"].astype(str).to_numpy() != "ON_CHIP")
            & np.isin(t["task_type"].astype(str).to_numpy(), TRANSFER_TASKS) & (size > ALIGN_BYTES)
            & (t["dur"].to_numpy(float) > 0) & window_mask(ctx, t["ts"].to_numpy(float)))  # fmt: skip
    t = t[keep]
    if not len(t):
        return None
    ts, end = t["ts"].to_numpy(float), t["end"].to_numpy(float)
    size, dur = t["size_bytes"].to_numpy(float), t["dur"].to_numpy(float)
    un = np.mod(size, ALIGN_BYTES) != 0
    # the HCCL operation each task belongs to: the rank's collective whose span holds its start
    c = ctx.trace.collectives
    c = c[c["source"].astype(str).to_numpy() == "kernel"] if len(c) else c
    op = np.full(len(t), -1, dtype=np.int64)
    if len(c):
        order = np.argsort(c["ts"].to_numpy(float), kind="stable")
        cs, ce = c["ts"].to_numpy(float)[order], c["end"].to_numpy(float)[order]
        i = np.searchsorted(cs, ts, side="right") - 1
        ok = (i >= 0) & (ts < ce[np.clip(i, 0, None)])
        op = np.where(ok, order[np.clip(i, 0, None)], -1)
    df = pd.DataFrame({"op": op, "type": t["task_type"].astype(str).to_numpy(), "link": t["link_type"].astype(str).to_numpy(),
                       "size": size, "dur": dur, "un": un})  # fmt: skip
    al = df[~df["un"]]
    by_op = al[al["op"] >= 0].groupby(["op", "type"])[["size", "dur"]].sum()
    by_link = al.groupby(["type", "link"])[["size", "dur"]].sum()
    excess, known = 0.0, False
    for r in df[df["un"]].itertuples(index=False):
        ref = by_op.loc[(r.op, r.type)] if (r.op, r.type) in by_op.index else (
            by_link.loc[(r.type, r.link)] if (r.type, r.link) in by_link.index else None)  # fmt: skip
        if ref is None or not ref["dur"] > 0:
            continue
        known = True
        excess += max(0.0, r.dur - r.size / (ref["size"] / ref["dur"]))
    cu = compute_union(ctx)
    uu = iv.union(ts[un], end[un]) if un.any() else iv.EMPTY
    exposed = iv.length(iv.subtract(uu, cu)) if un.any() else 0.0
    ops_all = df.loc[df["op"] >= 0, "op"]
    names = c["name"].astype(str).to_numpy() if len(c) else np.zeros(0, dtype=object)
    bad_ops = sorted(set(df.loc[df["un"] & (df["op"] >= 0), "op"].tolist()))
    window = window_us(ctx) if ctx.windows else float(end.max() - ts.min())
    return NpuByteAlignment(
        rank=ctx.rank, tasks_count=int(len(df)), task_time_us=float(dur.sum()), task_size_bytes=float(size.sum()),
        ops_count=int(ops_all.nunique()), unaligned_count=int(un.sum()), unaligned_ops_count=len(bad_ops),
        unaligned_size_bytes=float(size[un].sum()), unaligned_time_us=float(dur[un].sum()),
        unaligned_time_ratio=ratio(dur[un].sum(), dur.sum()), excess_us=float(excess) if known else None,
        unaligned_exposed_us=float(exposed), window_us=float(window),
        evidence=Evidence(
            time_ranges_us=[(float(ts[un].min()), float(end[un].max()))] if un.any() else [],
            events=[str(names[i]) for i in bad_ops[:5]],
            counts={"tasks": int(len(df)), "unaligned": int(un.sum())},
            note="HCCL SDMA Memcpy / Reduce_Inline tasks off the chip over 512 B (msprof-analyze's byte-alignment "
                 "check); excess = unaligned task time beyond size / bandwidth of the aligned tasks of the same type "
                 "in the same operation (else same type and link on the rank)",
        ),
    )  # fmt: skip


def rdma(ctx: RankContext) -> Fact | None:
    t = ctx.trace.extras.get("hccl_tasks")
    if t is None or not len(t):
        return None
    t = t[(t["transport"].astype(str) == "RDMA") & (t["size_bytes"].fillna(0) > 0)]
    if len(t) < 3:
        return None
    dur = t["dur"].to_numpy(float)
    med = float(np.median(dur))
    slow = (dur >= 10 * med) & (dur >= 1000.0)
    return NpuRdmaRetransmission(rank=ctx.rank, rdma_count=int(len(dur)), median_us=med, slow_count=int(slow.sum()),
                                 slow_us=float(dur[slow].sum()), max_us=float(dur.max()))  # fmt: skip


__all__ = ["ALIGN_BYTES", "CUBE_RE", "SMALL_PACKET_BYTES", "TRANSFER_TASKS", "byte_alignment", "rdma",
           "sdma_contention", "small_packets"]  # fmt: skip
