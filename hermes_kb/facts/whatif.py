"""What-if facts: how much shorter the analysed steps get when a set of events a fix acts on is
shortened, from a replay of the rank's dependency graph (analyzers/whatif/replay.py;
docs/analysis/whatif.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Fact, measure, ratio, us

# the sets analyzers register (docs/analysis/whatif.md); ``class:<c>`` for every kernel / CPU
# operator class of the compute analyzer
TARGETS = frozenset({
    "dataloader", "host_gaps", "host_gaps_large", "python_io", "python_preprocess", "tiny_ops", "optimizer", "gc", "compile", "autotune", "syncs",
    "implicit_syncs", "explicit_syncs", "launch_calls", "host_work", "communication", "device_compute", "fp32_gemm",
    "fp32_conv", "fusable", "python_pauses", "h2d_pageable", "host_step",
    # the user's program (analyzers/program/functions.py)
    "user_function", "user_loop",
    # cpu (analyzers/host/pyframes.py, compilation.py, dispatch.py, parallel_wrappers.py, runtime_calls.py)
    "anomaly", "tensor_format", "module_hooks", "construction", "gc_collect", "compile_wrappers", "zero_grad",
    "ddp_buffer_sync", "data_parallel", "sync_batchnorm", "device_alloc", "graph_capture", "state_copy",
    # computation (analyzers/compute/kernels.py, the per-kernel compute analysis)
    "small_grid", "misaligned_gemms", "dtype_casts", "strided_copies", "concat_copies", "layout_transposes",
    "optimizer_kernels", "recompute", "fp64_kernels", "embedding_backward", "large_vocab_loss", "grad_scaler",
    "conv_fallback", "npu_cube_misaligned", "npu_fa_misaligned", "sdpa_math", "wave_tail",
    "strided_elementwise", "train_mode_kernels", "npu_fp32_cube", "index_kernels", "fill_kernels", "gemm_epilogues", "npu_vocab_vector_ops", "sort_kernels",
})  # fmt: skip
CLASS_TARGETS = frozenset({"gemm", "conv", "attention", "elementwise", "reduction", "norm", "memory", "communication",
                           "other"})  # fmt: skip


def known_target(name: str) -> bool:
    kind, _, sub = name.partition(":")
    return name in TARGETS or (kind == "class" and sub in CLASS_TARGETS)


class WhatIf(Fact):
    """One set of events on one rank (step = null: over all analysed steps)."""

    kind: Literal["whatif"] = "whatif"
    target: str = Field(description="the set's name, which cases name in gain.whatif (e.g. dataloader, python_gaps)")
    description: str = Field(description="what the set holds")
    drop_waits: bool = Field(description="the fix removes the waits themselves (a sync no longer called)")
    own_us: float = us("the set's own time in the analysed steps (what Amdahl's law would remove)")
    critical_us: float = us("the set's time on the steps' critical paths: an upper bound on what shortening it removes")
    step_us: float = us("analysed steps (sum of the step windows)")
    replay_base_us: float = us("the analysed span as the replay measures it (first step start to last step end)")
    profiler_host_scale: float = measure(
        "factor", "the host events' own work was scaled by this before the replay, taking off the profiler's cost so "
        "that the replayed steps last as long as the monitor measured them unprofiled (1: unchanged)", default=1.0)
    removed_half_us: float = us("how much shorter the analysed steps get with the set's events half as long")
    removed_all_us: float = us("how much shorter they get with the set's events gone")
    removed_all_ratio: float = ratio("removed_all_us / step_us")
    nodes_count: int = measure("count", "graph nodes (host segments, device activities) in the set")
    launch_host_us: float = us("of own_us: the host time of the operators that launched only the set's kernels, in the set "
                               "because its fix removes the calls too (fusion, a fused optimizer; 0 for other sets)",
                               default=0.0)
    replayed: bool = Field(default=True, description="false: the set's critical time is under 2% of the span; "
                           "removed_* are then that bound, not a replay")
    linked: bool = Field(default=True, description="the graph links device work to its launches (the replay is trusted)")
    linked_ratio: float = ratio("share of the rank's device nodes the graph links to a launch call (1 without device "
                                "work); under the reader's LINKED_SHARE the host's causes are less sure", default=1.0)
    critical_overlaps_us: dict[str, float] = Field(
        default_factory=dict, description="other sets of the rank: µs of critical-path time this set shares with each"
    )


class JobReplay(Fact):
    """The job's ranks joined at their matched collectives (analyzers/whatif/job.py): the joined
    replay against the recording, the slowest rank's cost to the job, and who holds the
    collectives (job-wide: rank null; amounts per analysed step)."""

    kind: Literal["job_replay"] = "job_replay"
    ranks_count: int = measure("count", "ranks joined")
    chain_ranks_count: int = measure(
        "count", "of them, ranks without a replay graph, joined as their collectives in series", default=0)
    instances_count: int = measure("count", "collective instances matched on every present member")
    unmatched_count: int = measure("count", "collectives left out: not seen on every present member", default=0)
    steps_count: int = measure("count", "analysed steps the amounts are divided by")
    recorded_step_us: float = us("the median rank's analysed span per step, as recorded")
    modelled_step_us: float = us(
        "the job's step in the join, the analysed steps repeated until the job settles (what every job-level gain "
        "is measured against)")
    model_error: float = measure("factor", "(modelled - recorded) / recorded, signed: how far the join's step is from "
                                 "the recorded one on this job")
    free_running_us: dict[int, float] = us(
        "per rank (10 slowest): its span per step had it never waited for a peer", default_factory=dict)
    slowest_rank: int = Field(description="the rank with the longest free-running span")
    slowest_free_us: float = us("its free-running span per step")
    median_free_us: float = us("the median rank's free-running span per step")
    straggler_cost_us: float = us(
        "per step: how much shorter the job's step gets with the slowest rank at the median rank's pace")
    straggler_cost_ratio: float = ratio("straggler_cost_us / modelled_step_us")
    gpu_hours_per_1000_steps: float = measure(
        "hours", "straggler_cost_us x ranks x 1000 steps, in device-hours: what the straggler costs the job")
    holders_count: dict[int, int] = measure(
        "count", "per rank (10 most): collective instances it arrived at last (it held the others)",
        default_factory=dict)
    top_holder_rank: int = Field(description="the rank that arrived last most often")
    top_holder_share_ratio: float = ratio("share of the instances it held")
    group_holder: dict[str, int] = Field(
        default_factory=dict, description="per process group and collective kind ('group/kind', 10 first): the rank "
        "that arrived last most often")
    group_holder_share: dict[str, float] = measure(
        "ratio", "per process group and collective kind: the share of its instances that rank held",
        default_factory=dict, ge=None, le=None)
    holding_stage: int | None = measure(
        "count", "pipeline-parallel jobs: the stage whose ranks held the most instances", default=None)
    stage_free_us: dict[int, float] = us(
        "pipeline-parallel jobs: per stage, its slowest rank's free-running span per step", default_factory=dict)
    stage_balance_gain_us: float | None = us(
        "pipeline-parallel jobs: per step, the job's gain with the slowest stage at the median stage's pace",
        default=None)
