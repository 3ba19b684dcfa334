"""The per-rank stage as Dask tasks: one task per rank file, run by the cluster's workers where
the files are (every worker must see the paths this process passes, e.g. a shared file system),
and the cross-rank stage here on what comes back (stream.gather, as for the local pool).

dask/distributed are an optional extra (``pip install 'hermes-kb[dask]'``); nothing else in
hermes imports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..analysis.replay_store import SpilledReplay
from ..core.errors import EXIT_ENVIRONMENT, HermesError
from ..facts.store import SpilledFacts
from .stream import Progress, StreamedJob, analyse_rank_file, gather, settle

CONNECT_TIMEOUT_S = 30


class DaskUnavailableError(HermesError):
    """``--dask`` without the extra installed, or a scheduler that cannot be reached: the
    environment, not the input (exit code 7, not 4: the traces may be fine)."""

    exit_code = EXIT_ENVIRONMENT


def _client(address: str):
    try:
        from distributed import Client
    except ImportError:
        raise DaskUnavailableError(
            "--dask needs dask.distributed, which is not installed: pip install 'hermes-kb[dask]'"
        ) from None
    try:
        return Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise DaskUnavailableError(f"cannot reach the Dask scheduler at {address}: {exc}") from None


def analyse_on_dask(files: Sequence[str], address: str, progress: Progress | None = None) -> StreamedJob:
    """Every rank as a task on the scheduler at ``address``; each result is fetched and released
    as it finishes, so neither the cluster nor this process holds more than it must. A task that
    fails (its worker died more often than the scheduler allows) costs its own rank."""
    client = _client(address)
    from distributed import as_completed
    try:
        futures = client.map(analyse_rank_file, list(files), pure=False)
        place = {f.key: i for i, f in enumerate(futures)}
        results: list[Any] = [None] * len(files)
        replay, store = SpilledReplay(), SpilledFacts()
        for done, fut in enumerate(as_completed(futures, loop=client.loop), start=1):
            i = place[fut.key]
            try:
                results[i] = fut.result()
            except Exception as exc:  # noqa: BLE001 - KilledWorker, a lost worker: this rank only
                results[i] = exc
            settle(results[i], i, replay, store)
            fut.release()
            if progress:
                progress(done, len(files), files[i])
        return gather(files, results, replay, store)
    finally:
        client.close()


__all__ = ["DaskUnavailableError", "analyse_on_dask"]
