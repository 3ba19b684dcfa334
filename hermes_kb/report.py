"""The Report: what `hermes advise` produces and `hermes_kb.advise` returns (stable JSON;
schema in docs/report.schema.json)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

REPORT_SCHEMA_VERSION = "1"

Severity = Literal["high", "medium", "low"]
SEVERITY_ORDER = {"low": 0, "medium": 1, "high": 2}


class Speedup(BaseModel):
    low: float = Field(description="step-time speedup at the low end of the fix's effect (1.0 = none)")
    high: float = Field(description="step-time speedup at the high end")


class EvidenceItem(BaseModel):
    fact: str = Field(description="fact kind")
    scope: str = Field(description="rank / step the fact is about")
    values: dict[str, float | int | str | bool] = Field(description="the fact's measured values")
    time_ranges_us: list[tuple[float, float]] = Field(default_factory=list)
    events: list[str] = Field(default_factory=list)
    note: str | None = None


class OptimizationAdvice(BaseModel):
    title: str
    how_to: str
    snippet: str | None = None
    cost: str
    risk: str


class Finding(BaseModel):
    case_id: str
    title: str
    category: Literal["parallel", "io", "cpu", "computation", "communication"]
    cause: str
    severity: Severity
    confidence: float = Field(ge=0, le=1)
    expected_speedup: Speedup
    time_at_stake_us: float = Field(description="per-step time the optimization can remove (before its fraction)")
    step_time_us: float = Field(description="the step time that time is part of")
    share_of_step_ratio: float = Field(description="time_at_stake_us / step_time_us")
    assumption: str = Field(description="how the speedup range was computed")
    ranks: list[int]
    steps: list[int]
    evidence: list[EvidenceItem]
    optimizations: list[OptimizationAdvice]
    explanation: str
    references: list[str]
    related: list[str] = Field(default_factory=list, description="other cases resting on the same evidence")


class StepSummary(BaseModel):
    step: int
    duration_us: float


class RankSummary(BaseModel):
    rank: int
    device: str | None = None
    steps: list[StepSummary]
    steps_count: int | None = Field(
        default=None, description="steps analysed when they are not listed (a monitor log of the whole run)"
    )
    mean_step_us: float | None = None
    breakdown_us: dict[str, float] = Field(
        default_factory=dict, description="mean per step: where the time goes (from the overlap analysis)"
    )


class Inputs(BaseModel):
    sources: list[str]
    ranks: list[int]
    skipped: list[str] = Field(default_factory=list)


class KbInfo(BaseModel):
    rules: int
    cases: int
    engine: str


class Report(BaseModel):
    schema_version: str = REPORT_SCHEMA_VERSION
    hermes_version: str
    inputs: Inputs
    summary: list[RankSummary]
    findings: list[Finding]
    kb: KbInfo
    warnings: list[str] = Field(default_factory=list)

    def worst_severity(self) -> Severity | None:
        if not self.findings:
            return None
        return max((f.severity for f in self.findings), key=SEVERITY_ORDER.__getitem__)
