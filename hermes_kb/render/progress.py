"""Progress on stderr while hermes works, only on an interactive terminal: the files being read
(each with its size, so a single big file shows too), then the analysis stages (each rank's
analyzers, the job-wide ones, the rules, the report).

The display is redrawn when a stage changes, never from a background thread: the trace reader
forks to build a big file in two processes only when the process has no other thread, and a
refresh thread would cost it that."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def _size(path: str) -> str:
    try:
        if os.path.isdir(path):
            return "directory"
        n = os.path.getsize(path)
    except OSError:
        return ""
    return f"{n / 1e6:,.1f} MB" if n >= 1e5 else f"{n / 1e3:,.1f} kB"


class Stages:
    """What the CLI calls as work advances. A no-op unless ``live``."""

    def __init__(self, bar=None, task=None):
        self._bar, self._task = bar, task

    @property
    def live(self) -> bool:
        return self._bar is not None

    def stage(self, what: str, done: int | None = None, total: int | None = None) -> None:
        if self._bar is None:
            return
        from ..core.sanitize import clean_line

        self._bar.update(self._task, description=clean_line(what), completed=done or 0, total=total)
        self._bar.refresh()

    def reading(self, paths: list[str]) -> None:
        if len(paths) == 1:
            self.stage(f"reading {Path(paths[0]).name} ({_size(paths[0])})", 0, 1)
        else:
            self.stage(f"reading {len(paths)} inputs", 0, len(paths))

    def loaded(self, done: int, total: int, path: str) -> None:
        """The trace loader's progress callback."""
        self.stage(f"read {Path(path).name} ({_size(path)})", done, total)


@contextmanager
def stages(enabled: bool | None = None) -> Iterator[Stages]:
    """A Stages reporter drawing on stderr (when stderr is a terminal, or ``enabled``)."""
    if not (sys.stderr.isatty() if enabled is None else enabled):
        yield Stages()
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("hermes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"),
        transient=True, auto_refresh=False, console=Console(stderr=True),
    ) as bar:  # fmt: skip
        yield Stages(bar, bar.add_task("", total=None))


@contextmanager
def load_progress(n_inputs: int) -> Iterator[Callable[[int, int, str], None] | None]:
    """The loader's progress callback alone (kept for callers of the previous API)."""
    with stages() as st:
        yield st.loaded if st.live else None
