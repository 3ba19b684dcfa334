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
