"""Operator arguments as the profiler records them: JSON text in ``Input Dims``, ``Input type``,
``Concrete Inputs``, a collective's ``Process Group Ranks`` and the like, kept raw in the frames
(``cpu_ops.input_dims`` and friends, docs/trace_bundle.md) and decoded here when an analyzer
reads them. Profilers write these values by hand-built strings: an empty or malformed one is
"not recorded", never an error."""

from __future__ import annotations

import json
from typing import Any


def decode(text: str | None) -> Any | None:
    """The value of a recorded argument; None when empty, absent or not JSON."""
    if not text:
        return None
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None


def first_shape(text: str | None) -> list | None:
    """The first tensor's shape of an ``Input Dims`` value (None when it records none)."""
    v = decode(text)
    if isinstance(v, list) and v and isinstance(v[0], list):
        return v[0]
    return None


__all__ = ["decode", "first_shape"]
