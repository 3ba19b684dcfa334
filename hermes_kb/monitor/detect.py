"""Online fluctuation detection on step times: rolling median and MAD (robust to the spikes it looks for)."""

from __future__ import annotations

from collections import deque

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation


class RollingDetector:
    """A step is a fluctuation when it exceeds the rolling median of the previous ``window``
    steps by more than ``k`` robust standard deviations (and by at least ``min_excess`` of the
    median, so that perfectly regular loops do not flag noise). Eight flags in a row are a new
    level, not spikes: the window restarts from those steps."""

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
        self._run = 0  # flags in a row
        self.shift = max(min_steps, 8)  # this many flags in a row: the level moved

    def update(self, seconds: float) -> tuple[bool, float | None]:
        """(is_fluctuation, rolling median before this step)."""
        flagged = False
        if len(self.times) >= self.min_steps:
            # every 8 steps while the window fills, then every ``refresh`` (a sort of the window), and
            # every 8 again while 4 or more steps in a row are flagged (the level moved: the old limit
            # would flag every step until the next refresh)
            every = self.refresh if len(self.times) == self.times.maxlen and self._run < 4 else min(self.refresh, 8)
            if self._since >= every or self._limit is None:
                ordered = sorted(self.times)
                n = len(ordered)
                med = (ordered[n // 2] + ordered[(n - 1) // 2]) / 2.0
                dev = sorted([abs(t - med) for t in ordered])
                mad = (dev[n // 2] + dev[(n - 1) // 2]) / 2.0
                self._med = med
                self._limit = med + max(self.k * MAD_TO_SIGMA * mad, self.min_excess * med)
                self._since = 0
            self._since += 1
            flagged = seconds > self._limit
            self._run = self._run + 1 if flagged else 0
        self.times.append(seconds)
        if self._run >= self.shift:
            # that many slow steps in a row are a new level, not spikes: judge from it on
            recent = list(self.times)[-self.shift :]
            self.times.clear()
            self.times.extend(recent)
            self._since, self._limit, self._run = self.refresh, None, 0
        return flagged, self._med

    def reset(self, values) -> None:
        """Start again from ``values`` (the settled end of warm-up): warm-up noise would widen the
        MAD and hide the slow steps after it for a whole window."""
        self.times.clear()
        self.times.extend(values)
        self._since = self.refresh
        self._med = self._limit = None

    @property
    def limit(self) -> float | None:
        """The step time above which the current step is flagged."""
        return self._limit
