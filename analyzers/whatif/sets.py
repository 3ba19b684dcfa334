"""The sets of events a fix acts on, as analyzers hand them to the what-if replay
(analyzers/whatif/replay.py). Kept apart so that any analyzer can register one without importing the
replay (which needs the critical-path graph)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..context import RankContext


@dataclass
class WhatIfSet:
    """The events one fix acts on, on one rank."""

    name: str
    description: str
    host_tid: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per host interval
    host_start: np.ndarray = field(default_factory=lambda: np.zeros(0))
    host_end: np.ndarray = field(default_factory=lambda: np.zeros(0))
    kernels: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # rows of trace.kernels
    memcpy: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # rows of trace.memcpy
    drop_waits: bool = False  # the fix removes the waits themselves (a sync that is no longer called)
    # the fix removes these kernels' calls, not only their device time (fusion, a fused optimizer,
    # conversions no longer made): the host work of the operators that launched only set kernels
    # goes with them (replay.node_amounts)
    launches: bool = False

    @staticmethod
    def of_intervals(name: str, description: str, tid, start, end, **kw) -> WhatIfSet:
        tid = np.broadcast_to(np.asarray(tid, dtype=np.int64), np.shape(start)).copy()
        return WhatIfSet(name, description, tid, np.asarray(start, float), np.asarray(end, float), **kw)


def register(ctx: RankContext, s: WhatIfSet) -> None:
    """Hand a set to the what-if analyzer (run after every other per-rank analyzer)."""
    sets = ctx.shared.setdefault("whatif_sets", {})
    old = sets.get(s.name)
    if old is None:
        sets[s.name] = s
        return
    sets[s.name] = WhatIfSet(
        s.name, old.description,
        np.concatenate([old.host_tid, s.host_tid]), np.concatenate([old.host_start, s.host_start]),
        np.concatenate([old.host_end, s.host_end]), np.unique(np.concatenate([old.kernels, s.kernels])),
        np.unique(np.concatenate([old.memcpy, s.memcpy])), old.drop_waits or s.drop_waits, old.launches or s.launches,
    )  # fmt: skip
