"""Host-to-device copies (``h2d_copies``): per source memory kind (pageable / pinned / other), over
all analysed steps: bytes, device and host time, bandwidth, the time the steps wait for them, and
what pinned memory would take instead."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hermes_kb.core.devices import device_of_trace
from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.io import HostToDeviceCopies

from .. import intervals as iv
from ..context import RankContext
from ..selection import div, memcpy_runtime, window_arrays
from ..whatif.sets import WhatIfSet, register

# pinned host-to-device copies reach about this share of the link's one-direction rate (pinned
# cudaMemcpy benchmarks: ~12-13 of 15.75 GB/s on Gen3, ~25 of 31.5 on Gen4, ~50-55 of 63 on Gen5)
PINNED_LINK_SHARE = 0.8


def _pinned_copy(ctx: RankContext, nbytes: int) -> float | None:
    """µs the bytes take from pinned memory on this rank's device (None: device or link unknown)."""
    dev = device_of_trace(ctx.trace)
    link = dev.host_link_bytes_per_s if dev is not None else None
    if not link:
        return None
    return nbytes / (PINNED_LINK_SHARE * link) * 1e6


def h2d_copies(ctx: RankContext) -> list[Fact]:
    """``h2d_copies`` facts, one per source memory kind with copies in the steps."""
    tr = ctx.trace
    mc = tr.memcpy
    if not len(mc):
        return []
    hm = (mc["kind"] == "HtoD").to_numpy() & (ctx.step_of(mc["ts"].to_numpy()) >= 0)
    if not hm.any():
        return []
    idx = np.flatnonzero(hm)
    host = np.zeros(len(mc))
    mi, ri = memcpy_runtime(tr, "HtoD")
    host[mi] = tr.runtime["dur"].to_numpy()[ri]
    src = mc["src"].astype(str).to_numpy()[idx]
    kind = np.where(src == "Pageable", "pageable", np.where(src == "Pinned", "pinned", "other"))
    df = pd.DataFrame({"kind": kind, "dur": mc["dur"].to_numpy()[idx], "bytes": mc["bytes"].to_numpy()[idx],
                       "host": host[idx], "ts": mc["ts"].to_numpy()[idx], "end": mc["end"].to_numpy()[idx]})  # fmt: skip
    all_bytes = float(df["bytes"].clip(lower=0).sum())
    ws, we = window_arrays(ctx)
    kt = tr.kernels
    kernels = iv.union(kt["ts"].to_numpy(float), kt["end"].to_numpy(float)) if len(kt) else iv.EMPTY
    call_s, call_e = np.full(len(mc), np.nan), np.full(len(mc), np.nan)
    call_s[mi], call_e[mi] = tr.runtime["ts"].to_numpy()[ri], tr.runtime["end"].to_numpy()[ri]
    df["call_s"], df["call_e"] = call_s[idx], call_e[idx]
    facts: list[Fact] = []
    for k, g in df.groupby("kind", sort=True):
        has_call = np.isfinite(g["call_s"].to_numpy())
        held = iv.union(np.concatenate([g["ts"].to_numpy(float), g["call_s"].to_numpy()[has_call]]),
                        np.concatenate([g["end"].to_numpy(float), g["call_e"].to_numpy()[has_call]]))  # fmt: skip
        waited = float(iv.overlap_length(ws, we, iv.subtract(held, kernels) if len(kernels[0]) else held).sum())
        window = float((we - ws).sum())
        if k == "pageable":
            rows = idx[kind == "pageable"]
            own = np.isin(mi, rows)  # the calls that issued them
            register(ctx, WhatIfSet.of_intervals(
                "h2d_pageable", "host-to-device copies from pageable memory, and the calls that issued them",
                tr.runtime["tid"].to_numpy()[ri[own]], call_s[mi[own]], call_e[mi[own]], memcpy=rows))  # fmt: skip
        b = int(g["bytes"].clip(lower=0).sum())
        dev = float(g["dur"].sum())
        longest = g.nlargest(3, "dur")
        pinned = _pinned_copy(ctx, b) if k == "pageable" else None
        facts.append(HostToDeviceCopies(
            rank=tr.rank, src=k, pageable=k == "pageable", copies_count=len(g), copied_bytes=b, device_us=dev,
            host_us=float(g["host"].sum()), bandwidth_gbps=(b / dev / 1e3) if dev > 0 else None,
            share_of_h2d_bytes_ratio=div(b, all_bytes), largest_bytes=int(g["bytes"].max()),
            window_us=window, waited_us=waited, waited_ratio=min(div(waited, window), 1.0),
            pinned_copy_us=pinned,
            pinned_removes_low_ratio=(min(max(1.0 - pinned / waited, 0.0), 1.0) if pinned is not None and waited > 0
                                      else None),
            pinned_removes_high_ratio=1.0 if pinned is not None and waited > 0 else None,
            evidence=Evidence(time_ranges_us=list(zip(longest["ts"].astype(float), longest["end"].astype(float))),
                              events=[f"Memcpy HtoD ({ {'pageable': 'Pageable', 'pinned': 'Pinned'}.get(k, 'Host')} -> Device)"],
                              counts={"memcpy": len(g)},
                              note="bandwidth = bytes / summed device duration (1 GB/s = 1e3 bytes/µs); waited = "
                                   "copies and their calls, minus kernel time, within the step windows"),
        ))  # fmt: skip
    return facts
