"""Online fluctuation detection on step times: rolling median and MAD (robust to the spikes it looks for)."""

from __future__ import annotations

from collections import deque
from statistics import median

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation


class RollingDetector:
    """A step is a fluctuation when it exceeds the rolling median of the previous ``window``
    steps by more than ``k`` robust standard deviations (and by at least ``min_excess`` of the
    median, so that perfectly regular loops do not flag noise)."""

    def __init__(self, window: int = 64, k: float = 5.0, min_steps: int = 8, min_excess: float = 0.2,
                 refresh: int = 8):  # fmt: skip
        self.times: deque[float] = deque(maxlen=window)
        self.k = k
        self.min_steps = min_steps
        self.min_excess = min_excess
        self.refresh = refresh  # the median and MAD move slowly: recompute them every few steps
        self._since = refresh
        self._med: float | None = None
        self._limit: float | None = None

    def update(self, seconds: float) -> tuple[bool, float | None]:
        """(is_fluctuation, rolling median before this step)."""
        flagged = False
        if len(self.times) >= self.min_steps:
            if self._since >= self.refresh or self._limit is None:
                ordered = sorted(self.times)
                med = median(ordered)
                mad = median(sorted(abs(t - med) for t in ordered))
                self._med = med
                self._limit = med + max(self.k * MAD_TO_SIGMA * mad, self.min_excess * med)
                self._since = 0
            self._since += 1
            flagged = seconds > self._limit
        self.times.append(seconds)
        return flagged, self._med
