"""The two YAML file kinds a contributor writes: rules (facts -> bottlenecks) and cases
(bottleneck + details -> cause and optimizations). JSON Schemas: docs/rule.schema.json and
docs/case.schema.json (`hermes schema rule|case`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .conditions import Pattern

Category = Literal["parallel", "io", "cpu", "computation", "communication"]
Status = Literal["experimental", "stable", "deprecated"]
Level = Literal["low", "medium", "high"]


class Parameter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    default: float | int | str | bool
    description: str
    unit: str | None = None


class Example(BaseModel):
    """Facts (as JSON-like dicts, each with its ``kind``) that must / must not fire the rule or case."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    params: dict[str, Any] = Field(default_factory=dict, description="parameter overrides for this example")
    facts: list[dict[str, Any]]


class Examples(BaseModel):
    model_config = ConfigDict(extra="forbid")

    fire: list[Example] = Field(min_length=1)
    no_fire: list[Example] = Field(min_length=1)


class FieldRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    binding: str
    field: str


class Emit(BaseModel):
    """The bottleneck fact a rule derives."""

    model_config = ConfigDict(extra="forbid")

    category: Category
    component: str = Field(description="what holds the step back, e.g. data_loader, host_launch, exposed_comm")
    share: FieldRef = Field(description="field giving the share of the step (ratio 0..1)")
    time: FieldRef | None = Field(default=None, description="field giving the time at stake per step (µs)")


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^R-[A-Z]+-\d{3}$")
    title: str
    status: Status
    description: str
    parameters: dict[str, Parameter] = Field(default_factory=dict)
    when: list[Pattern] = Field(min_length=1)
    emit: Emit
    tell_apart: list[str] = Field(
        default_factory=list,
        description="when no case explains the bottleneck: the measurements that tell its candidate causes apart",
    )
    examples: Examples


class HowTo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu: str | None = None
    npu: str | None = None
    any: str | None = None

    @model_validator(mode="after")
    def _some(self) -> HowTo:
        if not (self.gpu or self.npu or self.any):
            raise ValueError("how_to needs at least one of gpu, npu, any")
        return self


class Optimization(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str
    how_to: HowTo
    snippet: str | None = None
    cost: Level = Field(description="engineering effort")
    risk: Level = Field(description="risk of changing results or stability")


class WhatIfGain(BaseModel):
    """Which events the fix shortens, for the advisor's replay of the dependency graph
    (docs/advice.md): the replay counts only what the step loses, not what stays hidden."""

    model_config = ConfigDict(extra="forbid")

    target: str = Field(pattern=r"^[a-z][a-z0-9_]*(:[a-z][a-z0-9_]*)?$",
                        description="a what-if set analyzers register (docs/analysis/whatif.md), e.g. dataloader")
    scale: Literal["set", "removes"] = Field(
        default="removes",
        description="removes: the fix takes the fraction of the case's measured time (gain.removes), spread over "
        "the set's events; set: the fix shortens the set's events themselves by the fraction",
    )


class Gain(BaseModel):
    """What the optimization removes and how much of it (the advisor turns this into a speedup)."""

    model_config = ConfigDict(extra="forbid")

    removes: FieldRef = Field(description="a per-step time (µs) the optimization can remove, e.g. exposed wait")
    step: FieldRef | None = Field(default=None, description="the step time (µs) it is part of; default: the rank's mean step")
    removes_low: FieldRef | None = Field(
        default=None,
        description="where the measurement itself is a range (e.g. a CPU peak known within a factor), the "
        "removable time at its low end; the fraction's low end then applies to this one",
    )
    fraction: tuple[float, float] = Field(description="low and high fraction of that time the fix removes (0..1)")
    fraction_from: tuple[FieldRef, FieldRef] | None = Field(
        default=None,
        description="where the fraction is known on the user's own hardware (e.g. from its tensor-core and FP32 "
        "peaks): fact fields giving its low and high end, used instead of ``fraction`` when both are set",
    )
    at_most: FieldRef | None = Field(
        default=None,
        description="a per-window time (µs) the fix cannot remove more than, whatever the fraction (e.g. what the "
        "free CPU cores allow); a null value in the fact means no bound is known",
    )
    assumption: str = Field(description="the assumption behind the range, shown to the user")
    whatif: WhatIfGain | None = Field(
        default=None, description="replay the dependency graph with these events shortened (else: Amdahl on removes, "
        "bounded by the component's time on the critical path)",
    )
    within_component: bool = Field(
        default=True,
        description="without a replay, bound the removable time by the case's breakdown components on the critical "
        "path; false for gains that are not time on this rank's path (per-sample throughput, a slow rank's excess, "
        "time the monitor measured outside the trace)",
    )

    @model_validator(mode="after")
    def _range(self) -> Gain:
        lo, hi = self.fraction
        if not (0 <= lo <= hi <= 1):
            raise ValueError("fraction must be [low, high] with 0 <= low <= high <= 1")
        return self


class Case(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^C-[A-Z]+-\d{3}$", description="stable id, never reused")
    title: str
    status: Status
    category: Category
    cause: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    hardware: Literal["any", "gpu", "npu"] = "any"
    parameters: dict[str, Parameter] = Field(default_factory=dict)
    conditions: list[Pattern] = Field(min_length=1)
    optimizations: list[Optimization] = Field(min_length=1)
    gain: Gain
    max_severity: Level | None = Field(
        default=None,
        description="cap for cases that name what bounds the step (an umbrella symptom) rather than a defect",
    )
    explains: Literal["mechanism", "place", "overhead"] = Field(
        default="mechanism",
        description="what the case says about the time it claims: a mechanism (what the time is for: I/O, copies, "
        "collections, a slow kernel), a place (where in the program it goes: a user function) or an overhead (how "
        "the host executes it: operator dispatch, Python between operators, launches). Where one finding's events "
        "hold most of the critical-path time another claims and it explains more (mechanism, then place, then "
        "overhead), it leads and the other is listed under it",
    )
    explanation: str = Field(description="jinja2 template over the bindings, e.g. {{ d.wait_us | ms }}")
    not_recorded: str | None = Field(
        default=None,
        description="for a case no real trace or recorded scenario shows yet (`hermes kb coverage`): why, and what "
        "a recording of it needs",
    )
    references: list[str] = Field(min_length=1)
    examples: Examples

    @model_validator(mode="after")
    def _refs(self) -> Case:
        for url in self.references:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"references must be URLs: {url!r}")
        return self
