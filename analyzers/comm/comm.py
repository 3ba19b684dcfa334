"""Communication: collectives per process group and kind on each rank, and their
synchronisation waste across ranks.

Per rank (``per_rank``), over the collectives issued inside the analysed steps
(``Work.wait`` records, collective name ``wait``, are not transfers and are left out):

- count, time, exposed time (the part of each collective not covered by the union of the
  rank's non-communication kernels), per (process group, kind, source);
- algorithm bandwidth = size / duration and bus bandwidth = algbw x NCCL's factor for the kind
  (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; others 1), compared
  with the per-direction peak of the link when the device model is in ``LINKS``
  (hermes_kb/core/devices.py);
- message sizes (< 1 MiB, 1-32 MiB, >= 32 MiB; 32 MB is the paper's small-packet threshold) and
  512-byte alignment (the paper's HCCS rule).

Across ranks (``cross_rank``): each collective instance is matched on every rank of its group
(by ``seq`` when recorded, else by its order among the group's collectives of that kind within
the step), and R_wait = 1 - mean(T_i) / max(T_i) (the paper's synchronisation waste).

The modules beside this one hold the mechanisms: ``collectives`` (the rank's collectives),
``groups`` and ``bandwidth`` (the per-group facts, the links), ``pipeline`` (pipeline stages),
``sync`` (sync waits) and ``stalls`` (transfer stalls after arrival).

Everything is documented with its formulas in docs/analysis/comm.md.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hermes_kb.core.devices import UNKNOWN_LINK
from hermes_kb.facts.base import Evidence
from hermes_kb.facts.comm import CommSummary

from .. import intervals as iv
from ..context import RankContext
from ..whatif.sets import WhatIfSet, register
from .bandwidth import group_link
from .collectives import TIMED_SOURCES, compute_union, host_exposed, rank_collectives
from .groups import MAX_GROUP_FACTS, group_stats, ratio
from .pipeline import P2P_KINDS, pipeline_neighbours, pipeline_stage, pipeline_stages
from .stalls import transfer_stall
from .sync import instances, sync_wait


def per_rank(ctx: RankContext) -> list:
    df = rank_collectives(ctx)
    stage = pipeline_stage(ctx)
    if not len(df):
        return [stage] if stage is not None else []
    device = ctx.trace.meta.device_name
    cu = compute_union(ctx)
    is_kernel = df["source"].to_numpy() == "kernel"
    _register(ctx, df, is_kernel)
    facts: list = group_stats(ctx, df, cu, np.isin(df["source"].to_numpy(), TIMED_SOURCES))
    facts.append(_summary(ctx, df, cu, device))
    if stage is not None:
        facts.append(stage)
    return facts


def _register(ctx: RankContext, df: pd.DataFrame, is_kernel: np.ndarray) -> None:
    """What-if set of the collectives: their kernels, or on a CPU-only rank the host time of the
    op that ran them (gloo)."""
    kidx = df["kernel_idx"].to_numpy(np.int64)[is_kernel]
    kidx = kidx[(kidx >= 0) & (kidx < len(ctx.trace.kernels))]
    c = ctx.trace.collectives
    ops = ctx.trace.cpu_ops
    tid, waits = host_exposed(ctx)
    if len(tid) and len(waits[0]):  # gloo: what the training thread waits for them
        register(ctx, WhatIfSet.of_intervals("communication", "the collectives (the training thread's waits for "
                                             "gloo's collectives)", tid[0], waits[0], waits[1]))  # fmt: skip
        return
    host = (c["source"].to_numpy() == "cpu") & (c["cpu_idx"].to_numpy() >= 0) if len(c) else np.zeros(0, bool)
    rows = c["cpu_idx"].to_numpy(np.int64)[host] if len(c) else np.zeros(0, np.int64)
    rows = rows[rows < len(ops)]
    if len(kidx) or len(rows):
        register(ctx, WhatIfSet("communication", "the collectives (their kernels, or their host ops without a device)",
                                ops["tid"].to_numpy(np.int64)[rows], c["ts"].to_numpy(float)[host][:len(rows)],
                                c["end"].to_numpy(float)[host][:len(rows)], kernels=kidx))  # fmt: skip


def _summary(ctx: RankContext, df: pd.DataFrame, cu: iv.Intervals, device: str | None) -> CommSummary:
    src = set(df["source"].unique().tolist())
    kern = df[np.isin(df["source"].to_numpy(), TIMED_SOURCES)]
    use = kern if len(kern) else df
    u = iv.union(use["ts"].to_numpy(float), use["end"].to_numpy(float))
    comm = iv.length(u)
    exposed = iv.length(iv.subtract(u, cu)) if len(kern) else None
    analysed = ctx.windows_us
    by_kind = df.groupby("kind")["dur"].sum().sort_values(ascending=False)
    pgs = [str(x) for x in df["pg"].unique()]
    link_name, link = group_link(ctx, [], None) if (df["source"] == "kernel").any() else (UNKNOWN_LINK, None)
    return CommSummary(
        rank=ctx.rank,
        collectives_count=len(df),
        kinds=[str(k) for k in by_kind.index],
        process_groups=pgs,
        source="mixed" if len(src) > 1 else next(iter(src)),
        comm_time_us=comm,
        exposed_us=exposed,
        exposed_ratio=ratio(exposed, comm) if exposed is not None else None,
        analysed_us=analysed,
        comm_share_ratio=ratio(comm, analysed),
        exposed_share_ratio=ratio(exposed, analysed) if exposed is not None else None,
        sizes_known=bool((df["msg_bytes"] >= 0).all()),
        device=device,
        link=link_name,
        link_peak_gbps=link.peak_gbps if link is not None else None,
        evidence=Evidence(
            time_ranges_us=[ctx.span],
            events=[str(x) for x in use["name"].unique()[:10]],
            counts={str(k): int(v) for k, v in df["kind"].value_counts().items()},
            note=(
                "comm time = union of collective kernels (gloo's spans on a CPU-only rank, else CPU ops); "
                "exposed = that union minus the union of non-communication kernels (on a CPU-only rank, of "
                "the other top-level operators); link assumes every rank of the job on this node"
            ),
        ),
    )


# ---------------------------------------------------------------- cross rank


def cross_rank(digests: dict, facts: list) -> list:
    """Sync waits per (group, kind), from the ranks' digests (digest.py)."""
    if len(digests) < 2:
        return []
    df = instances(digests)
    if not len(df):
        return []
    out = []
    stages = pipeline_stages(facts)
    keys = ["pg", "pg_ranks", "kind", "source"]
    for key, grp in df.groupby(keys, sort=False):  # one per (group, kind): a handful
        ranks_present = sorted(grp["rank"].unique().tolist())
        if len(ranks_present) < 2:
            continue
        by_seq = bool((grp["seq"] >= 0).all())
        inst_cols = ["seq"] if by_seq else ["step", "occ"]
        fact = sync_wait(key, grp, inst_cols, ranks_present, "seq" if by_seq else "step_order")
        if fact is not None:
            fact.pipeline_p2p = key[2] in P2P_KINDS and pipeline_neighbours(ranks_present, stages)
            out.append(fact)
    out.sort(key=lambda f: -f.wait_total_us)
    out = out[:MAX_GROUP_FACTS]
    stalls = []
    for key, grp in df.groupby(keys, sort=False):
        ranks_present = sorted(grp["rank"].unique().tolist())
        if len(ranks_present) < 2:
            continue
        by_seq = bool((grp["seq"] >= 0).all())
        others = df.loc[~df.index.isin(grp.index), ["rank", "ts", "dur"]]
        stalls.extend(transfer_stall(key, grp, ["seq"] if by_seq else ["step", "occ"], ranks_present, digests,
                                     others))  # fmt: skip
    stalls.sort(key=lambda f: -f.excess_us)
    return out + stalls[: MAX_GROUP_FACTS * len(digests)]
