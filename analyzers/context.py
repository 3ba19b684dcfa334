"""What every per-rank analyzer receives: the rank's frames and its step windows."""

from __future__ import annotations

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


@dataclass
class RankContext:
    trace: RankTrace
    windows: list[StepWindow]
    excluded_steps: list[int] = field(default_factory=list)
    step_source: str = "profiler_step"
    # derived data one analyzer hands to those after it (PER_RANK order), e.g.
    # shared["critical_path"][step] = DataFrame of the path's segments; see each analyzer's docs
    shared: dict[str, Any] = field(default_factory=dict)

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
