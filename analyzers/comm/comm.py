"""Communication: collectives per process group and kind on each rank, and their
synchronisation waste across ranks.

Per rank (``per_rank``), over the collectives issued inside the analysed steps
(``Work.wait`` records, collective name ``wait``, are not transfers and are left out):

- count, time, exposed time (the part of each collective not covered by the union of the
  rank's non-communication kernels), per (process group, kind, source);
- algorithm bandwidth = size / duration and bus bandwidth = algbw x NCCL's factor for the kind
  (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; others 1), compared
  with the per-direction peak of the link when the device model is in ``LINKS``;
- message sizes (< 1 MiB, 1-32 MiB, >= 32 MiB; 32 MB is the paper's small-packet threshold) and
  512-byte alignment (the paper's HCCS rule).

Across ranks (``cross_rank``): each collective instance is matched on every rank of its group
(by ``seq`` when recorded, else by its order among the group's collectives of that kind within
the step), and R_wait = 1 - mean(T_i) / max(T_i) (the paper's synchronisation waste).

Everything is documented with its formulas in docs/analysis/comm.md.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence
from hermes_kb.facts.comm import CommStats, CommSummary, CommSyncWait, CommTransferStall

from .. import intervals as iv
from ..context import RankContext
from ..whatif.sets import WhatIfSet, register

MIB = 1024 * 1024
SMALL_MESSAGE_BYTES = 32 * MIB  # paper (HERMES_NOTES, Communication): 32 MB small-packet threshold
TINY_MESSAGE_BYTES = 1 * MIB
ALIGNMENT_BYTES = 512  # paper (HERMES_NOTES, Table 4): HCCS transfers must be multiples of 512 B
MAX_GROUP_FACTS = 10

# NCCL's bus-bandwidth factors (nccl-tests, doc/PERFORMANCE.md): busbw = algbw x factor(n)
_BUS_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}


def bus_factor(kind: str, n: int) -> float:
    """NCCL's busbw / algbw factor for a collective of ``kind`` over ``n`` ranks (1 for
    broadcast, reduce, send/recv and anything else)."""
    f = _BUS_FACTOR.get(kind)
    return f(n) if f is not None and n >= 1 else 1.0


@dataclass(frozen=True)
class Link:
    name: str
    peak_gbps: float  # per direction, per GPU: what NCCL's busbw is compared with
    total_gbps: float  # as the vendor quotes it (both directions)
    source: str


# Intra-node links by device model (first match wins). Vendors quote the bidirectional total;
# busbw is a per-direction figure, so it is compared with half of it.
LINKS: list[tuple[re.Pattern, Link]] = [
    (
        re.compile(r"V100.*(SXM|DGX)|DGX.*V100", re.I),
        Link("NVLink 2 (6 links)", 150.0, 300.0, "NVIDIA Tesla V100 datasheet: NVLink 300 GB/s"),
    ),
    (
        re.compile(r"A100.*PCIE|A100.*PCI", re.I),
        Link(
            "PCIe Gen4 x16",
            32.0,
            64.0,
            "PCI-SIG: Gen4 x16 ~32 GB/s per direction (NVLink bridge not detectable)",
        ),
    ),
    (
        re.compile(r"A100|A800", re.I),
        Link("NVLink 3 (12 links)", 300.0, 600.0, "NVIDIA A100 datasheet: NVLink 600 GB/s (SXM4, HGX)"),
    ),
    (
        re.compile(r"H100.*PCIE|H100 NVL", re.I),
        Link(
            "PCIe Gen5 x16",
            64.0,
            128.0,
            "PCI-SIG: Gen5 x16 ~64 GB/s per direction (NVLink bridge not detectable)",
        ),
    ),
    (
        re.compile(r"H100|H200|H800|GH200", re.I),
        Link("NVLink 4 (18 links)", 450.0, 900.0, "NVIDIA H100/H200 datasheets: NVLink 900 GB/s (SXM5)"),
    ),
    (
        re.compile(r"B200|B100|GB200", re.I),
        Link(
            "NVLink 5 (18 links)",
            900.0,
            1800.0,
            "NVIDIA Blackwell (HGX B200) datasheet: NVLink 1.8 TB/s per GPU",
        ),
    ),
    (
        re.compile(r"MI300X|MI325X", re.I),
        Link(
            "Infinity Fabric (7 links)",
            448.0,
            896.0,
            "AMD Instinct MI300X datasheet: 7 x 128 GB/s Infinity Fabric links",
        ),
    ),
    (
        re.compile(r"MI250", re.I),
        Link(
            "Infinity Fabric (8 links)",
            400.0,
            800.0,
            "AMD Instinct MI250X datasheet: up to 800 GB/s Infinity Fabric",
        ),
    ),
    (
        re.compile(r"V100.*PCIE|RTX|GeForce|T4\b|Tesla P", re.I),
        Link("PCIe Gen3 x16", 15.75, 31.5, "PCI-SIG: Gen3 x16 15.75 GB/s per direction"),
    ),
]

# Inter-node NICs, for reference: the trace does not record which NIC a job used, so hermes
# reports 'unknown' for groups that span nodes (InfiniBand HDR 200 Gb/s = 25 GB/s and NDR
# 400 Gb/s = 50 GB/s per port and direction, NVIDIA ConnectX-6/-7 product briefs).
NICS = {"InfiniBand HDR": 25.0, "InfiniBand NDR": 50.0}

UNKNOWN_LINK = "unknown"


def device_link(device: str | None) -> Link | None:
    if not device:
        return None
    for pat, link in LINKS:
        if pat.search(device):
            return link
    return None


def _parse_ranks(text: str) -> list[int]:
    if not text or text == "[]":
        return []
    try:
        v = json.loads(text)
    except ValueError:
        return [int(x) for x in re.findall(r"-?\d+", text)]
    return [int(x) for x in v] if isinstance(v, list) else []


def group_link(ctx: RankContext, ranks: list[int], n: int | None) -> tuple[str, Link | None]:
    """The link a group's traffic most likely takes: the device's intra-node link when every
    member sits on this node (ranks placed node by node, node size = GPUs listed in the
    trace), else 'unknown' (inter-node: the NIC is not recorded)."""
    meta = ctx.trace.meta
    link = device_link(meta.device_name)
    if len(meta.device_properties) < 2:
        # one device listed (torch_npu's metadata, CUDA_VISIBLE_DEVICES of one GPU) or none: the
        # number of devices per node is not known, so neither is whether the group leaves the node
        return "unknown (devices per node not recorded)", None
    node = len(meta.device_properties)
    if ranks:
        intra = len({r // node for r in ranks}) == 1
    else:
        size = n if n and n > 0 else (meta.world_size or 0)
        intra = 0 < size <= node and (meta.world_size or size) <= node
    if not intra:
        return "unknown (spans nodes; the NIC is not recorded)", None
    if link is None:
        return UNKNOWN_LINK, None
    return link.name, link


def rank_collectives(ctx: RankContext) -> pd.DataFrame:
    """The rank's collectives issued in an analysed step (see ``_issue_time``), as a plain
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
        anchor = _issue_time(ctx)[keep]
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
        lens = {s: len(_parse_ranks(s)) for s in out["pg_ranks"].unique()}  # a few distinct groups
        nr = out["pg_ranks"].map(lens).to_numpy(dtype=np.int64) if len(out) else np.zeros(0, dtype=np.int64)
        out["n"] = np.where(gs > 0, gs, np.where(nr > 0, nr, -1)).astype(np.int64)
        out = out.reset_index(drop=True)
    ctx.shared["comm_collectives"] = out
    return out


def _issue_time(ctx: RankContext) -> np.ndarray:
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
    try:
        v = json.loads(text)
    except ValueError:
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


def compute_union(ctx: RankContext) -> iv.Intervals:
    """Union of the rank's non-communication kernels (every kernel that is not a collective).
    Cached in ``ctx.shared['comm_compute_union']``."""
    cached = ctx.shared.get("comm_compute_union")
    if cached is not None:
        return cached
    k = ctx.trace.kernels
    if not len(k):
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


def _group_ranks(ctx: RankContext, pg_name: str, pg_ranks: str) -> list[int]:
    ranks = _parse_ranks(pg_ranks)
    if ranks or not pg_name or pg_name == "unknown":
        return ranks
    for pg in ctx.trace.meta.process_groups:
        if str(pg.get("pg_name")) == pg_name:
            return [int(r) for r in pg.get("ranks") or []]
    return []


def per_rank(ctx: RankContext) -> list:
    df = rank_collectives(ctx)
    stage = pipeline_stage(ctx)
    if not len(df):
        return [stage] if stage is not None else []
    device = ctx.trace.meta.device_name
    cu = compute_union(ctx)
    ts, end, dur = df["ts"].to_numpy(float), df["end"].to_numpy(float), df["dur"].to_numpy(float)
    is_kernel = df["source"].to_numpy() == "kernel"
    _register(ctx, df, is_kernel)
    exposed = np.where(is_kernel, dur - iv.overlap_length(ts, end, cu), np.nan)
    size = df["msg_bytes"].to_numpy()
    sized = size >= 0
    split_total, split_cost = split_imbalance(df)
    split_any = split_cost > 0
    work = pd.DataFrame(
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
    keys = ["pg", "pg_ranks", "kind", "source"]
    gb = work.groupby(keys, sort=False)
    sums = [
        "dur",
        "exposed",
        "sized",
        "size",
        "sized_dur",
        "tiny",
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
    meta = df[keys + ["dtype", "pg_desc", "name", "ts", "end"]]
    mg = meta.groupby(keys, sort=False)
    extra = mg[["pg_desc", "name"]].first()
    extra["first"] = mg["ts"].min()
    extra["last"] = mg["end"].max()
    extra["dtypes"] = mg["dtype"].unique().map(lambda a: sorted(x for x in a if x))  # per group, a handful
    facts: list = []
    left_out = max(len(g) - MAX_GROUP_FACTS, 0)
    for row in g.head(MAX_GROUP_FACTS).itertuples(index=False):  # one per (group, kind): a handful
        key = (row.pg, row.pg_ranks, row.kind, row.source)
        ex = extra.loc[key]
        ranks = _group_ranks(ctx, row.pg, row.pg_ranks)
        n = int(row.n) if row.n > 0 else (len(ranks) or None)
        kernel = row.source == "kernel"
        sized_n = int(row.sized)
        algbw = busbw = best = None
        factor = bus_factor(row.kind, n) if n else None
        # a CPU op's duration is the transfer time only for blocking (gloo) collectives; NCCL's CPU
        # op just enqueues. A one-rank group transfers nothing.
        timed = kernel or (ctx.trace.meta.backend or "").lower() == "gloo"
        if sized_n and row.sized_dur > 0 and timed and (n is None or n > 1):
            algbw = float(row.bytes) / float(row.sized_dur) / 1e3  # bytes/µs -> GB/s (needs no group size)
            if n is not None:
                busbw = algbw * factor
                if row.mib:
                    best = float(row.best_bw) * factor
        link_name, link = group_link(ctx, ranks, n) if kernel else (UNKNOWN_LINK, None)
        peak = link.peak_gbps if link is not None else None
        to_peak = min(busbw / peak, 1.0) if busbw is not None and peak else None
        best_to_peak = min(best / peak, 1.0) if best is not None and peak else None
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
        facts.append(
            CommStats(
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
                exposed_us=float(row.exposed) if kernel else None,
                exposed_ratio=_ratio(row.exposed, row.time) if kernel else None,
                time_share_ratio=_ratio(row.time, ctx.windows_us) if ctx.windows_us > 0 else None,
                exposed_share_ratio=_ratio(row.exposed, ctx.windows_us) if kernel and ctx.windows_us > 0 else None,
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
                small_messages_ratio=_ratio(row.tiny + row.mid, sized_n) if sized_n else None,
                unaligned_512_count=int(row.unaligned),
                unaligned_512_ratio=_ratio(row.unaligned, row.nonempty) if row.nonempty else None,
                per_step_count=float(row.count) / len(ctx.windows) if ctx.windows else None,
                splits_count=int(row.split_n),
                split_imbalance_ratio=(
                    _ratio(row.split_cost - row.split_total, row.split_cost) if row.split_n else None
                ),
                split_excess_us=float(row.split_excess) if row.split_n else None,
                split_excess_share_ratio=(
                    _ratio(row.split_excess, ctx.windows_us) if row.split_n and ctx.windows_us > 0 else None
                ),
                evidence=Evidence(
                    time_ranges_us=[(float(ex["first"]), float(ex["last"]))],
                    events=[str(ex["name"])],
                    counts={"collectives": int(row.count), "sized": sized_n},
                    note=note,
                ),
            )
        )
    facts.append(_summary(ctx, df, cu, device))
    if stage is not None:
        facts.append(stage)
    return facts


PIPELINE_GROUP = re.compile(r"^(pp|pipe)$|pipeline", re.I)


def pipeline_stage(ctx: RankContext):
    """The rank's stage in the first recorded process group named like a pipeline group ('pp',
    'pipe', or containing 'pipeline': MindSpeed / Megatron names), from the trace's process-group
    table; None when there is none, it has one rank, or this rank is not in it."""
    from hermes_kb.facts.parallel import PipelineStage

    for pg in ctx.trace.meta.process_groups:
        desc, name = str(pg.get("pg_desc") or ""), str(pg.get("pg_name") or "")
        if not (PIPELINE_GROUP.search(desc) or PIPELINE_GROUP.search(name)):
            continue
        raw = pg.get("ranks") or []
        try:
            ranks = _parse_ranks(raw) if isinstance(raw, str) else [int(r) for r in raw]
        except (TypeError, ValueError):
            continue  # a rank list that is not one: no stage
        if len(ranks) < 2 or len(set(ranks)) != len(ranks) or ctx.rank not in ranks:
            continue
        return PipelineStage(
            rank=ctx.rank, process_group=name, pg_desc=desc or None, pp_ranks=ranks,
            stage_index=ranks.index(ctx.rank), stages_count=len(ranks),
            evidence=Evidence(note="from the trace's process-group table (distributedInfo pg_config, or torch_npu "
                                   "metadata parallel_group_info); stage = position of the rank in the group's ranks"),
        )  # fmt: skip
    return None


def _register(ctx: RankContext, df: pd.DataFrame, is_kernel: np.ndarray) -> None:
    """What-if set of the collectives: their kernels, or on a CPU-only rank the host time of the
    op that ran them (gloo)."""
    kidx = df["kernel_idx"].to_numpy(np.int64)[is_kernel]
    kidx = kidx[(kidx >= 0) & (kidx < len(ctx.trace.kernels))]
    c = ctx.trace.collectives
    ops = ctx.trace.cpu_ops
    host = (c["source"].to_numpy() != "kernel") & (c["cpu_idx"].to_numpy() >= 0) if len(c) else np.zeros(0, bool)
    rows = c["cpu_idx"].to_numpy(np.int64)[host] if len(c) else np.zeros(0, np.int64)
    rows = rows[rows < len(ops)]
    if len(kidx) or len(rows):
        register(ctx, WhatIfSet("communication", "the collectives (their kernels, or their host ops without a device)",
                                ops["tid"].to_numpy(np.int64)[rows], c["ts"].to_numpy(float)[host][:len(rows)],
                                c["end"].to_numpy(float)[host][:len(rows)], kernels=kidx))  # fmt: skip


def _ratio(a: float, b: float) -> float:
    return float(min(max(a / b, 0.0), 1.0)) if b > 0 else 0.0


def _summary(ctx: RankContext, df: pd.DataFrame, cu: iv.Intervals, device: str | None) -> CommSummary:
    src = set(df["source"].unique().tolist())
    kern = df[df["source"] == "kernel"]
    use = kern if len(kern) else df
    u = iv.union(use["ts"].to_numpy(float), use["end"].to_numpy(float))
    comm = iv.length(u)
    exposed = iv.length(iv.subtract(u, cu)) if len(kern) else None
    analysed = ctx.windows_us
    by_kind = df.groupby("kind")["dur"].sum().sort_values(ascending=False)
    pgs = [str(x) for x in df["pg"].unique()]
    link_name, link = group_link(ctx, [], None) if len(kern) else (UNKNOWN_LINK, None)
    return CommSummary(
        rank=ctx.rank,
        collectives_count=len(df),
        kinds=[str(k) for k in by_kind.index],
        process_groups=pgs,
        source="mixed" if len(src) > 1 else next(iter(src)),
        comm_time_us=comm,
        exposed_us=exposed,
        exposed_ratio=_ratio(exposed, comm) if exposed is not None else None,
        analysed_us=analysed,
        comm_share_ratio=_ratio(comm, analysed),
        exposed_share_ratio=_ratio(exposed, analysed) if exposed is not None else None,
        sizes_known=bool((df["msg_bytes"] >= 0).all()),
        device=device,
        link=link_name,
        link_peak_gbps=link.peak_gbps if link is not None else None,
        evidence=Evidence(
            time_ranges_us=[ctx.span],
            events=[str(x) for x in use["name"].unique()[:10]],
            counts={str(k): int(v) for k, v in df["kind"].value_counts().items()},
            note=(
                "comm time = union of collective kernels (CPU ops when the rank has none); exposed = "
                "that union minus the union of non-communication kernels; link assumes every rank of "
                "the job on this node"
            ),
        ),
    )


# ---------------------------------------------------------------- cross rank


def _instances(digests: dict) -> pd.DataFrame:
    parts = []
    for r, dg in digests.items():
        df = dg.collectives
        if not len(df):
            continue
        d = df[["pg", "pg_ranks", "kind", "source", "step", "ts", "dur", "seq", "n", "name", "msg_bytes"]].copy()
        d["rank"] = r
        d["occ"] = d.groupby(["pg", "pg_ranks", "kind", "source", "step"], sort=False).cumcount()
        parts.append(d)
    if not parts:
        return pd.DataFrame()
    return pd.concat(parts, ignore_index=True)


def cross_rank(digests: dict, facts: list) -> list:
    """Sync waits per (group, kind), from the ranks' digests (digest.py)."""
    if len(digests) < 2:
        return []
    df = _instances(digests)
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
        fact = _sync_wait(key, grp, inst_cols, ranks_present, "seq" if by_seq else "step_order")
        if fact is not None:
            fact.pipeline_p2p = key[2] in P2P_KINDS and _pipeline_neighbours(ranks_present, stages)
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
        stalls.extend(_transfer_stall(key, grp, ["seq"] if by_seq else ["step", "occ"], ranks_present, digests,
                                      others))  # fmt: skip
    stalls.sort(key=lambda f: -f.excess_us)
    return out + stalls[: MAX_GROUP_FACTS * len(digests)]


P2P_KINDS = ("send_recv", "send", "recv")


def pipeline_stages(facts: list) -> dict[int, tuple[tuple, int]]:
    """Each rank's pipeline group (its ranks, in stage order) and stage, from pipeline_stage facts."""
    return {f.rank: (tuple(f.pp_ranks), f.stage_index) for f in facts
            if getattr(f, "kind", None) == "pipeline_stage" and f.rank is not None}  # fmt: skip


def _pipeline_neighbours(ranks: list[int], stages: dict[int, tuple[tuple, int]]) -> bool:
    """Two ranks of one pipeline group at different stages: their point-to-point messages are
    the pipeline's activations and gradients, whose waits are the pipeline schedule's."""
    if len(ranks) != 2 or any(r not in stages for r in ranks):
        return False
    (pp_a, st_a), (pp_b, st_b) = stages[ranks[0]], stages[ranks[1]]
    return pp_a == pp_b and st_a != st_b


def _sync_wait(
    key,
    grp: pd.DataFrame,
    inst_cols: list[str],
    ranks: list[int],
    matched_by: str,
) -> CommSyncWait | None:
    pg, pg_ranks, kind, source = key
    g = grp.copy()
    g["inst"] = g.groupby(inst_cols, sort=False).ngroup()
    per = g.groupby("inst")
    nr = per["rank"].transform("nunique")
    full = nr.to_numpy() == len(ranks)
    unmatched = int(per.ngroups - g.loc[full, "inst"].nunique())
    g = g[full]
    if not len(g):
        return None
    g = g.drop_duplicates(["inst", "rank"])
    per = g.groupby("inst")
    tmin = per["dur"].transform("min").to_numpy()
    g["wait"] = g["dur"].to_numpy() - tmin
    agg = per.agg(
        tmean=("dur", "mean"),
        tmax=("dur", "max"),
        ts_lo=("ts", "min"),
        ts_hi=("ts", "max"),
        wait=("wait", "sum"),
    )
    r = np.where(agg["tmax"] > 0, 1.0 - agg["tmean"] / agg["tmax"].where(agg["tmax"] > 0, 1.0), 0.0)
    r = np.clip(r, 0.0, 1.0)
    n_inst = len(agg)
    # slowest = the shortest collective of an instance (arrives last); most waiting = the longest.
    # Ties in how often: the slowest is the one that waited least in total, and vice versa.
    wait_all = g.groupby("rank")["wait"].sum()
    slow_n = g.loc[per["dur"].idxmin(), "rank"].value_counts()
    waiting_n = g.loc[per["dur"].idxmax(), "rank"].value_counts()
    slow = sorted(slow_n.items(), key=lambda kv: (-kv[1], wait_all[kv[0]], kv[0]))[0]
    waiting = sorted(waiting_n.items(), key=lambda kv: (-kv[1], -wait_all[kv[0]], kv[0]))[0]
    wait_by_rank = wait_all.sort_values(ascending=False).head(10)
    worst = agg["wait"].idxmax()
    w = g[g["inst"] == worst]
    end_hi = float((w["ts"] + w["dur"]).max())
    sum_tmax = float(agg["tmax"].sum())
    n_rec = int(grp["n"].max()) if (grp["n"] > 0).any() else None
    return CommSyncWait(
        rank=None,
        process_group=pg,
        group_ranks=ranks,
        group_size_count=n_rec,
        collective=kind,
        source=source,
        matched_by=matched_by,
        instances_count=n_inst,
        unmatched_count=unmatched,
        r_wait_mean_ratio=float(r.mean()),
        r_wait_max_ratio=float(r.max()),
        r_wait_weighted_ratio=float(np.clip(1.0 - agg["tmean"].sum() / sum_tmax, 0, 1))
        if sum_tmax > 0
        else 0.0,
        wait_total_us=float(agg["wait"].sum()),
        wait_by_rank_us={int(k): float(v) for k, v in wait_by_rank.items()},
        slowest_rank=int(slow[0]),
        slowest_rank_share_ratio=float(slow[1]) / n_inst,
        most_waiting_rank=int(waiting[0]),
        most_waiting_rank_share_ratio=float(waiting[1]) / n_inst,
        most_waiting_rank_wait_us=float(wait_all[waiting[0]]),
        arrival_spread_mean_us=float((agg["ts_hi"] - agg["ts_lo"]).mean()),
        evidence=Evidence(
            time_ranges_us=[(float(w["ts"].min()), end_hi)],
            events=[str(grp["name"].iat[0])],
            counts={"instances": n_inst, "ranks": len(ranks), "unmatched": unmatched},
            note=(
                f"instances matched by {'seq' if matched_by == 'seq' else 'step and order of occurrence'}; "
                "R_wait = 1 - mean(T_i)/max(T_i) per instance, T_i the duration on rank i; wait of rank i = "
                "T_i - min_j T_j; time range = the instance with the most waiting"
            ),
        ),
    )


# ------------------------------------------------------- transfer after arrival

STALL_MIN_BYTES = 8 * MIB  # from here bandwidth, not latency, dominates a collective (as C-COMM-004)
STALL_RATIO = 0.25  # an instance below a quarter of the group's own best rate stalls
END_SPREAD = 0.1  # median spread of an instance's end across ranks, over the median post-arrival time
END_SPREAD_MIN_US = 50.0


def _transfer_stall(key, grp: pd.DataFrame, inst_cols: list[str], ranks: list[int],
                    digests: dict, others: pd.DataFrame) -> list[CommTransferStall]:  # fmt: skip
    """Per rank: each matched instance's time after the last rank arrived (its latest start),
    its rate bytes / that time, against the best rate of the group's sized instances (every
    rank); instances below STALL_RATIO x best stall, and their time beyond bytes / best is the
    excess. Concurrency: the part of the stalled windows during which another collective of the
    rank (another group or kind: ``others``, rows of ``_instances``) runs. Reads the digests
    only (rank_digest.py)."""
    pg, pg_ranks, kind, source = key
    g = grp.copy()
    g["inst"] = g.groupby(inst_cols, sort=False).ngroup()
    full = g.groupby("inst")["rank"].transform("nunique").to_numpy() == len(ranks)
    g = g[full].drop_duplicates(["inst", "rank"])
    if not len(g):
        return []
    g["end"] = g["ts"] + g["dur"]
    last = g.groupby("inst")["ts"].transform("max").to_numpy()
    g["post_start"] = np.maximum(last, g["ts"].to_numpy())
    g["post"] = np.maximum(g["end"].to_numpy() - last, 0.0)
    # a collective ends at about the same time on every rank; when the ends drift apart by more
    # than END_SPREAD of the post-arrival time, the ranks' clocks are not comparable (traces of
    # different nodes) and arrival order cannot be read from them
    ends = g.groupby("inst")["end"]
    spread = float(np.median((ends.max() - ends.min()).to_numpy()))
    if spread > max(END_SPREAD * float(np.median(g["post"].to_numpy())), END_SPREAD_MIN_US):
        return []
    g["arrive_wait"] = last - g["ts"].to_numpy()
    size = g["msg_bytes"].to_numpy(float)
    sized = (size >= STALL_MIN_BYTES) & (g["post"].to_numpy() > 0)
    g["sized"] = sized
    g["rate"] = np.where(sized, size / np.maximum(g["post"].to_numpy(), 1e-9) / 1e3, np.nan)  # GB/s
    if sized.sum() < 2 or g.loc[sized, "inst"].nunique() < 2:
        return []
    best_row = g.loc[g["rate"].idxmax()]
    best = float(best_row["rate"])
    g["stalled"] = sized & (g["rate"].to_numpy() < STALL_RATIO * best)
    # a fact for each rank with a stalled instance only: at thousands of ranks the others say nothing
    g = g[g["rank"].isin(g.loc[g["stalled"], "rank"].unique())]
    if not len(g):
        return []
    g["excess"] = np.where(g["stalled"], np.maximum(g["post"] - g["msg_bytes"] / (best * 1e3), 0.0), 0.0)
    g["st_post"] = np.where(g["stalled"], g["post"], 0.0)
    g["st_bytes"] = np.where(g["stalled"], g["msg_bytes"], 0)
    per = g.groupby("rank", sort=True)
    agg = per.agg(instances=("inst", "nunique"), sized=("sized", "sum"), stalled=("stalled", "sum"),
                  post=("post", "sum"), wait=("arrive_wait", "sum"), excess=("excess", "sum"),
                  st_post=("st_post", "sum"), st_bytes=("st_bytes", "sum"), name=("name", "first"))  # fmt: skip
    agg["median"] = g[g["sized"]].groupby("rank")["rate"].median()
    st = g[g["stalled"]]
    worst = st.loc[st.groupby("rank")["post"].idxmax()].set_index("rank")
    agg["concurrent"] = _concurrent(st, others)
    out = []
    for r, a in agg.iterrows():
        dg = digests[int(r)]
        w = worst.loc[r]
        analysed = float(sum(x.end_us - x.start_us for x in dg.windows))
        stalled_us, stalled_bytes, excess = float(a["st_post"]), int(a["st_bytes"]), float(a["excess"])
        concurrent = min(float(a["concurrent"]), stalled_us)
        out.append(CommTransferStall(
            rank=int(r), process_group=pg, group_ranks=ranks, collective=kind, source=source,
            instances_count=int(a["instances"]), sized_count=int(a["sized"]), min_bytes=STALL_MIN_BYTES,
            post_arrival_us=float(a["post"]), arrival_wait_us=float(a["wait"]),
            best_gbps=best, best_bytes=int(best_row["msg_bytes"]), median_gbps=float(a["median"]),
            stall_ratio_threshold=STALL_RATIO, stalled_count=int(a["stalled"]), stalled_us=stalled_us,
            stalled_bytes=stalled_bytes, stalled_gbps=stalled_bytes / stalled_us / 1e3 if stalled_us > 0 else None,
            excess_us=excess, stalled_concurrent_us=concurrent,
            stalled_concurrent_ratio=_ratio(concurrent, stalled_us) if stalled_us > 0 else 0.0,
            worst_us=float(w["post"]),
            worst_bytes=int(w["msg_bytes"]),
            analysed_us=analysed, excess_share_ratio=_ratio(excess, analysed),
            evidence=Evidence(
                time_ranges_us=[(float(w["post_start"]), float(w["end"]))],
                events=[str(a["name"])],
                counts={"instances": int(a["instances"]), "sized": int(a["sized"]), "stalled": int(a["stalled"])},
                note=(f"post-arrival time = end on this rank - latest start among ranks {ranks}; rate = bytes / "
                      f"post-arrival time for instances of >= {STALL_MIN_BYTES // MIB} MiB; stalled below "
                      f"{STALL_RATIO:g} x the best rate ({best:.1f} GB/s, {int(best_row['msg_bytes'])} B); "
                      "time range = the slowest stalled instance after arrival"),
            ),
        ))  # fmt: skip
    return out


def _concurrent(st: pd.DataFrame, others: pd.DataFrame) -> pd.Series:
    """Per rank: length of the stalled post-arrival windows ``st`` (rank, post_start, end) covered
    by the union of that rank's other collectives (rank, ts, dur), without a loop over ranks."""
    o = others[others["rank"].isin(st["rank"].unique())]
    if not len(o):
        return pd.Series(0.0, index=pd.Index(sorted(st["rank"].unique()), name="rank"))
    o = o.assign(end=o["ts"] + o["dur"]).sort_values(["rank", "ts"], kind="stable")
    prev_end = o.groupby("rank")["end"].cummax().groupby(o["rank"]).shift()
    new = prev_end.isna().to_numpy() | (o["ts"].to_numpy() > prev_end.fillna(-np.inf).to_numpy())
    seg = o.assign(seg=np.cumsum(new)).groupby("seg").agg(rank=("rank", "first"), s=("ts", "min"), e=("end", "max"))
    m = st[["rank", "post_start", "end"]].merge(seg, on="rank")
    m["ov"] = np.clip(np.minimum(m["end"], m["e"]) - np.maximum(m["post_start"], m["s"]), 0.0, None)
    return m.groupby("rank")["ov"].sum().reindex(sorted(st["rank"].unique()), fill_value=0.0)
