"""Collectives per process group and kind on one rank (fact ``comm_stats``): count, time,
exposed time (the part of each collective not covered by the union of the rank's
non-communication kernels), bandwidth against the link's peak (bandwidth.py), message sizes
(< 1 MiB, 1-32 MiB, >= 32 MiB; 32 MB is the paper's small-packet threshold), 512-byte alignment
(the paper's HCCS rule) and the imbalance of all-to-all splits. Formulas: docs/analysis/comm.md."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from hermes_kb.core.devices import UNKNOWN_LINK, Link
from hermes_kb.facts.base import Evidence
from hermes_kb.facts.comm import CommStats

from .. import intervals as iv
from ..context import RankContext
from .bandwidth import group_bandwidth, group_link
from .collectives import TIMED_SOURCES, group_ranks, split_imbalance

MIB = 1024 * 1024
SMALL_MESSAGE_BYTES = 32 * MIB  # paper (HERMES_NOTES, Communication): 32 MB small-packet threshold
TINY_MESSAGE_BYTES = 1 * MIB
SCALAR_MESSAGE_BYTES = 64  # at most 16 float32 values (a loss, a few metrics): not gradients, not one layer's bias
ALIGNMENT_BYTES = 512  # paper (HERMES_NOTES, Table 4): HCCS transfers must be multiples of 512 B
MAX_GROUP_FACTS = 10


def group_stats(ctx: RankContext, df: pd.DataFrame, cu: iv.Intervals,
                is_timed: np.ndarray) -> list[CommStats]:  # fmt: skip
    """One fact per (process group, kind, source) of the rank's collectives ``df``
    (collectives.py ``rank_collectives``), the MAX_GROUP_FACTS with the most time; ``cu`` = the
    union of the rank's non-communication kernels."""
    g = _per_group(_work(df, cu, is_timed))
    extra = _group_meta(df)
    facts: list = []
    left_out = max(len(g) - MAX_GROUP_FACTS, 0)
    for row in g.head(MAX_GROUP_FACTS).itertuples(index=False):  # one per (group, kind): a handful
        key = (row.pg, row.pg_ranks, row.kind, row.source)
        ex = extra.loc[key]
        if row.source == "host":
            row = _host_exposed(df, row, cu)
        facts.append(_group_fact(ctx, row, ex, left_out))
    return facts


def _host_exposed(df: pd.DataFrame, row: Any, cu: iv.Intervals) -> Any:
    """gloo's threads run several collectives of a group at once (a DDP bucket still in flight when
    the next is issued): a group's exposed time is the length of the union of its spans less the
    compute, not the sum over collectives; the same for its scalar messages."""
    m = ((df["pg"] == row.pg) & (df["pg_ranks"] == row.pg_ranks) & (df["kind"] == row.kind)
         & (df["source"] == "host")).to_numpy()  # fmt: skip
    ts, end = df["ts"].to_numpy(float), df["end"].to_numpy(float)
    size = df["msg_bytes"].to_numpy()
    scalar = m & (size >= 0) & (size <= SCALAR_MESSAGE_BYTES)
    return row._replace(exposed=iv.length(iv.subtract(iv.union(ts[m], end[m]), cu)),
                        scalar_exposed=iv.length(iv.subtract(iv.union(ts[scalar], end[scalar]), cu)))  # fmt: skip


def _work(df: pd.DataFrame, cu: iv.Intervals, is_timed: np.ndarray) -> pd.DataFrame:
    """Per collective: its time, exposed time, size classes, alignment and split imbalance."""
    ts, end, dur = df["ts"].to_numpy(float), df["end"].to_numpy(float), df["dur"].to_numpy(float)
    exposed = np.where(is_timed, dur - iv.overlap_length(ts, end, cu), np.nan)
    size = df["msg_bytes"].to_numpy()
    sized = size >= 0
    split_total, split_cost = split_imbalance(df)
    split_any = split_cost > 0
    return pd.DataFrame(
        {
            "pg": df["pg"],
            "pg_ranks": df["pg_ranks"],
            "kind": df["kind"],
            "source": df["source"],
            "dur": dur,
            "exposed": exposed,
            "sized": sized,
            "size": np.where(sized, size, 0),
            "sized_dur": np.where(sized, dur, 0.0),
            "tiny": sized & (size < TINY_MESSAGE_BYTES),
            "scalar": sized & (size <= SCALAR_MESSAGE_BYTES),
            "scalar_exposed": np.where(sized & (size <= SCALAR_MESSAGE_BYTES), exposed, 0.0),
            "mid": sized & (size >= TINY_MESSAGE_BYTES) & (size < SMALL_MESSAGE_BYTES),
            "big": sized & (size >= SMALL_MESSAGE_BYTES),
            "nonempty": sized & (size > 0),
            "unaligned": sized & (size > 0) & (size % ALIGNMENT_BYTES != 0),
            "n": df["n"],
            "mib": sized & (size >= TINY_MESSAGE_BYTES),
            "msg_bw": np.where(
                sized & (size >= TINY_MESSAGE_BYTES) & (dur > 0), size / np.maximum(dur, 1e-9) / 1e3, 0.0
            ),
            "split_n": split_any,
            "split_total": split_total,
            "split_cost": split_cost,
            "split_excess": np.where(split_any, dur * (1.0 - split_total / np.maximum(split_cost, 1e-9)), 0.0),
        }
    )


def _per_group(work: pd.DataFrame) -> pd.DataFrame:
    """The per-collective table summed per (group, kind, source), the most time first."""
    keys = ["pg", "pg_ranks", "kind", "source"]
    gb = work.groupby(keys, sort=False)
    sums = [
        "dur",
        "exposed",
        "sized",
        "size",
        "sized_dur",
        "tiny",
        "scalar",
        "scalar_exposed",
        "mid",
        "big",
        "nonempty",
        "unaligned",
        "mib",
        "split_n",
        "split_total",
        "split_cost",
        "split_excess",
    ]
    g = gb[sums].sum().rename(columns={"dur": "time", "size": "bytes"})
    g["count"] = gb.size()
    mx = gb[["dur", "n", "msg_bw"]].max()
    g["max"], g["n"], g["best_bw"] = mx["dur"], mx["n"], mx["msg_bw"]
    g["mean"] = g["time"] / g["count"]
    g = g.reset_index().sort_values("time", ascending=False)
    return g


def _group_meta(df: pd.DataFrame) -> pd.DataFrame:
    """Per (group, kind, source): its description, first name, time range and dtypes."""
    keys = ["pg", "pg_ranks", "kind", "source"]
    meta = df[keys + ["dtype", "pg_desc", "name", "ts", "end"]]
    mg = meta.groupby(keys, sort=False)
    extra = mg[["pg_desc", "name"]].first()
    extra["first"] = mg["ts"].min()
    extra["last"] = mg["end"].max()
    extra["dtypes"] = mg["dtype"].unique().map(lambda a: sorted(x for x in a if x))  # per group, a handful
    return extra


def _group_fact(ctx: RankContext, row: Any, ex: pd.Series, left_out: int) -> CommStats:
    """The fact of one row of ``_per_group`` (``ex``: its row of ``_group_meta``)."""
    ranks = group_ranks(ctx, row.pg, row.pg_ranks)
    n = int(row.n) if row.n > 0 else (len(ranks) or None)
    kernel = row.source == "kernel"
    timed = row.source in TIMED_SOURCES  # its exposed part is measured
    sized_n = int(row.sized)
    factor, algbw, busbw, best = group_bandwidth(ctx, row, n, kernel)
    link_name, link = group_link(ctx, ranks, n) if kernel else (UNKNOWN_LINK, None)
    peak = link.peak_gbps if link is not None else None
    to_peak = min(busbw / peak, 1.0) if busbw is not None and peak else None
    best_to_peak = min(best / peak, 1.0) if best is not None and peak else None
    note = _note(row, n, factor, algbw, busbw, link, left_out)
    return CommStats(
        rank=ctx.rank,
        process_group=row.pg,
        pg_desc=str(ex["pg_desc"]) or None,
        group_ranks=ranks,
        group_size_count=n,
        collective=row.kind,
        source=row.source,
        dtypes=list(ex["dtypes"]),
        collectives_count=int(row.count),
        time_us=float(row.time),
        mean_us=float(row.mean),
        max_us=float(row.max),
        exposed_us=float(row.exposed) if timed else None,
        exposed_ratio=ratio(row.exposed, row.time) if timed else None,
        time_share_ratio=ratio(row.time, ctx.windows_us) if ctx.windows_us > 0 else None,
        exposed_share_ratio=ratio(row.exposed, ctx.windows_us) if timed and ctx.windows_us > 0 else None,
        sizes_known=sized_n == int(row.count),
        sized_count=sized_n,
        total_bytes=int(row.bytes) if sized_n else None,
        mean_message_bytes=float(row.bytes) / sized_n if sized_n else None,
        algbw_gbps=algbw,
        busbw_gbps=busbw,
        best_busbw_gbps=best,
        link=link_name,
        link_peak_gbps=peak,
        busbw_to_peak_ratio=to_peak,
        best_busbw_to_peak_ratio=best_to_peak,
        messages_below_1mib_count=int(row.tiny),
        messages_1_to_32mib_count=int(row.mid),
        messages_from_32mib_count=int(row.big),
        small_messages_ratio=ratio(row.tiny + row.mid, sized_n) if sized_n else None,
        unaligned_512_count=int(row.unaligned),
        unaligned_512_ratio=ratio(row.unaligned, row.nonempty) if row.nonempty else None,
        per_step_count=float(row.count) / len(ctx.windows) if ctx.windows else None,
        scalar_messages_count=int(row.scalar),
        bulk_messages_count=int(row.count) - int(row.scalar),
        scalar_per_step_count=float(row.scalar) / len(ctx.windows) if ctx.windows else None,
        scalar_exposed_us=float(row.scalar_exposed) if timed else None,
        scalar_exposed_share_ratio=(
            ratio(row.scalar_exposed, ctx.windows_us) if timed and ctx.windows_us > 0 else None
        ),
        splits_count=int(row.split_n),
        split_imbalance_ratio=(
            ratio(row.split_cost - row.split_total, row.split_cost) if row.split_n else None
        ),
        split_excess_us=float(row.split_excess) if row.split_n else None,
        split_excess_share_ratio=(
            ratio(row.split_excess, ctx.windows_us) if row.split_n and ctx.windows_us > 0 else None
        ),
        evidence=Evidence(
            time_ranges_us=[(float(ex["first"]), float(ex["last"]))],
            events=[str(ex["name"])],
            counts={"collectives": int(row.count), "sized": sized_n},
            note=note,
        ),
    )


def _note(row: Any, n: int | None, factor: float | None, algbw: float | None, busbw: float | None,
          link: Link | None, left_out: int) -> str:  # fmt: skip
    sized_n = int(row.sized)
    if algbw is not None and busbw is None:
        note = "group size unknown: algbw = bytes / duration only (busbw needs the group size)"
    elif algbw is not None:
        note = (
            "exposed = duration minus overlap with the union of non-communication kernels; "
            f"algbw = bytes / duration, busbw = algbw x {factor:.3g} (NCCL factor for {row.kind}, n={n})"
        )
    elif not sized_n or not n:
        note = "sizes or group size unknown: count and time only"
    elif n <= 1:
        note = "one-rank group: nothing is transferred, no bandwidth"
    else:
        note = (
            "CPU ops of asynchronous collectives: their duration is not the transfer time, no bandwidth"
        )
    if link is not None:
        note += f"; link peak {link.peak_gbps:g} GB/s per direction ({link.source})"
    if left_out:
        note += f"; {left_out} smaller (group, kind) pairs not reported"
    return note


def ratio(a: float, b: float) -> float:
    """a / b clipped to [0, 1]; 0 when b is not positive."""
    return float(min(max(a / b, 0.0), 1.0)) if b > 0 else 0.0


__all__ = ["ALIGNMENT_BYTES", "MAX_GROUP_FACTS", "MIB", "SCALAR_MESSAGE_BYTES", "SMALL_MESSAGE_BYTES", "TINY_MESSAGE_BYTES",
           "group_stats", "ratio"]  # fmt: skip
