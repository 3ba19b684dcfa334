"""Facts of how well kernels fill the device: grids with fewer thread blocks than SMs and the
partly empty last wave of multi-wave grids (analyzers/compute/occupancy.py; docs/analysis/compute.md
"Per kernel")."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..base import Fact, measure, ratio, us


class KernelGridFill(Fact):
    """Kernels that launch fewer thread blocks than the GPU has SMs: while one runs alone, the other
    SMs have nothing to do (NVIDIA traces; the grid and the SM count come from the trace)."""

    kind: Literal["kernel_grid_fill"] = "kernel_grid_fill"
    sm_count: int = measure("count", "SMs of the device (deviceProperties numSms)")
    min_kernel_us: float = us("kernels shorter than this are left out (their time is launch latency)")
    kernels_time_us: float = us("non-communication kernel time in the analysed windows")
    long_kernels_count: int = measure("count", "non-communication kernels of at least min_kernel_us with a grid")
    underfilled_count: int = measure("count", "of them, those with fewer blocks than SMs")
    underfilled_time_us: float = us("their duration")
    underfilled_alone_time_us: float = us("the part of it no kernel on another stream overlaps")
    underfilled_ratio: float = ratio("underfilled_alone_time_us / kernels_time_us")
    fill_ratio: float = ratio("blocks / SMs, weighted by the alone time of the underfilled kernels")
    idle_sm_time_us: float = us("sum of alone time x (1 - blocks / SMs): SM-time left idle, in kernel time")
    idle_sm_ratio: float = ratio("idle_sm_time_us / kernels_time_us")
    matmul_idle_sm_time_us: float = us("the part of idle_sm_time_us in GEMM, convolution and attention kernels")
    other_idle_sm_time_us: float = us("the part in all other kernels (reductions, norms, element-wise ...)")
    median_blocks: int = measure("count", "time-weighted median blocks of the underfilled kernels")


class KernelWaves(Fact):
    """Wave quantisation: a kernel's blocks run in waves of (SMs x blocks resident per SM); when the
    last wave is only partly full, the SMs without a block idle until it ends (NVIDIA traces; the
    resident blocks come from the launch's threads, registers and shared memory against the
    device's per-SM limits, as the CUDA occupancy calculator computes them)."""

    kind: Literal["kernel_waves"] = "kernel_waves"
    sm_count: int = measure("count", "SMs of the device (deviceProperties numSms)")
    min_kernel_us: float = us("kernels shorter than this are left out (their time is launch latency)")
    kernels_time_us: float = us("non-communication kernel time in the analysed windows")
    judged_count: int = measure("count", "kernels of at least min_kernel_us with a grid, block and register count")
    multi_wave_count: int = measure("count", "of them, those with more blocks than one wave holds")
    multi_wave_time_us: float = us("their duration")
    tail_idle_time_us: float = us("sum over them of duration x (ceil(w) - w) / ceil(w), w = blocks / wave size: "
                                  "the SM time the partial last wave leaves idle")  # fmt: skip
    tail_idle_ratio: float = ratio("tail_idle_time_us / kernels_time_us")
    matmul_tail_idle_time_us: float = us("the part of tail_idle_time_us in GEMM, convolution and attention kernels")
    median_waves: float = measure("count", "time-weighted median of w over the multi-wave kernels", le=None)
    top_kernel: str = Field(default="", description="the kernel (short name) with the most tail idle time")
    top_kernel_waves: float | None = measure("count", "w of its longest launch", default=None, le=None)
