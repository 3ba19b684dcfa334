"""``analyze``: a TraceBundle (or paths) in, the list of facts out."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .facts.base import Fact
from .cpus import usable_cpus
from .trace import TraceBundle, load
from .workers import Died, can_fork, run_each

_BUNDLE: TraceBundle | None = None  # read by forked workers
_FORK_LOCK = threading.Lock()


@dataclass
class ReplayState:
    """What the advisor needs to replay a rank's graph with several sets shortened at once."""

    model: Any  # analyzers.whatif.SimModel
    amounts: dict[str, Any]  # target -> µs per node
    drop_waits: set[str]  # targets whose fix removes the waits themselves
    critical: dict[str, float] | None = None  # target -> µs on the critical chain (deferred replays only)
    deferred: bool = False  # the replays wait for the advisor (whatif_on_demand.py)


def _rank_job(rank: int):
    from .analyzers import analyze_rank

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
    amounts, analyzers/whatif.py), which the advisor needs to replay several fixes together.
    ``defer_replays``: ranks analysed in this process leave their what-if replays to
    ``whatif_on_demand.replay_needed`` (ranks in worker processes replay every set there)."""
    from .analyzers import analyze_cross_rank, analyze_rank

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
        results = [analyze_rank(bundle[r], defer_replays=defer_replays) for r in ranks]
    contexts = {r: ctx for r, (ctx, _) in zip(ranks, results)}
    facts: list[Fact] = [f for _, fs in results for f in fs]
    facts.extend(analyze_cross_rank(contexts, facts))
    replay = {r: ReplayState(c.shared["whatif_model"], c.shared.get("whatif_amounts", {}),
                             c.shared.get("whatif_drops", set()), c.shared.get("whatif_critical"),
                             bool(c.shared.get("whatif_defer")))
              for r, c in contexts.items() if c.shared.get("whatif_model") is not None}  # fmt: skip
    return facts, replay


def analyze(path_or_bundle: TraceBundle | str | os.PathLike | Sequence, *, max_workers: int | None = None) -> list[Fact]:
    """Facts about a trace: ``hermes_kb.analyze("trace.json.gz")`` or ``analyze(bundle)``."""
    if not isinstance(path_or_bundle, TraceBundle):
        from .run_advice import analyze_run_dir, as_run_dir

        if (run_dir := as_run_dir(path_or_bundle)) is not None:  # a monitor RUN_DIR (rank<R>.jsonl)
            return analyze_run_dir(run_dir, max_workers=max_workers).facts
    bundle = path_or_bundle if isinstance(path_or_bundle, TraceBundle) else load(path_or_bundle, max_workers=max_workers)
    return analyze_bundle(bundle, max_workers=max_workers)
