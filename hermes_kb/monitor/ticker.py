"""The monitor's one background thread (``Ticker``): capture-request polling, log flushes and
the slow-rank board, each at its own interval."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Ticker:
    """The monitor's one background thread: runs each task at its own interval, never raising.
    While ``paused`` (a capture is running: the profiler would record this thread's work) only
    the tasks that are not ``pausable`` run."""

    def __init__(self, tasks: list[tuple[float, Callable[[], None], bool]]):
        self.tasks = [[max(float(every), 0.01), fn, pausable, float("-inf")] for every, fn, pausable in tasks]
        self.period = min(t[0] for t in self.tasks)
        self.paused = False
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hermes-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            now = time.monotonic()
            for task in self.tasks:
                if now - task[3] < task[0] - 1e-3 or (self.paused and task[2]):
                    continue
                task[3] = now
                try:
                    task[1]()
                except Exception:
                    self.errors += 1

