"""The per-rank stage of a streamed job on this machine: forked workers, one rank each at a
time (core/workers.py; a dead worker costs its own rank)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..analysis.registry import import_all
from ..analysis.replay_store import SpilledReplay
from ..core.cpus import usable_cpus
from ..core.workers import run_each
from ..facts.store import SpilledFacts
from .stream import Progress, StreamedJob, analyse_rank_file, gather, settle


def analyse_local(files: Sequence[str], workers: int, progress: Progress | None = None) -> StreamedJob:
    """Every rank through the local pool (``workers`` forked processes at a time)."""
    replay, store = SpilledReplay(), SpilledFacts()
    finished = 0

    def done(i: int, res: Any) -> None:
        nonlocal finished
        finished += 1
        settle(res, i, replay, store)
        if progress:
            progress(finished, len(files), files[i])

    _preload()
    results = run_each(analyse_rank_file, [(f,) for f in files], workers, done)
    return gather(files, results, replay, store)


def _preload() -> None:
    """Import every reader and analyzer here, once, so that each forked worker has them rather
    than importing them again for its one rank."""
    from ..trace.ascend import reader as ascend  # noqa: F401
    from ..trace.kineto import reader as kineto  # noqa: F401

    import_all()


def stream_workers(n_files: int, workers: int | None) -> int:
    return max(1, min(n_files, workers or usable_cpus()))


__all__ = ["analyse_local", "stream_workers"]
