"""What-if replays on demand: a rank analysed with its replays deferred (``analyze_rank(...,
defer_replays=True)``) carries each set's critical-path bound in its ``whatif`` facts; once the
cases have matched, only the sets a matched case's gain names are replayed, with the same
function and inputs as the eager analyzer, so those facts come out as ``hermes analyze`` makes
them. The other sets keep their bound and ``replayed: false``; no rule or case condition reads a
``whatif`` fact, so the matches do not depend on it. On the 54 MB HTA trace this is 2 replays
instead of 9 (docs/performance.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..analysis.replay import replay_targets
from ..analysis.replay_store import SpilledReplay
from ..facts.base import Fact
from ..facts.flat import flatten
from ..kb.matches import Inference


def replay_needed(inf: Inference, facts: list[Fact], replay: Mapping[Any, Any],
                  targets: set[tuple[Any, str]]) -> list[Fact]:  # fmt: skip
    """Replay ``targets`` ((rank, set), findings.whatif_targets: what the matched cases' gains
    name) on the ranks whose replays were deferred; the facts list (and the inference's copies of
    those facts) updated in place of the bounds. Returns the list."""
    if isinstance(replay, SpilledReplay):  # a streamed job's workers replay every set (and reading
        return facts  # each rank's state back to ask would cost a file per rank)
    deferred = {r: s for r, s in replay.items() if getattr(s, "deferred", False)}
    if not deferred:
        return facts
    wanted: dict[Any, set[str]] = {}
    for rank, target in targets:
        if rank in deferred:
            wanted.setdefault(rank, set()).add(target)
    if not wanted:
        return facts
    have = {(f.rank, f.target): f for f in facts if f.kind == "whatif"}
    new: dict[int, Fact] = {}  # id(old fact) -> replayed fact
    for rank, names in sorted(wanted.items(), key=lambda kv: str(kv[0])):
        state = deferred[rank]
        mine = {t: have[(rank, t)] for t in sorted(names) if (rank, t) in have}
        for t, fact in replay_targets(state.model, state.amounts, state.drop_waits, state.critical or {}, mine).items():
            new[id(mine[t])] = fact
    if not new:
        return facts
    for flat in inf.facts:
        old = inf.originals.get(flat.get("_id"))
        if old is not None and id(old) in new:
            fact = new[id(old)]
            inf.originals[flat["_id"]] = fact
            flat.update(flatten(fact))
    return [new.get(id(f), f) for f in facts]


__all__ = ["replay_needed"]
