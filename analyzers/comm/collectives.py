"""The rank's collectives: those issued inside the analysed steps, as one plain frame
(``rank_collectives``, cached in ``ctx.shared['comm_collectives']`` for the digest), when each
was issued, the ranks of its group, the split sizes of its all-to-all, and the union of the
rank's non-communication kernels it is measured against (``compute_union``, cached in
``ctx.shared['comm_compute_union']``). Read by the comm analyzer's per-rank and cross-rank
stages, by buckets, parallel and the digest."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from hermes_kb.trace.args import decode
from hermes_kb.trace.bundle import RankTrace

from .. import intervals as iv
from ..context import RankContext
from ..selection import COLLECTIVE_OP, name_mask, union_of


def parse_ranks(text: str) -> list[int]:
    """A recorded rank list (``Process Group Ranks``, a process-group table's ``ranks``): its
    JSON, else the integers in the text."""
    if not text or text == "[]":
        return []
    v = decode(text)
    if v is None:  # not JSON (JSON's null gives no integer either)
        return [int(x) for x in re.findall(r"-?\d+", text)]
    return [int(x) for x in v] if isinstance(v, list) else []


def rank_collectives(ctx: RankContext) -> pd.DataFrame:
    """The rank's collectives issued in an analysed step (see ``issue_time``), as a plain
    frame with ``step``, ``pg`` (name or 'unknown'), ``msg_bytes`` (max of in/out bytes, -1 unknown)
    and ``n`` (group size, -1 unknown). Cached in ``ctx.shared['comm_collectives']``."""
    cached = ctx.shared.get("comm_collectives")
    if cached is not None:
        return cached
    c = ctx.trace.collectives
    cols = [
        "name",
        "kind",
        "ts",
        "dur",
        "end",
        "source",
        "kernel_idx",
        "pg_name",
        "pg_desc",
        "pg_ranks",
        "group_size",
        "dtype",
        "in_bytes",
        "out_bytes",
        "seq",
        "collective",
        "in_split",
        "out_split",
    ]
    if not len(c):
        out = pd.DataFrame({k: pd.Series(dtype=object) for k in cols + ["step", "pg", "msg_bytes", "n"]})
    else:
        keep = c["collective"].astype(str).to_numpy() != "wait"
        anchor = issue_time(ctx)[keep]
        c = c.loc[keep, cols]
        step = ctx.step_of(anchor)
        c = c[step >= 0].copy()
        c["step"] = step[step >= 0]
        out = pd.DataFrame(
            {k: c[k].astype(str) if str(c[k].dtype) == "category" else c[k] for k in c.columns}
        )
        out["pg"] = out["pg_name"].where(out["pg_name"] != "", "unknown")
        out["msg_bytes"] = np.maximum(out["in_bytes"].to_numpy(), out["out_bytes"].to_numpy())
        gs = out["group_size"].to_numpy()
        lens = {s: len(parse_ranks(s)) for s in out["pg_ranks"].unique()}  # a few distinct groups
        nr = out["pg_ranks"].map(lens).to_numpy(dtype=np.int64) if len(out) else np.zeros(0, dtype=np.int64)
        out["n"] = np.where(gs > 0, gs, np.where(nr > 0, nr, -1)).astype(np.int64)
        out = out.reset_index(drop=True)
    ctx.shared["comm_collectives"] = out
    return out


def issue_time(ctx: RankContext) -> np.ndarray:
    """When each collective was issued: the start of the CPU op that recorded it
    (record_param_comms, on the same clock as the step annotations), else its own start.
    Steps are assigned by this time, so that a collective the CPU issued in step N but the
    device ran later still belongs to step N. (The kernel's launch call is not used: some
    traces, e.g. param/dlrm_kineto_8rank, carry runtime events shifted from the CPU ops.)"""
    t = ctx.trace
    c = t.collectives
    out = c["ts"].to_numpy(float).copy()
    cidx = c["cpu_idx"].to_numpy()
    has_cpu = (cidx >= 0) & (cidx < len(t.cpu_ops))
    out[has_cpu] = t.cpu_ops["ts"].to_numpy(float)[cidx[has_cpu]]
    return out


def _split_list(text: str) -> list[float]:
    if not text or text == "[]":
        return []
    v = decode(text)
    if v is None:  # not JSON (JSON's null gives no number either)
        return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", text)]
    if not isinstance(v, list):
        return []
    try:
        return [float(x) for x in v]
    except (TypeError, ValueError):
        return []


def split_imbalance(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per collective, from the all-to-all split sizes the trace records (``In split size`` /
    ``Out split size``, elements per peer): the side (send or receive) whose pieces are the
    most uneven, as (sum of its pieces, largest piece x number of peers). A pairwise exchange
    finishes with its largest piece, so with every piece as large as the largest one the
    exchange would take the same time: sum / (max x n) is the share of that time the bytes
    actually need. (0, 0) where no split list of at least two peers with data is recorded,
    and for every collective that is not an all_to_all."""
    n = len(df)
    total, cost = np.zeros(n), np.zeros(n)
    if not n or "in_split" not in df.columns:
        return total, cost
    kinds = df["kind"].to_numpy()
    cache: dict[str, list[float]] = {}
    for i in np.flatnonzero(kinds == "all_to_all").tolist():
        best = None
        for text in (df["in_split"].iat[i], df["out_split"].iat[i]):
            t = str(text)
            parts = cache.get(t)
            if parts is None:
                parts = cache[t] = _split_list(t)
            if len(parts) < 2 or max(parts) <= 0:
                continue
            s, c = float(sum(parts)), float(max(parts)) * len(parts)
            if best is None or 1.0 - s / c > 1.0 - best[0] / best[1]:
                best = (s, c)
        if best is not None:
            total[i], cost[i] = best
    return total, cost


# sources whose durations are the collective's own run (the transfer and the wait for peers), so
# that their exposed part can be measured: device kernels, and gloo's spans on its worker threads
TIMED_SOURCES = ("kernel", "host")


def compute_union(ctx: RankContext) -> iv.Intervals:
    """Union of the rank's non-communication kernels (every kernel that is not a collective).
    On a CPU-only rank whose collectives ran on gloo's threads (source ``host``): the union of
    the top-level operators of its other threads that are not collectives, the work a
    collective can hide behind. Cached in ``ctx.shared['comm_compute_union']``."""
    cached = ctx.shared.get("comm_compute_union")
    if cached is not None:
        return cached
    k = ctx.trace.kernels
    c = ctx.trace.collectives
    if not len(k) and len(c) and (c["source"].astype(str).to_numpy() == "host").any():
        out = _host_compute(ctx)
    elif not len(k):
        out = iv.EMPTY
    else:
        comm_idx = (
            ctx.trace.collectives["kernel_idx"].to_numpy() if len(ctx.trace.collectives) else np.zeros(0)
        )
        mask = np.ones(len(k), dtype=bool)
        comm_idx = comm_idx[(comm_idx >= 0) & (comm_idx < len(k))].astype(np.int64)
        mask[comm_idx] = False
        out = iv.union(k["ts"].to_numpy()[mask], k["end"].to_numpy()[mask])
    ctx.shared["comm_compute_union"] = out
    return out


def _host_compute(ctx: RankContext) -> iv.Intervals:
    ops = ctx.trace.cpu_ops
    top = (ops["depth"].to_numpy() == 0) & ~name_mask(ops["name"], COLLECTIVE_OP) if len(ops) else np.zeros(0, bool)
    return union_of(ops, top)


def host_collective_spans(trace: RankTrace, tid: int | None = None) -> iv.Intervals:
    """The union of the rank's gloo spans (collectives of source ``host``), all of them or those
    issued by thread ``tid``."""
    c = trace.collectives
    if not len(c):
        return iv.EMPTY
    mine = c["source"].astype(str).to_numpy() == "host"
    if tid is not None:
        cidx = c["cpu_idx"].to_numpy(np.int64)
        ops = trace.cpu_ops
        mine &= (cidx >= 0) & (cidx < len(ops))
        mine[mine] = ops["tid"].to_numpy(np.int64)[cidx[mine]] == tid
    return union_of(c, mine)


def host_exposed(ctx: RankContext) -> tuple[np.ndarray, iv.Intervals]:
    """On a rank with host (gloo) collectives: the thread that issued most of them (the
    training thread) and the stretches in which one of them runs while that thread runs no
    other operator: the time the step waits for communication."""
    c = ctx.trace.collectives
    host = c["source"].astype(str).to_numpy() == "host" if len(c) else np.zeros(0, bool)
    if not host.any():
        return np.zeros(0, np.int64), iv.EMPTY
    cidx = c["cpu_idx"].to_numpy(np.int64)[host]
    ops = ctx.trace.cpu_ops
    cidx = cidx[(cidx >= 0) & (cidx < len(ops))]
    if not len(cidx):
        return np.zeros(0, np.int64), iv.EMPTY
    tids, counts = np.unique(ops["tid"].to_numpy(np.int64)[cidx], return_counts=True)
    return np.array([tids[np.argmax(counts)]], np.int64), iv.subtract(host_collective_spans(ctx.trace), compute_union(ctx))


def group_ranks(ctx: RankContext, pg_name: str, pg_ranks: str) -> list[int]:
    """A group's ranks: its recorded rank list, else those of the trace's process-group table
    entry of that name."""
    ranks = parse_ranks(pg_ranks)
    if ranks or not pg_name or pg_name == "unknown":
        return ranks
    for pg in ctx.trace.meta.process_groups:
        if str(pg.get("pg_name")) == pg_name:
            return [int(r) for r in pg.get("ranks") or []]
    return []


__all__ = ["TIMED_SOURCES", "compute_union", "group_ranks", "host_collective_spans", "host_exposed", "issue_time", "parse_ranks", "rank_collectives", "split_imbalance"]
