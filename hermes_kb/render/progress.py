"""A progress display while traces load (only for several files on an interactive terminal)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def load_progress(n_inputs: int) -> Iterator[Callable[[int, int, str], None] | None]:
    if not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("loading"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"),
        transient=True,
    ) as bar:  # fmt: skip
        task = bar.add_task("", total=None)

        def update(done: int, total: int, path: str) -> None:
            bar.update(task, completed=done, total=total, description=Path(path).name)

        yield update
