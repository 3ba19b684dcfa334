"""Facts of the kernel classes: the share of device time (or, on CPU-only traces, of operator self
time) each class of work takes, and the kernels too short to amortise their launch
(analyzers/compute/class_share.py; formulas in docs/analysis/compute.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..base import Fact, measure, ratio, us

KernelClass = Literal["gemm", "conv", "attention", "elementwise", "reduction", "norm", "memory", "communication", "other"]


class KernelClassShare(Fact):
    """Time of one kernel class on a rank, over all analysed steps (one fact per class present).

    GPU traces: kernels by name pattern, plus gpu_memcpy/gpu_memset activities as ``memory``.
    CPU-only traces (``source == "cpu_op"``): ATen operators by name, self time.
    """

    kind: Literal["kernel_class_share"] = "kernel_class_share"
    kernel_class: KernelClass
    source: Literal["kernel", "cpu_op"] = Field(description="kernel: device activities; cpu_op: CPU-only trace")
    time_us: float = us("sum of the durations of this class's kernels (self time of its operators on CPU)")
    busy_us: float = us("union of this class's kernel intervals inside the step windows (overlap counted once)")
    count: int = measure("count", "kernels (or operator calls) of this class")
    share_of_device_time_ratio: float = ratio("time_us / total time of all device activities (sums to 1 over classes)")
    share_of_step_time_ratio: float = ratio("busy_us / total step window time")
    mean_duration_us: float = us("time_us / count")
    in_optimizer_us: float | None = us(
        "cpu_op only: self time of this class's operators inside optimizer.step() calls", default=None
    )
    outside_optimizer_us: float | None = us("cpu_op only: time_us - in_optimizer_us", default=None)
    outside_optimizer_share_ratio: float | None = ratio(
        "cpu_op only: outside_optimizer_us / total operator self time", default=None
    )


class ShortKernels(Fact):
    """Kernels shorter than a threshold (launch-overhead dominated) on a rank."""

    kind: Literal["short_kernels"] = "short_kernels"
    threshold_us: float = us("a kernel is short below this duration")
    kernels_count: int = measure("count", "kernels in the analysed windows")
    short_count: int = measure("count", "short kernels")
    short_time_us: float = us("their total duration")
    short_count_ratio: float = ratio("short_count / kernels_count")
    short_time_ratio: float = ratio("short_time_us / total kernel time")
    mean_duration_us: float = us("mean kernel duration")
    median_duration_us: float = us("median kernel duration")
