"""Device step time from CUDA events, read lazily: never a synchronise in the training loop.

At each step boundary one event is recorded on the current stream; step N's device time is
the elapsed time between the events of boundaries N-1 and N (the stream's pace, idle gaps
included). Finished events are found with ``query()`` at later boundaries and their times
are attached to a later step record as ``device_s: [[step, seconds], ...]``. Events are
reused from a small pool; if the device falls more than ``max_pending`` boundaries behind,
the oldest are dropped (their steps simply have no device time).
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from typing import Any


def cuda_event_factory() -> Callable[[], Any] | None:
    """torch.cuda.Event(enable_timing=True) when torch is already imported and CUDA initialised."""
    torch = sys.modules.get("torch")  # never import torch from the monitor
    try:
        if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
    except Exception:
        return None
    return lambda: torch.cuda.Event(enable_timing=True)


class DeviceTimer:
    def __init__(self, factory: Callable[[], Any], max_pending: int = 64):
        self.factory = factory
        self.max_pending = max_pending
        self._free: list[Any] = []
        self._prev: Any = None  # event of the previous boundary
        self._pending: deque[tuple[int, Any, Any]] = deque()  # (step, start event, end event)

    def _event(self) -> Any:
        return self._free.pop() if self._free else self.factory()

    def start(self) -> None:
        self._prev = self._event()
        self._prev.record()

    def boundary(self, step: int) -> list[list[float]]:
        """Close ``step`` on the device; return [step, seconds] of every step finished since."""
        ev = self._event()
        ev.record()
        if self._prev is not None:
            self._pending.append((step, self._prev, ev))
        self._prev = ev
        done: list[list[float]] = []
        while self._pending:
            s, a, b = self._pending[0]
            if not b.query():  # events complete in stream order: the rest are later
                break
            self._pending.popleft()
            done.append([s, a.elapsed_time(b) / 1e3])  # elapsed_time is in ms
            self._free.append(a)  # pairs are consecutive: a ended the pair before, already gone
        while len(self._pending) > self.max_pending:
            self._free.append(self._pending.popleft()[1])
        return done


# cumulative counters of the CUDA caching allocator (torch.cuda.memory_stats) kept in the samples:
# a retry is an allocation that failed, emptied the cache (a device synchronisation and cudaFree of
# every unused block) and tried again; device allocs / frees are cudaMalloc / cudaFree calls
ALLOCATOR_KEYS = {"num_alloc_retries": "dev_alloc_retries", "num_device_alloc": "dev_mallocs",
                  "num_device_free": "dev_frees", "num_ooms": "dev_ooms",
                  "reserved_bytes.all.current": "dev_reserved_bytes",
                  "allocated_bytes.all.current": "dev_allocated_bytes",
                  "reserved_bytes.all.peak": "dev_reserved_peak_bytes"}


def device_allocator(torch: Any) -> dict[str, int]:
    """The caching allocator's counters, when torch has initialised CUDA (never initialises it)."""
    try:
        if torch is None or not torch.cuda.is_initialized():
            return {}
        stats = torch.cuda.memory_stats()
    except Exception:
        return {}
    return {name: int(stats[key]) for key, name in ALLOCATOR_KEYS.items() if key in stats}
