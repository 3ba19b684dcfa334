"""A rank's what-if replay state, and the replay functions the advisor calls on it.

The replay itself (the rank's dependency graph as a ``SimModel``, shortened sets replayed) is
the whatif analyzer's (analyzers/whatif/replay.py, docs/analysis/whatif.md); the advisor reaches
it through here, as it reaches every analyzer through the analysis layer."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..analyzers.whatif.job_forms import job_part
from ..analyzers.whatif.replay import SimModel, evaluate, removed_at, removed_together, replay_targets


@dataclass
class ReplayState:
    """What the advisor needs to replay a rank's graph with several sets shortened at once."""

    model: Any  # SimModel
    amounts: dict[str, Any]  # target -> µs per node
    drop_waits: set[str]  # targets whose fix removes the waits themselves
    critical: dict[str, float] | None = None  # target -> µs on the critical chain (deferred replays only)
    deferred: bool = False  # the replays wait for the advisor (advisor/on_demand.py)
    job: Any = None  # analyzers.whatif.job_forms.JobPart: the rank's collectives in its graph (job.py)


def replay_state(shared: Any, *, with_deferral: bool = True) -> ReplayState | None:
    """The state an analysed rank's context holds (None when the rank has no replayable graph)."""
    model = shared.get("whatif_model")
    if model is None:
        return None
    part = job_part(shared)
    if not with_deferral:
        return ReplayState(model, shared.get("whatif_amounts", {}), shared.get("whatif_drops", set()), job=part)
    return ReplayState(model, shared.get("whatif_amounts", {}), shared.get("whatif_drops", set()),
                       shared.get("whatif_critical"), bool(shared.get("whatif_defer")), part)  # fmt: skip


def removed_by(state: ReplayState, amounts: np.ndarray, fraction: float, drop_waits: bool = False) -> float:
    """µs the analysed span loses with ``amounts`` (µs per graph node) shortened by ``fraction``:
    the replay the whatif analyzer runs for a set's points (f = 0.5 and 1), at any fraction."""
    return float(evaluate(state.model, amounts, min(max(float(fraction), 0.0), 1.0), drop_waits))


def matching_amounts(shared: Any, pattern: str) -> tuple[np.ndarray, list[str], list[float] | None]:
    """A what-if set made of every graph node whose name matches ``pattern`` (a regular
    expression searched in host segment, kernel and copy names), each node whole, with the
    names that matched (most time first) and the window they span (first start, last end, µs).
    Zero amounts when the rank has no replay graph."""
    g = shared.get("graph")
    if g is None or shared.get("whatif_model") is None:
        return np.zeros(0), [], None
    rx = re.compile(pattern)
    hit = np.fromiter((bool(rx.search(n)) for n in g.names), dtype=bool, count=len(g.names))
    mask = hit[g.name]
    amounts = np.where(mask, np.clip(g.end - g.start, 0.0, None), 0.0)
    by_name: dict[str, float] = {}
    for i in np.flatnonzero(mask).tolist():
        by_name[g.names[int(g.name[i])]] = by_name.get(g.names[int(g.name[i])], 0.0) + float(amounts[i])
    sel = np.flatnonzero(mask)
    window = [float(g.start[sel].min()), float(g.end[sel].max())] if len(sel) else None
    return amounts, sorted(by_name, key=lambda k: -by_name[k]), window


__all__ = ["ReplayState", "SimModel", "matching_amounts", "removed_at", "removed_by", "removed_together",
           "replay_state", "replay_targets"]
