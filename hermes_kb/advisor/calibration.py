"""Ranges with a stated coverage (issue 33, docs/advice.md#calibrated-ranges).

The gain model gives a range [S_lo, S_hi] of the fix's speedup. On the recorded zoo each
scenario's measured speedup M is compared with its model range on the logit of the removed share
m = 1 - 1/S: how far M fell under the low end, and how far it rose over the high end. The range a
report states moves the model's low end down and its high end up by the k-th largest of those
misses on the zoo (split-conformal, one margin per side, k = floor((n + 1)(1 - c) / 2)), so that a
range made this way holds a new run's measured speedup with probability c if that run is like
the zoo's; the point ("most likely") is the model range's middle moved by the median miss. On the
logit a fix the model rates as tiny stays tiny (a share's error is relative) and one rated large
keeps its scale (there the residue's error is relative).

hermes_kb/kb/calibration.json holds the model ranges and measured speedups (written by benchmarks/calibrate.py from the
zoo; CI checks it against the current model). Without it, or with HERMES_CALIBRATION=off, reports
give the model's own range. Every finding's confidence is the hit rate of its case's calibrated
ranges on the zoo, leave-one-out, with the number of runs it was measured on.
"""

from __future__ import annotations

import functools
import json
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CALIBRATION_FILE = Path(__file__).resolve().parents[1] / "kb" / "calibration.json"
COVERAGE = 0.8
# removed shares are clipped into (0, 1) before their logit: a fix that measured no gain (or a
# loss) counts as removing 0.1% of the step, and no range claims more than 99.9% of it (1000x)
MIN_SHARE = 1e-3
MAX_SHARE = 0.999


def share(speedup: float) -> float:
    """The share of the step a speedup removes (1 - 1/S), clipped into (MIN_SHARE, MAX_SHARE)."""
    return min(max(1.0 - 1.0 / speedup, MIN_SHARE), MAX_SHARE) if speedup > 0 else MIN_SHARE


def logit(speedup: float) -> float:
    m = share(speedup)
    return math.log(m / (1.0 - m))


def speedup_of(z: float) -> float:
    """The speedup whose removed share has logit z."""
    m = min(max(1.0 / (1.0 + math.exp(-z)), MIN_SHARE), MAX_SHARE)
    return 1.0 / (1.0 - m)


def kth_largest(values: list[float], coverage: float) -> float | None:
    """The k-th largest of n scores, k = floor((n + 1)(1 - coverage) / 2): a new score exchangeable
    with them exceeds it with probability at most about (1 - coverage) / 2 (split conformal, one
    side). None when there are too few scores for that (k < 1)."""
    v = sorted(values, reverse=True)
    k = math.floor((len(v) + 1) * (1.0 - coverage) / 2 + 1e-9)
    return v[k - 1] if 1 <= k <= len(v) else None


@dataclass(frozen=True)
class Scored:
    """One zoo scenario in the calibration: its case, the model's range and the measured speedup."""

    name: str
    case_id: str
    platform: str
    model_low: float
    model_high: float
    measured: float

    @property
    def below(self) -> float:
        """How far (logit) the measured speedup fell under the model's low end."""
        return logit(self.model_low) - logit(self.measured)

    @property
    def above(self) -> float:
        """How far (logit) it rose over the model's high end."""
        return logit(self.measured) - logit(self.model_high)

    @property
    def off_mid(self) -> float:
        """The measured speedup against the model range's geometric middle (logit)."""
        return logit(self.measured) - logit(math.sqrt(self.model_low * self.model_high))


@dataclass(frozen=True)
class Margins:
    below: float  # the model's low end moves down by this (logit; negative: up)
    above: float  # the high end moves up by this
    shift: float  # the point: the range's middle moved by the median error


@dataclass(frozen=True)
class Calibration:
    coverage: float
    scenarios: tuple[Scored, ...]
    made: str = ""  # when and from what the file was written
    extra: dict[str, Any] = field(default_factory=dict)

    def margins(self, leave_out: str | None = None) -> Margins | None:
        if leave_out is None:
            return self._margins_all
        return self._margins_of([s for s in self.scenarios if s.name != leave_out])

    @functools.cached_property
    def _margins_all(self) -> Margins | None:
        return self._margins_of(list(self.scenarios))

    def _margins_of(self, rows: list[Scored]) -> Margins | None:
        lo, hi = kth_largest([s.below for s in rows], self.coverage), kth_largest([s.above for s in rows], self.coverage)
        if lo is None or hi is None:
            return None
        return Margins(lo, hi, statistics.median(s.off_mid for s in rows))

    def range_of(self, model_low: float, model_high: float, leave_out: str | None = None) -> tuple[float, float, float] | None:
        """(low, point, high): the calibrated range around a model range and the point (None: left
        to the model, which claims no gain)."""
        mg = self.margins(leave_out)
        if mg is None or model_high <= 1.0:
            return None
        lo = speedup_of(logit(max(model_low, 1.0)) - mg.below)
        hi = speedup_of(logit(model_high) + mg.above)
        point = speedup_of(logit(math.sqrt(max(model_low, 1.0) * model_high)) + mg.shift)
        lo, hi = min(lo, hi), max(lo, hi)
        return max(lo, 1.0), min(max(point, lo), hi), hi

    # the leave-one-out record is computed once per calibration (a report asks it for every finding)
    @functools.cached_property
    def _leave_one_out(self) -> tuple[tuple[Scored, tuple[float, float, float]], ...]:
        return tuple((s, r) for s in self.scenarios if (r := self.range_of(s.model_low, s.model_high, leave_out=s.name)))

    def leave_one_out(self) -> list[tuple[Scored, tuple[float, float, float]]]:
        """Each scenario with the range the others give it."""
        return list(self._leave_one_out)

    def held(self) -> dict[str, Any]:
        """Leave-one-out: how many measured speedups the ranges held, how the misses fell, and the
        median error of the point."""
        return dict(self._held)

    @functools.cached_property
    def _held(self) -> dict[str, Any]:
        rows = self._leave_one_out
        hits = sum(1 for s, r in rows if _inside(s, r))
        under = sum(1 for s, (_, _, hi) in rows if s.measured > hi)
        err = [abs(math.log(p / s.measured)) for s, (_, p, _) in rows]
        return {"n": len(rows), "hits": hits, "under": under, "over": len(rows) - hits - under,
                "median_log_error": round(statistics.median(err), 4) if err else None}  # fmt: skip

    @functools.cached_property
    def case_records(self) -> dict[str, tuple[int, int]]:
        """Per case: (hits, runs) of its calibrated ranges on the zoo, leave-one-out."""
        out: dict[str, tuple[int, int]] = {}
        for s, r in self._leave_one_out:
            h, n = out.get(s.case_id, (0, 0))
            out[s.case_id] = (h + int(_inside(s, r)), n + 1)
        return out

    def case_record(self, case_id: str) -> tuple[int, int]:
        """(hits, runs) of the case's calibrated ranges on the zoo, leave-one-out."""
        return self.case_records.get(case_id, (0, 0))

    def to_json(self) -> dict[str, Any]:
        return {"coverage": self.coverage, "made": self.made, **self.extra,
                "scenarios": [{"name": s.name, "case_id": s.case_id, "platform": s.platform, "model_low": s.model_low,
                               "model_high": s.model_high, "measured": round(s.measured, 6)} for s in self.scenarios]}  # fmt: skip


def _inside(s: Scored, r: tuple[float, float, float]) -> bool:
    return r[0] <= s.measured <= r[2]


def from_json(data: dict[str, Any]) -> Calibration:
    scen = tuple(Scored(str(s["name"]), str(s["case_id"]), str(s.get("platform", "")), float(s["model_low"]),
                        float(s["model_high"]), float(s["measured"])) for s in data.get("scenarios", []))  # fmt: skip
    extra = {k: v for k, v in data.items() if k not in ("coverage", "made", "scenarios")}
    return Calibration(float(data.get("coverage", COVERAGE)), scen, str(data.get("made", "")), extra)


def enabled() -> bool:
    return os.environ.get("HERMES_CALIBRATION", "on").strip().lower() not in ("off", "0", "no", "false")


@functools.lru_cache(maxsize=4)
def _load(path: str) -> Calibration | None:
    p = Path(path)
    if not p.is_file():
        return None
    return from_json(json.loads(p.read_text()))


def load(path: Path = CALIBRATION_FILE) -> Calibration | None:
    """The shipped calibration (None when switched off or absent)."""
    return _load(str(path)) if enabled() else None


@dataclass(frozen=True)
class Calibrated:
    low: float
    point: float
    high: float
    coverage: float
    note: str


def calibrate(model_low: float, model_high: float, cal: Calibration | None, platform: str | None = None) -> Calibrated | None:
    """The stated range around the model's, and the sentence the assumption gets."""
    if cal is None:
        return None
    r = cal.range_of(model_low, model_high)
    mg = cal.margins()
    if r is None or mg is None:
        return None
    held = cal.held()
    lo, point, hi = r
    note = (f" Calibrated (docs/advice.md#calibrated-ranges): the model's range is {model_low:.2f}-{model_high:.2f}x; "
            f"on the {len(cal.scenarios)} recorded zoo runs (CPU and GPU) its ends, widened by what the measured "
            f"speedups missed them by, give {lo:.2f}-{hi:.2f}x, most likely {point:.2f}x, stated as an {cal.coverage:.0%} "
            f"range; ")  # fmt: skip
    note += (f"leave-one-out, ranges made this way held the measured speedup on {held['hits']} of {held['n']} runs "
             f"({held['under']} above the range, {held['over']} below)." if held["n"] else
             "too few zoo runs to check it leave-one-out.")  # fmt: skip
    if hi / lo > 10:
        note += (" The range is wider than 10x: at its high end the fix leaves little of the step, and what little "
                 "remains decides the speedup; the trace measures that remainder only roughly, and on the zoo the fixes "
                 "often removed more of the step than the model said.")  # fmt: skip
    platforms = sorted({s.platform for s in cal.scenarios})
    if platform and platforms and platform not in platforms:
        note += (f" No {platform.upper()} run is in the calibration (it holds {' and '.join(p.upper() for p in platforms)} "
                 f"runs): the coverage is not measured on this kind of device.")  # fmt: skip
    return Calibrated(lo, point, hi, cal.coverage, note)


__all__ = ["CALIBRATION_FILE", "COVERAGE", "Calibrated", "Calibration", "Margins", "Scored", "calibrate", "enabled",
           "from_json", "kth_largest", "load", "logit", "share", "speedup_of"]
