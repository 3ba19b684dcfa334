"""A fact's flat copy: its scalar fields, numbers made safe for the rules engines, nulls dropped.
The rules engines (hermes_kb/kb/) match flat copies; the fact store (store.py) keeps them on disk
for a streamed job."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .base import Fact


def sanitize_number(x: Any) -> Any:
    """Numbers as both engines hold them: no NaN/inf (None), no exponent forms durable-rules
    rejects (|x| < 1e-4 becomes 0.0; |x| >= 1e15 becomes an int), ints kept."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return x
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            return None
        if abs(x) >= 1e15:  # repr would use an exponent from 1e16 on
            return max(min(int(round(x)), 2**63 - 1), -(2**63))
        if abs(x) < 1e-4:  # repr uses an exponent below 1e-4
            return 0.0
        return x
    return max(min(x, 2**63 - 1), -(2**63))  # the engine holds int64


def scalars(fact: Fact | Mapping[str, Any]) -> dict[str, Any]:
    """The scalar fields of a fact as they are (``flatten`` before its numbers are sanitised)."""
    data = fact.model_dump(exclude={"evidence"}) if isinstance(fact, Fact) else dict(fact)
    return {k: v for k, v in data.items() if isinstance(v, (bool, str, int, float))}


def flatten(fact: Fact | Mapping[str, Any]) -> dict[str, Any]:
    """The scalar fields of a fact, numbers sanitised, nulls dropped (missing = null)."""
    out = {}
    for k, v in scalars(fact).items():
        if not isinstance(v, (bool, str)):
            v = sanitize_number(v)
            if v is None:
                continue
        out[k] = v
    return out


__all__ = ["flatten", "sanitize_number", "scalars"]
