"""What every per-rank analyzer receives: the rank's frames and its step windows."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from hermes_kb.trace.bundle import RankTrace


@dataclass(frozen=True)
class StepWindow:
    step: int
    start_us: float
    end_us: float  # analysis window end: next step's start, or the end of this step's last launched activity
    cpu_end_us: float  # end of the step annotation itself

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


class UndeclaredKeyError(KeyError):
    """An analyzer used a ``ctx.shared`` key its registry entry does not declare (a bug)."""


class Shared(dict):
    """``ctx.shared``: what one analyzer hands to those after it. While an analyzer runs, only
    the keys its registry entry declares (hermes_kb/analysis/registry.py: ``reads`` and
    ``gives``) can be read or written; anything else raises, so the declared order is the real
    one. Outside the runner (tests, tools that call an analyzer directly) every key is open."""

    __slots__ = ("_allowed", "_who")

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._allowed: frozenset[str] | None = None
        self._who = ""

    def __reduce__(self):  # pickled as a plain mapping of its items (forked workers send contexts back)
        return (Shared, (dict(self),))

    def _check(self, key: Any) -> None:
        if self._allowed is not None and key not in self._allowed:
            raise UndeclaredKeyError(f"analyzer {self._who!r} used ctx.shared[{key!r}], which "
                                     "hermes_kb/analysis/registry.py does not declare for it")  # fmt: skip

    @contextmanager
    def only(self, who: str, keys: frozenset[str]) -> Iterator[None]:
        self._allowed, self._who = keys, who
        try:
            yield
        finally:
            self._allowed, self._who = None, ""

    def __getitem__(self, key: Any) -> Any:
        self._check(key)
        return super().__getitem__(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._check(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: Any) -> None:
        self._check(key)
        super().__delitem__(key)

    def __contains__(self, key: object) -> bool:
        self._check(key)
        return super().__contains__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._check(key)
        return super().get(key, default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self._check(key)
        return super().setdefault(key, default)

    def pop(self, key: Any, *default: Any) -> Any:
        self._check(key)
        return super().pop(key, *default)


@dataclass
class RankContext:
    trace: RankTrace
    windows: list[StepWindow]
    excluded_steps: list[int] = field(default_factory=list)
    step_source: str = "profiler_step"
    # derived data one analyzer hands to those after it, in the registry's order
    # (hermes_kb/analysis/registry.py declares every key), e.g. shared["critical_path"][step] =
    # DataFrame of the path's segments
    shared: Shared = field(default_factory=Shared)

    @property
    def rank(self) -> int:
        return self.trace.rank

    @property
    def windows_us(self) -> float:
        """Summed length of the analysed step windows."""
        return float(sum(max(0.0, w.duration_us) for w in self.windows))

    @property
    def span(self) -> tuple[float, float]:
        """First window start to last window end (the analysed part of the trace)."""
        if not self.windows:
            return self.trace.time_span()
        return self.windows[0].start_us, self.windows[-1].end_us

    def step_of(self, ts: np.ndarray) -> np.ndarray:
        """Step number of each timestamp (-1 outside every analysed window)."""
        ts = np.asarray(ts, dtype=np.float64)
        if not self.windows:
            return np.full(len(ts), -1, dtype=np.int64)
        starts = np.array([w.start_us for w in self.windows])
        ends = np.array([w.end_us for w in self.windows])
        steps = np.array([w.step for w in self.windows])
        i = np.searchsorted(starts, ts, side="right") - 1
        ok = (i >= 0) & (ts < ends[np.clip(i, 0, None)])
        return np.where(ok, steps[np.clip(i, 0, None)], -1)

    def host_step_of(self, ts: np.ndarray) -> np.ndarray:
        """``step_of`` for host calls: the last window runs on to the end of its device work, but a
        host call made after the last step's annotation closed belongs to no step (torch.profiler's
        stop synchronises the device there, draining every step still queued)."""
        out = self.step_of(ts)
        last = self.windows[-1] if self.windows else None
        if last is not None and last.start_us < last.cpu_end_us < last.end_us:
            out = np.where((out == last.step) & (np.asarray(ts, dtype=np.float64) >= last.cpu_end_us), -1, out)
        return out

    def in_window(self, df: pd.DataFrame, w: StepWindow, col: str = "ts") -> pd.DataFrame:
        return df[(df[col] >= w.start_us) & (df[col] < w.end_us)]
