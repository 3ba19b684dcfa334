"""A job's files analysed rank by rank, here or on a Dask cluster: the one entry the advisor
calls for a streamed job."""

from __future__ import annotations

import os
from collections.abc import Sequence

from .local import analyse_local, stream_workers
from .stream import Progress, StreamedJob


def analyse_files(files: Sequence[str], *, workers: int | None = None, dask: str | None = None,
                  progress: Progress | None = None) -> StreamedJob:  # fmt: skip
    """The streamed analysis of ``files`` (one per rank) locally or on a Dask scheduler."""
    if dask:
        from .on_dask import analyse_on_dask

        return analyse_on_dask(files, dask, progress=progress)
    return analyse_local(files, stream_workers(len(files), workers), progress)


def dask_address(option: str | None) -> str | None:
    """The scheduler from ``--dask`` or, without it, HERMES_DASK_SCHEDULER."""
    return option or os.environ.get("HERMES_DASK_SCHEDULER") or None


__all__ = ["analyse_files", "dask_address", "stream_workers"]
