"""The base of every fact: kind, scope, evidence, and field helpers that carry units.

A fact is a measured statement about the trace ("on rank 3, step 12, the data-loader wait is
38% of the step"). Analyzers emit them; rules and cases match on them. Every numeric field
says its unit in its name suffix and in the JSON Schema (``unit``): ``_us`` microseconds,
``_bytes``, ``_ratio`` (0..1), ``_gbps`` (GB/s, 1e9 bytes per second), ``_flops`` (FLOP),
``_flops_per_s`` (FLOP/s), ``_count``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

UNITS = {
    "us": "µs",
    "bytes": "bytes",
    "ratio": "ratio 0..1",
    "gbps": "GB/s",
    "flops": "FLOP",
    "flops_per_s": "FLOP/s",
    "count": "count",
    "pct": "percent 0..100",
}


def measure(unit: str, description: str, **kw: Any) -> Any:
    """A numeric field with its unit recorded in the JSON Schema."""
    extra = {"unit": UNITS.get(unit, unit)}
    if unit == "ratio":
        kw.setdefault("ge", 0.0)
        kw.setdefault("le", 1.0)
    return Field(description=description, json_schema_extra=extra, **kw)


def us(description: str, **kw: Any) -> Any:
    return measure("us", description, **kw)


def ratio(description: str, **kw: Any) -> Any:
    return measure("ratio", description, **kw)


class Evidence(BaseModel):
    """What a person needs to find the fact again in the trace."""

    model_config = ConfigDict(extra="forbid")

    time_ranges_us: list[tuple[float, float]] = Field(
        default_factory=list, description="(start, end) µs from the bundle origin, at most a handful"
    )
    events: list[str] = Field(default_factory=list, description="event names (operators, kernels, annotations)")
    counts: dict[str, int] = Field(default_factory=dict, description="how many events of each kind were used")
    note: str | None = Field(default=None, description="how the value was computed, when not obvious")


class Fact(BaseModel):
    """Base of all fact kinds. ``kind`` is the discriminator rules and cases match on."""

    model_config = ConfigDict(extra="forbid")

    kind: str
    rank: int | None = Field(default=None, description="rank the fact is about; null for the whole job")
    step: int | None = Field(default=None, description="ProfilerStep number; null when over all analysed steps")
    evidence: Evidence = Field(default_factory=Evidence)

    def scope(self) -> str:
        parts = []
        if self.rank is not None:
            parts.append(f"rank {self.rank}")
        if self.step is not None:
            parts.append(f"step {self.step}")
        return ", ".join(parts) or "job"
