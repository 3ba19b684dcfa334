"""A TraceBundle's facts: every rank through the per-rank analyzers (in forked workers when there
are several ranks and cores), then the job through the cross-rank ones."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from ..core.cpus import usable_cpus
from ..core.workers import Died, can_fork, run_each
from ..facts.base import Fact
from ..trace import TraceBundle
from .rank import analyze_cross_rank, analyze_rank
from .replay import ReplayState, replay_state

_BUNDLE: TraceBundle | None = None  # read by forked workers
_FORK_LOCK = threading.Lock()


def _rank_job(rank: int):
    assert _BUNDLE is not None
    return analyze_rank(_BUNDLE[rank])


def _workers(n: int, max_workers: int | None) -> int:
    cpus = usable_cpus()
    return max(1, min(n, max_workers or cpus))


def analyze_bundle(bundle: TraceBundle, *, max_workers: int | None = None) -> list[Fact]:
    """Per-rank analyzers (in parallel forked workers when there are several ranks and cores and
    no other thread runs in this process; else here, rank after rank), then the cross-rank ones.
    Facts come back ordered: per rank in rank order, then job-wide."""
    return analyze_with_replay(bundle, max_workers=max_workers)[0]


def analyze_with_replay(bundle: TraceBundle, *, max_workers: int | None = None,
                        defer_replays: bool = False) -> tuple[list[Fact], dict[int, Any]]:  # fmt: skip
    """``analyze_bundle``, plus each rank's what-if replay state (the model and the sets' node
    amounts, analyzers/whatif/replay.py), which the advisor needs to replay several fixes together.
    ``defer_replays``: ranks analysed in this process leave their what-if replays to
    ``whatif_on_demand.replay_needed`` (ranks in worker processes replay every set there)."""
    global _BUNDLE
    ranks = bundle.rank_ids
    n = _workers(len(ranks), max_workers)
    results: list = []
    if n > 1 and can_fork():
        with _FORK_LOCK:  # _BUNDLE is read by the children forked while it is set
            _BUNDLE = bundle
            try:
                results = run_each(_rank_job, [(r,) for r in ranks], n)
            finally:
                _BUNDLE = None
        # a rank whose worker died or failed is analysed here instead (an analyzer's own errors
        # are already facts, so this is a worker killed from outside, or a result that did not
        # come back); the contexts hold the frames: rebuilt here (cheap) rather than shipped back
        for i, r in enumerate(ranks):
            if isinstance(results[i], (Died, BaseException)):
                results[i] = analyze_rank(bundle[r])
            else:
                results[i][0].trace = bundle[r]
    else:  # one rank, one core, or a process where forking is not safe (other threads running)
        results = [analyze_rank(bundle[r], defer_replays=defer_replays, alone=len(ranks) == 1) for r in ranks]
    contexts = {r: ctx for r, (ctx, _) in zip(ranks, results)}
    facts: list[Fact] = [f for _, fs in results for f in fs]
    facts.extend(analyze_cross_rank(contexts, facts))
    replay: dict[int, ReplayState] = {}
    for r, c in contexts.items():
        state = replay_state(c.shared)
        if state is not None:
            replay[r] = state
    return facts, replay


def empty_stretches(facts: Sequence[Fact]) -> list[tuple[Any, str]]:
    """(rank, why) of each step a rank's analysis left out as an empty stretch
    (analyzers/timeline/steps.py)."""
    out = []
    for f in facts:
        if f.kind == "step_structure" and "empty stretch" in (getattr(f, "excluded_reason", None) or ""):
            out += [(f.rank, p) for p in f.excluded_reason.split("; ") if "empty stretch" in p]
    return out


def excluded_step_warnings(facts: Sequence[Fact]) -> list[str]:
    """The steps a rank's analysis left out as empty stretches, named."""
    return [f"rank {rank}: {why}: left out" for rank, why in empty_stretches(facts)]

