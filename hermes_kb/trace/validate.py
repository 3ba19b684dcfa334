"""Physical checks on trace events, shared by the Kineto and the Ascend readers (docs/reliability.md).

An event whose time cannot be real is dropped and counted, never analysed, so that one damaged
event cannot change the diagnosis; each reader names what it dropped, how many, and one example,
in a warning that reaches ``hermes inspect`` and the report. What is checked:

- ``ts`` and ``dur`` finite (``"inf"``, ``"-Infinity"``): dropped;
- ``dur`` not negative: dropped;
- the event inside the file's plausible time span: the bulk of its events (the 25th to the 75th
  percentile of their starts, so that up to a quarter of the events can be damaged without
  moving it) widened by 100 times its width, and by at least an hour on each side. One event at
  ``ts: 0`` in a trace whose clock reads 1.7e15 µs, or lasting a year in a trace of two seconds,
  is outside it. The 45 real Kineto traces of ../shared/data and the scenario recordings stay
  well inside (their farthest event: 12 s from a bulk 2 ms wide, inside the hour). A trace of
  fewer than 20 events has no bulk to speak of: its span is the hour on each side of its median
  start (so a ProfilerStep lasting 31 years in an 8-event trace is dropped too);
- exact duplicates (every column equal, including the ids and correlation that tell two real
  events apart): dropped, the first copy kept.

A value that is not a number at all (``"ts": "soon"``, a missing ``ts``, an object) stays an
error for the whole file: that is a broken file, not a damaged event.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SPAN_QUANTILES = (0.25, 0.75)
SPAN_FACTOR = 100.0
SPAN_FLOOR_US = 3600e6  # an hour
MIN_EVENTS_FOR_SPAN = 20

NON_FINITE = "with a non-finite ts or dur"
NEGATIVE = "with a negative dur"
OUTSIDE = "outside the trace's time span"
DUPLICATE = "exact duplicates of another event"


def plausible_window(starts: np.ndarray) -> tuple[float, float] | None:
    """(lowest start, highest end) an event of this file can have, in the file's own clock;
    None when no event has a finite start."""
    starts = starts[np.isfinite(starts)]
    if not len(starts):
        return None
    if len(starts) < MIN_EVENTS_FOR_SPAN:
        mid = float(np.median(starts))
        return mid - SPAN_FLOOR_US, mid + SPAN_FLOOR_US
    lo, hi = (float(x) for x in np.quantile(starts, SPAN_QUANTILES))
    r = max(SPAN_FACTOR * (hi - lo), SPAN_FLOOR_US)
    return lo - r, hi + r


def outside(ts: np.ndarray, dur: np.ndarray, window: tuple[float, float] | None) -> np.ndarray:
    if window is None:
        return np.zeros(len(ts), dtype=bool)
    lo, hi = window
    with np.errstate(invalid="ignore"):
        return (ts < lo) | (ts + dur > hi)


@dataclass
class Drops:
    """Events dropped by one reader: (what, reason) -> [count, first example]."""

    items: dict[tuple[str, str], list] = field(default_factory=dict)

    def add(self, what: str, reason: str, count: int, example: str) -> None:
        if count <= 0:
            return
        slot = self.items.setdefault((what, reason), [0, example])
        slot[0] += int(count)

    def merge(self, other: Drops) -> None:
        for (what, reason), (n, ex) in other.items.items():
            self.add(what, reason, n, ex)

    @property
    def total(self) -> int:
        return sum(n for n, _ in self.items.values())

    def message(self) -> str | None:
        if not self.items:
            return None
        parts = [f"{n} {what} event(s) {reason} (first: {ex})" for (what, reason), (n, ex) in self.items.items()]
        return f"dropped {self.total} event(s) whose times cannot be real: " + "; ".join(parts)


def example(name, ts, dur=None) -> str:
    text = f"{str(name)[:60]!r} ts={_num(ts)}"
    return text if dur is None else f"{text} dur={_num(dur)}"


def _num(v) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.17g}"
    return repr(v) if isinstance(v, str) else str(v)
