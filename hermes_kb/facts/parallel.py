"""Facts of the parallel analyzer (analyzers/comm/parallel.py): imbalance across ranks and pipeline
bubbles. Formulas: docs/analysis/parallel.md."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Fact, measure, ratio, us


class RankImbalance(Fact):
    """How unequal one component of the step is across the ranks of the job (or of one
    process group). Values are per-step means over the steps every compared rank analysed."""

    kind: Literal["rank_imbalance"] = "rank_imbalance"
    component: Literal["step_time", "compute", "communication", "non_communication"] = Field(
        description="step_time: step duration; compute: union of non-communication kernels in the steps; "
        "communication: union of collectives in the steps (transfer + waiting for peers); non_communication: "
        "step time minus communication, the rank's own work (compute, CPU, idle): in synchronous "
        "training the "
        "rank with the most of it is the one the others wait for"
    )
    process_group: str | None = Field(default=None, description="null: all ranks of the job")
    ranks_count: int = measure("count", "ranks compared")
    steps_count: int = measure("count", "steps averaged per rank")
    per_rank_us: dict[int, float] = us(
        "per-step mean of the component per rank (10 largest)", default_factory=dict
    )
    max_us: float = us("largest per-rank value")
    mean_us: float = us("mean over ranks")
    min_us: float = us("smallest per-rank value")
    imbalance_ratio: float = ratio("1 - mean/max (0: every rank equal; the form of the paper's R_wait)")
    max_rank: int = Field(
        description="rank with the largest value (for communication: the one that waits most)"
    )
    max_excess_us: float = us("max - mean: how much more max_rank spends per step than the average rank")
    min_rank: int = Field(description="rank with the smallest value")
    worst_step: int | None = Field(
        default=None, description="step with the largest max-min spread across ranks"
    )
    worst_step_spread_us: float | None = us("max - min across ranks in worst_step", default=None)


class PipelineBubble(Fact):
    """Pipeline-parallel bubble of one rank that exchanges point-to-point messages."""

    kind: Literal["pipeline_bubble"] = "pipeline_bubble"
    p2p_count: int = measure("count", "point-to-point collectives (send/recv) in the analysed steps")
    p2p_time_us: float = us("their total duration")
    peers: list[int] = Field(
        default_factory=list, description="ranks of the 2-rank groups used, when recorded"
    )
    steps_count: int = measure("count", "steps analysed")
    step_time_us: float = us("sum of the analysed step durations")
    compute_us: float = us("union of non-communication kernels inside the steps")
    bubble_ratio: float = ratio(
        "1 - compute_us / step_time_us: the share of the step the device does no compute"
    )
    idle_ratio: float = ratio("share of the step with no kernel and no memcpy at all")


class PipelineStage(Fact):
    """The rank's place in its pipeline-parallel group, from the process groups the trace records
    (a group whose description or name is 'pp' or contains 'pipeline')."""

    kind: Literal["pipeline_stage"] = "pipeline_stage"
    process_group: str = Field(description="name of the pipeline group")
    pg_desc: str | None = Field(default=None, description="its description as recorded")
    pp_ranks: list[int] = Field(description="global ranks of the group, in stage order")
    stage_index: int = measure("count", "this rank's stage: its position in pp_ranks (0 = first)")
    stages_count: int = measure("count", "stages in the group")


class PipelineStageBalance(Fact):
    """Device compute per step of the stages of one pipeline group (the ranks present with device
    compute), job-wide (rank null). Formulas: docs/analysis/parallel.md."""

    kind: Literal["pipeline_stage_balance"] = "pipeline_stage_balance"
    process_group: str = Field(description="name of the pipeline group")
    pp_ranks: list[int] = Field(description="global ranks of the group, in stage order")
    stages_count: int = measure("count", "stages in the group")
    compared_count: int = measure("count", "stages compared (present, with device compute)")
    steps_count: int = measure("count", "fewest analysed steps of a compared rank")
    per_stage_compute_us: dict[int, float] = us("mean device compute per step, by stage index", default_factory=dict)
    max_us: float = us("largest per-stage compute per step")
    mean_us: float = us("mean over the compared stages")
    min_us: float = us("smallest")
    imbalance_ratio: float = ratio("1 - mean/max")
    heaviest_stage: int = measure("count", "stage index with the most compute")
    heaviest_rank: int = Field(description="its rank")
    lightest_stage: int = measure("count", "stage index with the least compute")
    last_stage_heaviest: bool = Field(description="the heaviest stage is the group's last (output layer and loss)")
    excess_us: float = us("max - mean per step: what the heaviest stage adds to every micro-batch round")
    step_us: float = us("mean step time of the heaviest rank")
    excess_share_ratio: float = ratio("excess_us / step_us")
