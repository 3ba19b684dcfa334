"""Facts about the step structure of a rank."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Fact, measure, us


class StepStructure(Fact):
    """How the rank's steps were found, and which were left out."""

    kind: Literal["step_structure"] = "step_structure"
    source: Literal["profiler_step", "optimizer_step", "repeating_annotation", "whole_trace"] = Field(
        description="profiler_step: ProfilerStep#N annotations; the others are inferred"
    )
    inferred: bool = Field(description="true when the trace has no ProfilerStep annotations")
    marker: str | None = Field(default=None, description="annotation name the steps were inferred from")
    steps_count: int = measure("count", "steps analysed")
    excluded_steps: list[int] = Field(default_factory=list, description="steps left out (partial last step)")
    excluded_reason: str | None = None


class StepTime(Fact):
    """One analysed step of one rank."""

    kind: Literal["step_time"] = "step_time"
    start_us: float = us("step start, from the bundle origin")
    end_us: float = us("step end (the next step's start, or the last activity launched in this step)")
    duration_us: float = us("end - start")
    cpu_duration_us: float = us("duration of the step annotation on the CPU")


class AnalyzerError(Fact):
    """An analyzer failed on this input; the other analyzers' facts still stand."""

    kind: Literal["analyzer_error"] = "analyzer_error"
    analyzer: str
    message: str
