"""Facts of the cpu analyzer (analyzers/cpu.py): kernel launch and dispatch cost, host-device
synchronisations and the operators behind them, Python garbage collection, torch.compile /
autotuning activity, and how busy the host is next to the device. Formulas and thresholds:
docs/analysis/cpu.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .base import Fact, measure, ratio, us


class LaunchOverhead(Fact):
    """Kernel launch cost on one rank over all analysed steps (step = null)."""

    kind: Literal["launch_overhead"] = "launch_overhead"
    launches_count: int = measure(
        "count", "kernel launch runtime calls (cudaLaunchKernel, hipLaunchKernel, ...) in the steps"
    )
    graph_launches_count: int = measure("count", "CUDA/HIP graph launch calls in the steps")
    kernels_count: int = measure(
        "count", "kernels started by those launch calls (graph kernels not included)"
    )
    launch_call_mean_us: float | None = us("mean duration of a launch call on the host", default=None)
    launch_call_p50_us: float | None = us("median duration of a launch call", default=None)
    kernel_mean_us: float | None = us("mean kernel duration", default=None)
    kernel_p50_us: float | None = us("median kernel duration", default=None)
    short_kernels_count: int = measure(
        "count", "kernels that ran for less time than their own launch call took"
    )
    short_kernels_ratio: float = ratio("short_kernels_count / kernels_count")
    host_us_per_kernel: float | None = us(
        "host busy time (as in host_device_busy: cpu ops minus blocked time, in the steps) / kernels_count",
        default=None,
    )
    queue_p50_us: float | None = us(
        "median time from a launch call's start to its kernel's start", default=None
    )
    queue_p95_us: float | None = us("95th percentile of that delay", default=None)
    host_wait_kernels_count: int = measure(
        "count",
        "kernels/copies launched only after the previous activity on their stream had ended (HTA host_wait)",
    )
    host_wait_kernels_ratio: float = ratio("host_wait_kernels_count / device activities with a launch call")


class HostDeviceBusy(Fact):
    """How busy the host threads and the device are in a step (or, step = null, over all analysed
    steps: ``_us`` are sums, ratios recomputed)."""

    kind: Literal["host_device_busy"] = "host_device_busy"
    window_us: float = us("step window length")
    host_busy_us: float = us("union of top-level cpu ops on the host threads inside the window, minus the time blocked in sync calls and blocking DtoH copies")  # fmt: skip
    host_busy_ratio: float = ratio("host_busy_us / window_us")
    host_active_us: float = us("union of anything traced on the host threads: top-level cpu ops, user annotations other than the step's, python functions")  # fmt: skip
    host_active_ratio: float = ratio("host_active_us / window_us")
    device_busy_us: float | None = us("union of kernels, memcpys and memsets of the rank's devices (null without device activity)", default=None)  # fmt: skip
    device_busy_ratio: float | None = ratio("device_busy_us / window_us", default=None)
    device_idle_us: float | None = us("window_us - device_busy_us", default=None)
    device_idle_host_busy_us: float | None = us(
        "device idle while the host threads run cpu ops", default=None
    )
    device_idle_host_busy_ratio: float | None = ratio("device_idle_host_busy_us / window_us", default=None)
    launches_count: int = measure("count", "kernel launch and graph launch calls in the window")


class SyncSource(BaseModel):
    """Operators behind blocking host-device synchronisations."""

    model_config = ConfigDict(extra="forbid")

    op: str = Field(description="outermost known synchronising op of the call's op chain (aten::item, aten::to, "
                                "aten::nonzero, ...), else the op that made the call")  # fmt: skip
    outer_op: str = Field(
        description="top-level op the call happened in (or the enclosing Python function, or '(no op)')"
    )
    count: int = measure("count", "blocking runtime calls")
    host_us: float = us("time the host spent in those calls")


class HostSync(Fact):
    """Blocking host-device synchronisations in a step (or over all steps, step = null): sync
    runtime calls, blocking device-to-host copies, cuda_sync events, and the ops behind them."""

    kind: Literal["host_sync"] = "host_sync"
    window_us: float = us("host window of the step(s)")
    sync_calls_count: int = measure("count", "cudaDeviceSynchronize / cudaStreamSynchronize / cudaEventSynchronize (hip*) calls")  # fmt: skip
    sync_calls_us: float = us("host time in those calls")
    longest_sync_us: float = us("longest single sync call (0 when none)")
    dtoh_count: int = measure("count", "device-to-host copies")
    dtoh_bytes: int = measure("bytes", "bytes copied device-to-host")
    dtoh_blocking_count: int = measure("count", "DtoH copies issued by a blocking call (cudaMemcpy, hipMemcpyWithStream, ...) or to pageable memory")  # fmt: skip
    dtoh_blocking_us: float = us("host time in the calls issuing the blocking DtoH copies")
    blocking_us: float = us("sync_calls_us + dtoh_blocking_us")
    blocking_ratio: float = ratio("blocking_us / window_us")
    sync_events_count: int = measure(
        "count", "cuda_sync events (needs enable_cuda_sync_events) on the device"
    )
    sync_events_us: float = us("their summed durations")
    top_sources: list[SyncSource] = Field(
        default_factory=list,
        description="ops behind the blocking calls, by host time (at most 10; aggregate only)",
    )


class GcPauses(Fact):
    """Python garbage collection recorded in the trace ('Python GC' python_function events,
    PyTorch >= 2.6 with record_python_gc_info) over all analysed steps (step = null). Only
    emitted when the trace has such events."""

    kind: Literal["gc_pauses"] = "gc_pauses"
    gc_count: int = measure("count", "Python GC events inside the analysed steps")
    gc_us: float = us("their summed durations")
    longest_us: float = us("longest single collection")
    steps_with_gc: list[int] = Field(default_factory=list, description="steps with at least one collection")
    steps_with_gc_ratio: float = ratio("share of analysed steps with a collection")
    step_time_ratio: float = ratio("gc_us / summed step windows")
    max_step_ratio: float = ratio("largest share of one step's window spent collecting")
    in_dataloader_count: int = measure("count", "collections inside a DataLoader __next__ annotation")


class Compilation(Fact):
    """torch.compile (Dynamo / AOTAutograd / Inductor / Triton JIT) and autotuning activity in a
    step (or over all analysed steps, step = null). Per-step facts only for steps that compile or
    autotune."""

    kind: Literal["compilation"] = "compilation"
    window_us: float = us("step window(s)")
    compile_us: float = us(
        "union of compilation events (Dynamo tracing, AOT, Inductor codegen, Triton compile)"
    )
    compile_count: int = measure("count", "separate compilation stretches (disjoint blocks of compile_us)")
    autotune_us: float = us(
        "union of autotuning events (cudnnFind*, TunableOp, Inductor select_algorithm, *autotune*)"
    )
    autotune_count: int = measure("count", "separate autotuning stretches")
    compile_ratio: float = ratio("(compile_us ∪ autotune_us) / window_us")
    compiled_region_count: int = measure("count", "runs of compiled code: 'Torch-Compiled Region', CompiledFxGraph, CompiledFunction")  # fmt: skip
    compiled_region_us: float = us("union of those runs")
    cache_lookup_count: int = measure("count", "'TorchDynamo Cache Lookup' guard checks")
    cache_lookup_us: float = us("their summed durations")
    compiled_frames: list[str] = Field(
        default_factory=list,
        description="'frame/compile' ids of the compiled regions run (e.g. '0/1'), at most 10",
    )
    max_compile_id: int | None = Field(
        default=None,
        description="largest compile id among the regions run: that frame was compiled id + 1 times",
    )
    recompiled: bool = Field(
        description="max_compile_id > 0: some frame was recompiled (before or during the capture)"
    )


class OperatorDispatch(Fact):
    """Operators too small to be worth dispatching, on the training thread over all analysed steps
    (step = null). An operator is small when the largest tensor it or anything it calls receives
    has at most ``small_elements`` elements: its arithmetic takes less time than the per-call cost
    of the Python binding, the dispatcher and autograd. Only emitted when the trace recorded
    input shapes (record_shapes=True)."""

    kind: Literal["operator_dispatch"] = "operator_dispatch"
    steps_count: int = measure("count", "analysed steps")
    window_us: float = us("summed step windows")
    small_elements: int = measure("count", "largest-input element count at or below which an operator counts as small")
    ops_count: int = measure("count", "top-level operators on the training thread inside the steps")
    shaped_ops_count: int = measure("count", "of those, operators with a recorded input shape (in them or below)")
    small_ops_count: int = measure("count", "small operators")
    small_ops_per_step: float = measure("count", "small_ops_count / steps_count")
    small_ops_us: float = us("time inside the small operators")
    between_small_us: float = us(
        "host time between two consecutive small operators of the same step, each gap counted up to gap_cap_us "
        "(the Python that issues them)"
    )
    gap_cap_us: float = us("largest gap counted into between_small_us")
    dispatch_us: float = us("small_ops_us + between_small_us")
    dispatch_ratio: float = ratio("dispatch_us / window_us")
    dispatch_per_op_us: float | None = us("dispatch_us / small_ops_count: what one small operator costs", default=None)


class OptimizerStep(Fact):
    """The optimizer's step() over all analysed steps (step = null), from the profiler's
    'Optimizer.step#<Class>.step' annotations and the operators inside them. Only emitted when the
    trace has such annotations inside the analysed steps."""

    kind: Literal["optimizer_step"] = "optimizer_step"
    optimizer: str = Field(description="optimizer class named in the annotation (AdamW, SGD, ...)")
    implementation: Literal["for_loop", "foreach", "fused"] = Field(
        description="fused: a _fused_ operator inside; foreach: _foreach_ operators; for_loop: neither "
        "(one set of operators per parameter tensor)"
    )
    steps_count: int = measure("count", "analysed steps")
    window_us: float = us("summed step windows")
    calls_count: int = measure("count", "optimizer.step() calls inside the analysed steps")
    optimizer_us: float = us("their summed duration")
    optimizer_ratio: float = ratio("optimizer_us / window_us")
    ops_per_call: float = measure("count", "top-level operators inside one step() call, on average")
