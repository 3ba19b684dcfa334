"""Bandwidth of a rank's collectives and the link they take: NCCL's bus-bandwidth factor per
kind, algorithm and bus bandwidth of a (process group, kind) pair, and the intra-node link of the
device model (hermes_kb.core.devices ``LINKS``) a group's traffic most likely takes. Formulas:
docs/analysis/comm.md."""

from __future__ import annotations

from typing import Any

from hermes_kb.core.devices import UNKNOWN_LINK, Link, device_link

from ..context import RankContext

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


def group_bandwidth(ctx: RankContext, row: Any, n: int | None,
                    kernel: bool) -> tuple[float | None, float | None, float | None, float | None]:  # fmt: skip
    """(NCCL factor, algbw, busbw, best busbw) in GB/s of one (group, kind) row of the per-group
    table (groups.py: its ``sized``, ``sized_dur``, ``bytes``, ``mib``, ``best_bw`` sums), for a
    group of ``n`` ranks (None: unknown); None where it cannot be told."""
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
    return factor, algbw, busbw, best


__all__ = ["bus_factor", "group_bandwidth", "group_link"]
