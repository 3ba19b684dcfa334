"""Facts about the critical path of each step: the chain of host work, launches, device work and
waits that decided when the step finished (analyzers/timeline/critical_path.py;
docs/analysis/critical_path.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .base import Fact, measure, ratio, us

PathCategory = Literal[
    "cpu_op", "host_gap", "launch", "runtime", "sync_wait", "kernel", "communication", "memcpy", "device_idle"
]


class CriticalPathOp(BaseModel):
    """One operator (or kernel, or named gap) on the critical path, summed over its segments."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        description="host segments: the enclosing top-level CPU op (else the runtime call); "
        "device segments: the kernel / memcpy name; gaps: the covering annotation"
    )
    category: PathCategory
    time_us: float = us("time this name spends on the path in this category")
    share_ratio: float = ratio("time_us / path_length_us")
    instances_count: int = measure("count", "distinct op instances (or device activities) on the path")


class _CriticalPathShares(Fact):
    """Fields common to the per-step and the rank-level fact (no ``kind``: not a fact kind)."""

    path_length_us: float = us("sum of the path's segments (they tile the path without overlap)")
    step_duration_us: float = us("analysis window length (sum over the steps for the rank-level fact)")
    path_in_step_ratio: float = ratio("share of the step window the path covers: |path ∩ window| / window")
    overrun_us: float = us(
        "how far the path ends after the step window (the step's device work still running when the "
        "next step began); 0 when it ends inside"
    )
    segments_count: int = measure("count", "path segments (graph nodes and idle pieces)")
    cpu_op_us: float = us("inside top-level CPU ops, outside CUDA/HIP runtime calls")
    host_gap_us: float = us("host thread time between traced events (untraced Python, data loading, ...)")
    launch_us: float = us("kernel / memcpy / memset / graph launch runtime calls")
    runtime_us: float = us("other CUDA/HIP runtime calls (malloc, free, event record, stream wait, ...)")
    sync_wait_us: float = us(
        "synchronising calls after the device work they waited for had ended, or with no device work "
        "found to wait for"
    )
    kernel_us: float = us("compute kernels")
    communication_us: float = us("collective kernels (NCCL/RCCL), or CPU-only collective ops")
    memcpy_us: float = us("device memcpy / memset")
    device_idle_us: float = us(
        "device activity waiting for its release with nothing traced running on the path "
        "(launch latency, untraced cross-stream waits)"
    )
    cpu_op_ratio: float = ratio("cpu_op_us / path_length_us")
    host_gap_ratio: float = ratio("host_gap_us / path_length_us")
    launch_ratio: float = ratio("launch_us / path_length_us")
    runtime_ratio: float = ratio("runtime_us / path_length_us")
    sync_wait_ratio: float = ratio("sync_wait_us / path_length_us")
    kernel_ratio: float = ratio("kernel_us / path_length_us")
    communication_ratio: float = ratio("communication_us / path_length_us")
    memcpy_ratio: float = ratio("memcpy_us / path_length_us")
    device_idle_ratio: float = ratio("device_idle_us / path_length_us")
    host_ratio: float = ratio("(cpu_op + host_gap + launch + runtime) / path length: the host decides")
    device_ratio: float = ratio("(kernel + communication + memcpy) / path length: the device decides")
    dominant_category: PathCategory | None = Field(default=None, description="category with most path time")
    top_ops: list[CriticalPathOp] = Field(default_factory=list, description="up to 10, longest first")


class CriticalPathStep(_CriticalPathShares):
    """The critical path of one step of one rank."""

    kind: Literal["critical_path_step"] = "critical_path_step"
    start_us: float = us("step window start")
    end_us: float = us("step window end")
    path_start_us: float = us("where the backward walk stopped (window start, or a node without predecessor)")
    path_end_us: float = us("end of the step's last-ending event, where the walk began")


class CriticalPath(_CriticalPathShares):
    """The critical paths of all analysed steps of a rank, added up."""

    kind: Literal["critical_path"] = "critical_path"
    steps_count: int = measure("count", "steps with a critical path")
