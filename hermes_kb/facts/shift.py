"""Moving a rank's facts from its own clock to the job's origin.

A rank analysed alone (rank_stream.py) has its first event at 0; in a bundle its frames are moved
by ``first - origin`` before analysis. Facts hold absolute times only in the fields named here
(a window's or an event's start and end) and in the evidence's time ranges, which are copies of
event times, so adding the same delta afterwards gives the same numbers.
"""

from __future__ import annotations

from pydantic import BaseModel

from .base import Evidence, Fact

ABSOLUTE_FIELDS = frozenset({"start_us", "end_us"})


def absolute_field(name: str) -> bool:
    """A field holding an absolute time (moved with the clock)."""
    return name in ABSOLUTE_FIELDS or name.endswith(("_start_us", "_end_us"))


def _shift_model(m: BaseModel, delta: float, seen: set[int]) -> None:
    if id(m) in seen:  # analyzers share sub-models between facts (a gap in a step's fact and the rank's)
        return
    seen.add(id(m))
    if isinstance(m, Evidence):
        m.time_ranges_us = [(a + delta, b + delta) for a, b in m.time_ranges_us]
        return
    for name in type(m).model_fields:
        v = getattr(m, name)
        if isinstance(v, float) and absolute_field(name):
            setattr(m, name, v + delta)
        elif isinstance(v, BaseModel):
            _shift_model(v, delta, seen)
        elif isinstance(v, list) and v and isinstance(v[0], BaseModel):
            for x in v:
                _shift_model(x, delta, seen)


def shift_facts(facts: list[Fact], delta_us: float) -> None:
    """Add ``delta_us`` to every absolute time of ``facts``, in place."""
    if delta_us == 0.0:
        return
    seen: set[int] = set()
    for f in facts:
        _shift_model(f, delta_us, seen)


__all__ = ["ABSOLUTE_FIELDS", "absolute_field", "shift_facts"]
