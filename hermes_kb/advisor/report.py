"""The Report: what `hermes advise` produces and `hermes_kb.advise` returns (stable JSON;
schema in docs/report.schema.json)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

REPORT_SCHEMA_VERSION = "2"  # 2: confidence is a measured hit rate or None; ranges calibrated

Severity = Literal["high", "medium", "low"]
SEVERITY_ORDER = {"low": 0, "medium": 1, "high": 2}


class Speedup(BaseModel):
    low: float = Field(description="step-time speedup at the low end of the fix's effect (1.0 = none)")
    high: float = Field(description="step-time speedup at the high end")
    coverage: float | None = Field(
        default=None, ge=0, le=1,
        description="the share of measured speedups ranges made this way are calibrated to hold (docs/advice.md"
                    "#calibrated-ranges); None: the model's own range, not calibrated")
    point: float | None = Field(default=None, description="the most likely speedup (calibrated ranges only): the model "
                                "range's middle moved by the zoo's median error")
    model_low: float | None = Field(default=None, description="the gain model's own low end, before calibration")
    model_high: float | None = Field(default=None, description="the gain model's own high end, before calibration")


class Removable(BaseModel):
    low: float = Field(description="µs of analysed step time the fix removes at the low end")
    high: float = Field(description="µs at the high end")
    model_low: float | None = Field(default=None, description="the gain model's own low end, before calibration")
    model_high: float | None = Field(default=None, description="the gain model's own high end, before calibration")


def model_ends(r: Speedup | Removable) -> tuple[float, float]:
    """The gain model's own (low, high) of a stated range: its model_* fields when the range was
    calibrated, else the range itself."""
    return (r.model_low if r.model_low is not None else r.low, r.model_high if r.model_high is not None else r.high)


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


class JobGain(BaseModel):
    """A finding's gain to the job: the ranks joined at their collectives and replayed with the fix
    on the ranks it was found on (docs/advice.md, "Job-level gains")."""

    step_time_us: float = Field(description="the job's step in the join (the analysed steps repeated until it settles)")
    removable_us: Removable = Field(description="per step, what the fix removes from the job's step (model)")
    speedup: Speedup = Field(description="the job's step speedup (model, before calibration)")
    per_rank_speedup: Speedup = Field(description="the median matched rank's own replay, for reference: what the rank "
                                      "alone would gain, waits for its peers counted as its own work")
    ranks_changed: list[int] = Field(description="ranks whose sets were shortened in the join")
    ranks_joined: int = Field(description="ranks in the join")


class Finding(BaseModel):
    case_id: str
    title: str
    category: Literal["parallel", "io", "cpu", "computation", "communication"]
    cause: str
    severity: Severity
    confidence: float | None = Field(
        default=None, ge=0, le=1,
        description="the case's measured hit rate: the share of the recorded zoo runs on which its stated range held "
                    "the measured speedup (leave-one-out); None: not yet measured")
    confidence_runs: int = Field(default=0, ge=0, description="how many zoo runs the confidence was measured on")
    expected_speedup: Speedup
    time_at_stake_us: float = Field(description="per-step time the optimization can remove (before its fraction)")
    step_time_us: float = Field(description="the step time that time is part of")
    share_of_step_ratio: float = Field(description="time_at_stake_us / step_time_us")
    removable_us: Removable | None = Field(default=None, description="step time the fix removes (low, high)")
    component: Literal["compute", "communication", "host", "data", "idle"] | None = Field(
        default=None, description="the step-breakdown component the cause sits in")
    replayed: bool = Field(default=False, description="the range comes from a replay of the dependency graph")
    whatif_target: str | None = Field(default=None, description="the events the replay shortened")
    profile_only: bool = Field(
        default=False,
        description="the finding is about the profile itself (a one-off cost such as warm-up captured in the "
                    "analysed steps): its fix makes the profile representative and changes no steady-state step time; "
                    "text reports show it whatever its speedup")
    assumption: str = Field(description="how the speedup range was computed")
    ranks: list[int]
    steps: list[int]
    evidence: list[EvidenceItem]
    optimizations: list[OptimizationAdvice]
    explanation: str
    references: list[str]
    related: list[str] = Field(default_factory=list, description="other cases resting on the same evidence or time")
    alternatives: list[Finding] = Field(
        default_factory=list,
        description="findings whose fix acts mostly on the same critical-path time as this one: other explanations "
        "or narrower fixes of the same time, not gains to add to this one",
    )
    job: JobGain | None = Field(
        default=None, description="on a job of several ranks, the gain to the job: expected_speedup is this one "
        "(calibrated); null where the finding's gain is not replayed or the ranks share no matched collective")
    within: bool = Field(
        default=False,
        description="listed under another finding whose events hold most of this one's time while this one's hold "
        "less than half of that finding's: a narrower fix inside it, not another explanation of all of it")


class CombinedGain(BaseModel):
    """The first findings' fixes applied together, without counting any time twice."""

    case_ids: list[str]
    expected_speedup: Speedup
    removable_us: Removable
    step_time_us: float
    note: str


class Candidate(BaseModel):
    case_id: str
    title: str
    why_not: str = Field(description="the first condition of the case this trace does not meet")


class Unexplained(BaseModel):
    """A bottleneck a rule derived that no case explains: reported with its candidate causes."""

    rule_id: str
    title: str = Field(default="", description="what the rule measured (its title), or the breakdown's statement")
    category: str
    component: str = Field(description="breakdown component (compute, communication, host, data, idle) or the rule's")
    ranks: list[int]
    share_ratio: float = Field(description="median share of the step on those ranks, as the rule measured it")
    time_us: float | None = Field(default=None, description="median time per step (µs), as the rule measured it")
    breakdown_ratio: float | None = Field(
        default=None, description="the component's share of the step in the step breakdown, median over those ranks: "
                                  "the number the report's breakdown shows (the rule's share can count time that "
                                  "overlaps other components)")
    breakdown_us: float | None = Field(default=None, description="that share as time per step (µs)")
    summary: str
    candidates: list[Candidate] = Field(default_factory=list)
    tell_apart: list[str] = Field(default_factory=list, description="measurements that tell the candidates apart")


class StepSummary(BaseModel):
    step: int
    duration_us: float


class StepPoint(BaseModel):
    """One step of a rank's step-time series (HTML report, diff), with its spike cause if it is one."""

    step: int
    duration_us: float
    spike: str | None = Field(
        default=None, description="null: no spike; else its cause: gc, checkpoint, marked_event, data_wait, "
        "unexplained (monitor logs), or spike (a trace: the cause is not measured per step)")
    excess_us: float | None = Field(default=None, description="a spike's excess over its rolling median")


class PathOp(BaseModel):
    """An operator (kernel, gap) on a rank's critical path, from its critical_path fact."""

    name: str
    category: str
    time_us: float = Field(description="per step: its time on the path over the analysed steps / steps")
    share_ratio: float = Field(description="its share of the path")


class SlowRank(BaseModel):
    """The rank a communication domain waits for, from the fact that found it."""

    domain: str = Field(description="process group or monitor domain; 'all' for every rank of the job")
    rank: int
    source: str = Field(description="fact kind: rank_imbalance, comm_sync_wait or monitor_slow_rank")
    measure: str = Field(description="what was compared")
    value_us: float | None = Field(default=None, description="the slow rank's value of that measure, per step")
    excess_us: float | None = Field(default=None, description="how much more than the typical rank, per step")
    note: str = ""


class JobSummary(BaseModel):
    """The job's ranks joined at their collectives (analyzers/whatif/job.py), per step."""

    ranks: int
    step_us: float = Field(description="the job's step in the join (the analysed steps repeated until it settles)")
    recorded_step_us: float = Field(description="the median rank's recorded step")
    model_error: float = Field(description="(step_us - recorded_step_us) / recorded_step_us")
    slowest_rank: int = Field(description="the rank with the longest step had it never waited for a peer")
    slowest_free_us: float
    median_free_us: float
    straggler_cost_us: float = Field(description="how much shorter the job's step gets with the slowest rank at the "
                                     "median rank's pace")
    gpu_hours_per_1000_steps: float
    top_holder_rank: int = Field(description="the rank that arrives last at the collectives most often")
    top_holder_share_ratio: float
    holding_stage: int | None = None
    stage_balance_gain_us: float | None = None
    statement: str = Field(description="the above in one sentence, as the text reports print it")


class RankSummary(BaseModel):
    rank: int
    device: str | None = None
    steps: list[StepSummary]
    steps_count: int | None = Field(
        default=None, description="steps analysed when they are not listed (a monitor log of the whole run)"
    )
    mean_step_us: float | None = None
    breakdown_us: dict[str, float] = Field(
        default_factory=dict,
        description="mean per step, an exclusive multi-component overlap: compute_us (the device computes), "
        "communication_us (exposed collectives), and while the device waits host_launch_us, host_dispatch_us, "
        "host_python_us, data_us; idle_us (they add up to the mean step; docs/analysis/breakdown.md)",
    )
    critical_component: str | None = Field(
        default=None, description="the component holding most of the step: compute, communication, host, data, idle"
    )
    critical_ratio: float | None = Field(default=None, description="its share of the step")
    device_kind: str | None = Field(default=None, description="gpu, npu or cpu (what computes)")
    phases_us: dict[str, float] = Field(
        default_factory=dict,
        description="mean per step on the training thread, by program phase: data_us, forward_us, backward_us, "
        "optimizer_us, communication_us (collectives the program issues), user_code_us (the user's code outside "
        "those), other_us (nothing traced); they add up to the mean step (docs/analysis/program.md)",
    )
    phases_sources: list[str] = Field(default_factory=list, description="the evidence the phases rest on")
    program_site: str | None = Field(default=None, description="the user function holding the most time besides "
                                     "training (file(line): name), when the capture has Python stacks")
    program_site_us: float | None = Field(default=None, description="its time per step")
    program_site_ratio: float | None = Field(default=None, description="its share of the step")
    series: list[StepPoint] = Field(
        default_factory=list, description="step times in order with their spikes (filled by the CLI for --format "
        "html and json; a monitor log's whole run, at most 2,000 points: the longest step of each bucket)")
    critical_path_us: float | None = Field(default=None, description="critical path length per step (CLI: html, json)")
    critical_path_ops: list[PathOp] = Field(default_factory=list, description="the critical path's top operators "
                                            "(CLI: html, json)")  # fmt: skip


class SampleInfo(BaseModel):
    """``advise --sample K``: which ranks were analysed of how many, and why each."""

    ranks_total: int = Field(description="rank files in the input; the first pass read the step times of all")
    read: dict[str, str] = Field(description="rank (or file, without a rank number) -> why it was chosen")
    notes: list[str] = Field(default_factory=list, description="what was read, and what a full pass would add")


class Inputs(BaseModel):
    sources: list[str]
    ranks: list[int]
    skipped: list[str] = Field(default_factory=list)
    sample: SampleInfo | None = Field(default=None, description="set when only a sample of the ranks was analysed")


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
    combined: CombinedGain | None = Field(default=None, description="the top fixes together (null with fewer than two)")
    unexplained: list[Unexplained] = Field(
        default_factory=list, description="bottlenecks a rule derived that no finding explains, with their candidates"
    )
    kb: KbInfo
    warnings: list[str] = Field(
        default_factory=list, description="problems with the input or the analysis that bear on the numbers: files "
        "or lines skipped, captures left out or failed, profiling overhead, a warm-up that never settled, a single "
        "profiled step")
    notes: list[str] = Field(
        default_factory=list, description="informational lines, not problems (a monitor RUN_DIR): the monitor's "
        "automatic captures and their reasons, triggers it did not capture and why, how MFU's FLOPs and peak were "
        "obtained or why there is no MFU, the communication domains found")
    qualifications: list[str] = Field(
        default_factory=list, description="what the answer left out or is less sure of, one short phrase each, shown "
        "in the headline (the warnings say more): inputs not read, captures of another run, empty stretched or "
        "outlier steps left out, a device-only trace, ranks whose kernels link to no launch call")
    job: JobSummary | None = Field(default=None, description="a job of several ranks: its ranks joined at their "
                                   "collectives (fact job_replay), the straggler's cost and who holds the collectives")
    slow_ranks: list[SlowRank] = Field(default_factory=list, description="the slow rank of each communication "
                                       "domain, where a fact found one (CLI: html, json)")  # fmt: skip

    def worst_severity(self) -> Severity | None:
        if not self.findings:
            return None
        return max((f.severity for f in self.findings), key=SEVERITY_ORDER.__getitem__)
