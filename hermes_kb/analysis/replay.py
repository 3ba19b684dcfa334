"""A rank's what-if replay state, and the replay functions the advisor calls on it.

The replay itself (the rank's dependency graph as a ``SimModel``, shortened sets replayed) is
the whatif analyzer's (analyzers/whatif/replay.py, docs/analysis/whatif.md); the advisor reaches
it through here, as it reaches every analyzer through the analysis layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..analyzers.whatif.replay import SimModel, removed_at, removed_together, replay_targets


@dataclass
class ReplayState:
    """What the advisor needs to replay a rank's graph with several sets shortened at once."""

    model: Any  # SimModel
    amounts: dict[str, Any]  # target -> µs per node
    drop_waits: set[str]  # targets whose fix removes the waits themselves
    critical: dict[str, float] | None = None  # target -> µs on the critical chain (deferred replays only)
    deferred: bool = False  # the replays wait for the advisor (advisor/on_demand.py)


def replay_state(shared: Any, *, with_deferral: bool = True) -> ReplayState | None:
    """The state an analysed rank's context holds (None when the rank has no replayable graph)."""
    model = shared.get("whatif_model")
    if model is None:
        return None
    if not with_deferral:
        return ReplayState(model, shared.get("whatif_amounts", {}), shared.get("whatif_drops", set()))
    return ReplayState(model, shared.get("whatif_amounts", {}), shared.get("whatif_drops", set()),
                       shared.get("whatif_critical"), bool(shared.get("whatif_defer")))  # fmt: skip


__all__ = ["ReplayState", "SimModel", "removed_at", "removed_together", "replay_state", "replay_targets"]
