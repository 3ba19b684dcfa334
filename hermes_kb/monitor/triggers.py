"""What makes the monitor capture by itself: the end of warm-up read from the step times, a step
slower than the rank's recent distribution (with the period of recurring ones, so that the capture
lands on the next one), and a sustained drop in throughput or MFU. The slowest rank of a domain is
found by ``peers.py``. Standard library only: the per-step work is an append and a comparison; the
statistics run once per block of steps.

Formulas and thresholds: docs/monitor.md ("Automatic captures").
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

MAD_TO_SIGMA = 1.4826


def _median(ordered: list[float]) -> float:
    n = len(ordered)
    return (ordered[n // 2] + ordered[(n - 1) // 2]) / 2.0


def robust(values: list[float]) -> tuple[float, float]:
    """(median, MAD) of ``values``."""
    ordered = sorted(values)
    med = _median(ordered)
    return med, _median(sorted([abs(v - med) for v in ordered]))


def outlier_limit(med: float, mad: float, k: float = 5.0, min_excess: float = 0.2) -> float:
    """The step time above which a step is slow: the rolling detector's rule."""
    return med + max(k * MAD_TO_SIGMA * mad, min_excess * med)


class WarmupDetector:
    """Warm-up ends when the step-time distribution settles. Every ``block`` steps, over the last
    ``blocks`` blocks:

    - the level is stable: the largest block median is within ``level_tol`` of the smallest, or
      within what chance allows a noisy job (3 standard errors of a block median: 3 x 1.25 x
      1.4826 x MAD / median / sqrt(block));
    - and the steps are quiet: the relative spread (MAD / median) at most ``quiet`` and at most
      ``max_outliers`` of the steps above median + max(5 x 1.4826 x MAD, 20% of the median) (the
      slow-step rule); or the noise has stopped falling: the spread no lower than ``stationary`` x
      the smallest of the previous three checks and the slow steps no fewer than their fewest there
      less one (a job that is noisy by nature, a GC every few steps, settles once its noise stops
      shrinking; a warm-up's noise shrinks).

    ``fixed`` (a step count) replaces the test. After ``max_steps`` steps warm-up ends anyway,
    flagged as not settled."""

    def __init__(self, block: int = 10, blocks: int = 3, level_tol: float = 0.10, max_outliers: float = 0.10,
                 quiet: float = 0.05, stationary: float = 0.8, max_steps: int = 500, fixed: int | None = None):  # fmt: skip
        self.block = max(2, block)
        self.blocks = max(2, blocks)
        self.level_tol = level_tol
        self.max_outliers = max_outliers
        self.quiet = quiet
        self.stationary = stationary
        self.max_steps = max_steps
        self.fixed = fixed
        self.window: deque[float] = deque(maxlen=self.block * self.blocks)
        self.spreads: deque[tuple[float, int]] = deque(maxlen=3)  # (spread, slow steps) of the last checks
        self.seen = 0
        self.done = False
        self.result: dict[str, Any] | None = None

    def update(self, step: int, wall: float) -> dict[str, Any] | None:
        """Feed one (observed) step; returns the warm-up record on the step it ends."""
        if self.done:
            return None
        self.window.append(wall)
        self.seen += 1
        if self.fixed is not None:
            if self.seen >= self.fixed:
                return self._end(step, True, f"fixed warm-up of {self.fixed} steps")
            return None
        if self.seen % self.block:
            return None
        vals = list(self.window)
        if len(vals) == self.window.maxlen:
            meds = [_median(sorted(vals[i : i + self.block])) for i in range(0, len(vals), self.block)]
            med, mad = robust(vals)
            limit = outlier_limit(med, mad)
            out = sum(1 for v in vals if v > limit)
            spread = mad / med if med > 0 else 0.0
            # block medians of a noisy job vary by chance: 3 standard errors of a median of ``block``
            # steps (1.25 sigma / sqrt(n)) are allowed beyond level_tol
            tol = max(self.level_tol, 3.0 * 1.25 * MAD_TO_SIGMA * spread / math.sqrt(self.block))
            level = max(meds) <= min(meds) * (1.0 + tol)
            quiet = spread <= self.quiet and out <= self.max_outliers * len(vals)
            # noisy by nature: neither the spread nor the share of slow steps is still falling
            stationary = (len(self.spreads) == self.spreads.maxlen and spread >= self.stationary * min(s for s, _ in self.spreads)
                          and out >= min(o for _, o in self.spreads) - 1)  # fmt: skip
            self.spreads.append((spread, out))
            if level and (quiet or stationary):
                ms = ", ".join(f"{m * 1e3:.3g}" for m in meds)
                why = (f"step times settled: the last {self.blocks} blocks of {self.block} steps have medians {ms} ms "
                       f"(within {tol:.0%}), {out} of {len(vals)} steps above the slow-step limit, "
                       f"spread (MAD/median) {spread:.1%}" + ("" if quiet else ", neither falling any more"))  # fmt: skip
                return self._end(step, True, why, med, mad, out)
        if self.seen >= self.max_steps:
            med, mad = robust(vals)
            return self._end(step, False, f"step times did not settle in {self.max_steps} steps: triggers armed anyway",
                             med, mad)  # fmt: skip
        return None

    def _end(self, step: int, settled: bool, why: str, med: float | None = None, mad: float | None = None,
             outliers: int | None = None) -> dict[str, Any]:  # fmt: skip
        self.done = True
        self.result = {"type": "warmup", "end_step": step, "steps": self.seen, "settled": settled, "reason": why}
        if med is not None:
            self.result.update(median_s=med, mad_s=mad)
        if outliers is not None:
            self.result["outliers"] = outliers
        return self.result

    def settled_values(self) -> list[float]:
        """The window that settled, without its outliers: the slow-step detector's first window."""
        vals = list(self.window)
        if not vals:
            return []
        med, mad = robust(vals)
        limit = outlier_limit(med, mad)
        return [v for v in vals if v <= limit]


class SlowSteps:
    """Remembers the slow steps flagged after warm-up and plans the capture that will hold the
    next one. Slow steps of one cause last about as long (a full GC, a checkpoint save, an
    evaluation): only those of a similar length (within ``similar`` of each other) are taken
    together, so scheduling noise does not make up a period. Three of them at two equal intervals
    (within max(1 step, 10%)) predict the next: the capture covers ``span`` steps around it. Three
    at uneven intervals: the capture covers the typical interval from now, when that is at most
    ``max_span`` steps (rarer and uneven: a capture would likely miss; ``skipped`` says so) and the
    step is more than barely above the limit (its excess over the median at least twice the
    limit's: scheduling noise hovers just above it). Fewer:
    no plan yet (a slow step that does not come back cannot be captured anyway).
    ``plan`` returns (first step to capture, steps to capture, what the plan rests on) or None."""

    def __init__(self, span: int = 3, max_span: int = 16, similar: float = 0.5, keep: int = 16):
        self.flagged: deque[tuple[int, float]] = deque(maxlen=keep)
        self.span = span
        self.max_span = max_span
        self.similar = similar
        self.skipped: str | None = None
        self._last = -2  # the last flagged step

    def remember(self, step: int, wall: float) -> None:
        """A slow step flagged while no capture can be planned: kept for the intervals."""
        if self._last == step - 1 and self.flagged:
            self.flagged[-1] = (self.flagged[-1][0], max(wall, self.flagged[-1][1]))
        else:
            self.flagged.append((step, wall))
        self._last = step

    def caught(self, step: int, wall: float) -> None:
        """A slow step a capture held (not flagged: profiled steps are not judged)."""
        self.flagged.append((step, wall))
        self._last = step

    def plan(self, step: int, wall: float, marginal: bool = False) -> tuple[int, int, str] | None:
        """``marginal``: the step is barely above the limit (scheduling noise looks like this):
        enough for a periodic plan, not for an uneven one."""
        self.skipped = None
        last, self._last = self._last, step
        if last == step - 1 and self.flagged:
            # slow steps in a row are one episode (or the step time moving to a new level, which the
            # throughput trigger watches): its start is what recurs
            self.flagged[-1] = (self.flagged[-1][0], max(wall, self.flagged[-1][1]))
            self.skipped = "slow steps in a row: one episode, or a new level (the throughput trigger watches that)"
            return None
        self.flagged.append((step, wall))
        tol = self.similar
        alike = [s for s, w in self.flagged if abs(w - wall) <= tol * (w if w > wall else wall)]
        if len(alike) < 3:
            return None
        s = alike[-4:]
        gaps = [b - a for a, b in zip(s, s[1:])]
        p = gaps[-1]
        if all(abs(g - p) <= max(1.0, 0.1 * p) for g in gaps[-2:]) and p >= self.span:
            first = step + p - self.span // 2
            how = (f"slow steps of about this length ({', '.join(map(str, s[-3:]))}) recur every {p} steps: capturing "
                   f"steps {first}-{first + self.span - 1} around the next (step {step + p})")  # fmt: skip
            return first, self.span, how
        typical = sorted(gaps)[len(gaps) // 2]
        if marginal:
            self.skipped = "uneven, barely above the limit: captured only if they recur at a regular interval"
            return None
        if typical + 1 > self.max_span:
            self.skipped = (f"uneven, every {typical} steps or so: a capture of at most {self.max_span} steps would "
                            f"likely miss the next")  # fmt: skip
            return None
        span = max(self.span, typical + 1)
        how = (f"slow steps of about this length ({', '.join(map(str, s[-3:]))}) come back every {typical} steps or "
               f"so, unevenly: capturing the next {span} steps")  # fmt: skip
        return step + 1, span, how


class RateDrop:
    """A sustained drop in throughput (samples/s), MFU or step rate: per block of ``block``
    observed steps, the median rate; the reference is the best block median since warm-up; a drop
    is ``sustain`` blocks in a row below (1 - ``drop``) x the reference. After it fires, the
    reference becomes the new level (it fires again only on a further drop)."""

    def __init__(self, drop: float = 0.15, block: int = 16, sustain: int = 3):
        self.drop = drop
        self.block = block
        self.sustain = sustain
        self.buf: list[float] = []
        self.ref: float | None = None
        self.ref_steps: tuple[int, int] | None = None
        self.low: list[tuple[float, int, int]] = []
        self.first_step: int | None = None

    def update(self, step: int, rate: float) -> tuple[float, float, int, int] | None:
        """Feed one observed step's rate; returns (reference, current, first, last step) on a drop.
        (The monitor appends to ``buf`` itself and calls ``block_end`` when it is full.)"""
        if not (rate > 0.0) or math.isinf(rate):
            return None
        if not self.buf:
            self.first_step = step
        self.buf.append(rate)
        if len(self.buf) < self.block:
            return None
        return self.block_end(step)

    def block_end(self, step: int) -> tuple[float, float, int, int] | None:
        med = _median(sorted(self.buf))
        span = (self.first_step if self.first_step is not None else step - len(self.buf) + 1, step)
        self.buf = []
        self.first_step = None
        if self.ref is None or med > self.ref:
            self.ref, self.ref_steps = med, span
            self.low = []
            return None
        if med < (1.0 - self.drop) * self.ref:
            self.low.append((med, *span))
            if len(self.low) >= self.sustain:
                cur = _median(sorted(m for m, _, _ in self.low))
                out = (self.ref, cur, self.low[0][1], self.low[-1][2])
                self.ref, self.ref_steps, self.low = cur, (self.low[0][1], self.low[-1][2]), []
                return out
        else:
            self.low = []
        return None


class Budget:
    """Automatic captures: at most ``per_hour`` an hour, and one kind of trigger at most half of
    them (at least one), so that a recurring symptom cannot starve the others. Warm-up cannot
    spend it: the triggers are armed only after warm-up."""

    def __init__(self, per_hour: int = 3):
        self.per_hour = max(0, per_hour)
        self.per_kind = max(1, self.per_hour // 2)
        self.times: deque[tuple[float, str]] = deque()

    def _prune(self, now: float) -> None:
        while self.times and now - self.times[0][0] > 3600.0:
            self.times.popleft()

    def why_not(self, kind: str, now: float) -> str | None:
        self._prune(now)
        if len(self.times) >= self.per_hour:
            return f"the hourly budget of {self.per_hour} automatic captures is spent"
        if sum(1 for _, k in self.times if k == kind) >= self.per_kind:
            return f"{kind} already had its {self.per_kind} automatic capture(s) this hour"
        return None

    def spend(self, kind: str, now: float) -> None:
        self.times.append((now, kind))

    def refund_kind(self, kind: str) -> None:
        """A capture that missed what it aimed at: it still counts in the hourly total, no longer
        against its kind's share."""
        for j in range(len(self.times) - 1, -1, -1):
            if self.times[j][1] == kind:
                self.times[j] = (self.times[j][0], f"{kind} (missed)")
                return


__all__ = ["Budget", "RateDrop", "SlowSteps", "WarmupDetector", "outlier_limit", "robust"]
