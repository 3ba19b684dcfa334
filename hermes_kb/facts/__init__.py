"""Typed facts: one pydantic class per fact kind, grouped by analysis area.

``FACT_TYPES`` maps each ``kind`` to its class; ``facts_json_schema()`` is what
`hermes schema facts` prints and docs/facts.schema.json holds.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from . import bottleneck, breakdown, buckets, comm, cpu, critical_path, fluctuation, io, monitor, npu, overlap, parallel, program, steps, whatif  # noqa: F401  (registers kinds)
from .compute import attention, classes, fusion, layers, layouts, occupancy, precision, roofline, training_step  # noqa: F401  (registers kinds)
from .base import Evidence, Fact


def _all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


def _kind_of(cls: type) -> str | None:
    field = cls.model_fields.get("kind")
    return field.default if field is not None and isinstance(field.default, str) else None


FACT_TYPES: dict[str, type[Fact]] = {k: c for c in _all_subclasses(Fact) if (k := _kind_of(c))}


def facts_json_schema() -> dict[str, Any]:
    """JSON Schema of every fact kind (a discriminated union on ``kind``)."""
    from typing import Annotated, Union

    from pydantic import Field

    types = tuple(FACT_TYPES[k] for k in sorted(FACT_TYPES))
    union = Annotated[Union[types], Field(discriminator="kind")]  # noqa: UP007
    schema = TypeAdapter(list[union]).json_schema()
    schema["title"] = "hermes facts"
    schema["description"] = "The facts hermes analyzers emit (hermes analyze --format json)."
    return schema


def parse_fact(data: dict[str, Any]) -> Fact:
    cls = FACT_TYPES.get(data.get("kind", ""))
    if cls is None:
        raise ValueError(f"unknown fact kind {data.get('kind')!r}")
    return cls.model_validate(data)


__all__ = ["Evidence", "FACT_TYPES", "Fact", "facts_json_schema", "parse_fact"]
