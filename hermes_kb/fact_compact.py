"""Facts of thousands of ranks in less memory: what is equal between facts is shared.

Every fact is a pydantic model, and each model instance carries its own set of the fields that
were given (``__pydantic_fields_set__``): for the ~100 facts of a rank those sets are ~40% of
the facts' memory, and they are the same few sets for every rank. Strings (event names, notes)
repeat from rank to rank too. A rank's facts arrive from its worker as fresh copies; ``compact``
makes them share one copy of each. hermes never reads the fields-set (no ``exclude_unset``);
pydantic only adds a name to it when an attribute is assigned, which for the shared sets here
only ever adds a field that the facts of that kind already have.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class FactPool:
    """The shared copies, kept for the life of one job's gather."""

    def __init__(self) -> None:
        self._sets: dict[tuple[type, frozenset[str]], set[str]] = {}
        self._strings: dict[str, str] = {}

    def _value(self, v: Any) -> Any:
        if isinstance(v, str):
            return self._strings.setdefault(v, v)
        if isinstance(v, BaseModel):
            self.model(v)
        elif isinstance(v, list):
            for i, x in enumerate(v):
                v[i] = self._value(x)
        elif isinstance(v, dict):
            for k in list(v):
                v[k] = self._value(v[k])
        return v

    def model(self, m: BaseModel) -> None:
        fs = m.__pydantic_fields_set__
        key = (type(m), frozenset(fs))
        object.__setattr__(m, "__pydantic_fields_set__", self._sets.setdefault(key, set(fs)))
        d = m.__dict__
        for k, v in d.items():
            d[k] = self._value(v)

    def compact(self, facts: list) -> None:
        for f in facts:
            self.model(f)


__all__ = ["FactPool"]
