"""Facts of the cpu analyzer (analyzers/host/cpu.py and the modules it runs): kernel launch and
dispatch cost, host-device synchronisations and the operators behind them, Python garbage
collection, torch.compile / autotuning activity, and how busy the host is next to the device.
Formulas and thresholds: docs/analysis/cpu.md.
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
    long_kernels_count: int = measure(
        "count", "of those kernels, the ones running at least 50 us (longer than an asynchronous launch call takes)",
        default=0)
    launch_waited_long_kernels_ratio: float = ratio(
        "share of the long kernels whose launch call returned only after the kernel had finished: near 1 when "
        "launches are synchronous (CUDA_LAUNCH_BLOCKING), near 0 when they are queued; 0 without long kernels",
        default=0.0)
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
    stalled_launches_count: int = measure(
        "count", "launch calls in the steps of at least 1 ms and 50x the median launch call (the call itself "
        "stalled: loading a module, a blocked driver)", default=0,
    )
    stalled_launch_us: float = us("their summed duration", default=0.0)
    stalled_launch_ratio: float = ratio("stalled_launch_us / the host windows of the analysed steps", default=0.0)
    stalled_device_idle_ratio: float | None = ratio(
        "share of stalled_launch_us the device had no kernel or copy running (null without stalls)", default=None)
    stalled_first_use_count: int = measure(
        "count", "stalled launches that started the first kernel of its name in the trace (a kernel's first use)",
        default=0,
    )
    stalled_first_use_ratio: float | None = ratio(
        "stalled_first_use_count / stalled_launches_count (null without stalls)", default=None)
    stalled_kernels: list[str] = Field(default_factory=list, description="names of the stalled launches' kernels (3 at most)")


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
    explicit_count: int = measure(
        "count", "collections inside an explicit gc.collect() call (its built-in frame; needs Python stacks)", default=0
    )
    explicit_ratio: float = ratio("time of those collections / gc_us: the share the program asked for", default=0.0)


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
    forward_regions_count: int = measure(
        "count", "'Torch-Compiled Region: F/C' events run in the window(s): one per call of a compiled frame", default=0
    )
    regions_per_step: float = measure("count", "forward_regions_count / steps", default=0.0)
    distinct_frames_max: int = measure(
        "count", "most distinct compiled frames (F of 'F/C') run in one step: more than one per compiled "
        "function means Dynamo split it (graph breaks) or several functions are compiled", default=0,
    )
    frame_calls_max: int = measure(
        "count", "most calls of one compiled frame in one step (a compiled helper called in a loop)", default=0
    )
    resume_frames_count: int | None = measure(
        "count", "Python frames 'torch_dynamo_resume_in_<fn>_at_<line>' in the window(s): code Dynamo resumes "
        "after a graph break (null without Python stacks)", default=None,
    )
    wrapper_us: float | None = us(
        "host time inside compiled calls (compiled regions, CompiledFunction / CompiledFunctionBackward, Dynamo "
        "guard checks) outside the generated code ('## Call CompiledFxGraph ##'): the per-call cost of running "
        "compiled code (null when the trace does not mark the generated code)", default=None,
    )
    wrapper_ratio: float | None = ratio("wrapper_us / window_us", default=None)
    wrapper_excess_us: float | None = us(
        "wrapper_us x (1 - 1 / regions_per_step): the wrapper time beyond one compiled region per step "
        "(what merging the regions into one could save)", default=None,
    )
    wrapper_excess_ratio: float | None = ratio("wrapper_excess_us / window_us", default=None)
    region_device_idle_us: float | None = us(
        "time inside compiled regions (forward regions, CompiledFunctionBackward) with the device idle "
        "(null on a CPU-only rank)", default=None,
    )
    region_device_idle_ratio: float | None = ratio("region_device_idle_us / window_us", default=None)


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
    device_idle_us: float | None = us(
        "time inside the step() calls with the device idle (null on a CPU-only rank)", default=None
    )
    device_idle_ratio: float | None = ratio("device_idle_us / window_us", default=None)


# ---------------------------------------------------------------- Python in the step (analyzers/host/pyframes.py)


class AutogradAnomaly(Fact):
    """Autograd anomaly detection at work in the analysed steps (step = null): the NaN checks the
    autograd engine runs on every backward node's outputs, and the Python stack each forward
    operator captures for its node. Only emitted when either is seen."""

    kind: Literal["autograd_anomaly"] = "autograd_anomaly"
    steps_count: int = measure("count", "analysed steps")
    window_us: float = us("summed step windows")
    nan_checks_count: int = measure(
        "count", "backward nodes ('autograd::engine::evaluate_function: ...') with an aten::isnan child: outputs checked for NaN"
    )
    nan_check_us: float = us("time in the check operators (aten::isnan, aten::_is_any_true / any, aten::item) inside those nodes")  # fmt: skip
    stack_captures_count: int = measure(
        "count", "stack captures for anomaly metadata: outermost torch/fx/traceback.py format_stack frames "
        "inside an operator (needs Python stacks)",
    )
    stack_capture_us: float = us("their time")
    anomaly_us: float = us("union of the check operators and the stack captures")
    anomaly_ratio: float = ratio("anomaly_us / window_us")
    stacks_recorded: bool = Field(description="the trace has Python stacks (with_stack=True): stack captures can be seen")


class TensorFormatting(Fact):
    """Tensors turned into text on the host threads inside the analysed steps (step = null):
    torch's tensor printer (Tensor.__repr__ / __str__ / __format__, torch/_tensor_str.py), run by
    print, f-strings and log messages. Only emitted when the trace has Python stacks and such frames."""

    kind: Literal["tensor_formatting"] = "tensor_formatting"
    steps_count: int = measure("count", "analysed steps")
    window_us: float = us("summed step windows")
    calls_count: int = measure("count", "outermost tensor-printing frames")
    calls_per_step: float = measure("count", "calls_count / steps_count")
    format_us: float = us("union of those frames, minus the time blocked on the device inside them")
    format_ratio: float = ratio("format_us / window_us")
    blocking_us: float = us(
        "time blocked on the device inside them (sync calls, blocking device-to-host copies): the read-backs the "
        "printing forces; the wait itself is the synchronisation facts' (host_sync)"
    )
    item_calls_count: int = measure(
        "count", "aten::item / aten::_local_scalar_dense inside them: element reads, a device synchronisation each on a GPU"
    )


class ModuleHooks(Fact):
    """Module hooks run in the analysed steps (step = null): Python functions nn.Module's call
    wrapper runs besides forward() (forward, pre-forward and full backward hooks), the
    torch/utils/hooks.py machinery of full backward hooks, and their BackwardHookFunction autograd
    nodes. Hooks defined inside torch itself (FSDP, quantization observers) are not counted. Only
    emitted when any is seen."""

    kind: Literal["module_hooks"] = "module_hooks"
    steps_count: int = measure("count", "analysed steps")
    window_us: float = us("summed step windows")
    hook_calls_count: int = measure(
        "count", "calls of hook functions by the module call wrapper (torch/nn/modules/module.py _call_impl / inner), "
        "other than forward() and torch's own (needs Python stacks)",
    )
    hook_calls_per_step: float = measure("count", "hook_calls_count / steps_count")
    backward_hook_nodes_count: int = measure(
        "count", "BackwardHookFunction / BackwardHookFunctionBackward operators (full backward hooks)"
    )
    hook_us: float = us("union of the hook frames, torch/utils/hooks.py frames and BackwardHookFunction operators")
    hook_ratio: float = ratio("hook_us / window_us")


class ObjectConstruction(Fact):
    """nn.Module and torch.optim.Optimizer objects constructed on the training thread inside the
    analysed steps (step = null), outside the DataLoader: Module.__init__ / Optimizer.__init__
    frames and the constructors around them (parameter allocation, weight initialisation). Only
    emitted when the trace has Python stacks and such frames."""

    kind: Literal["object_construction"] = "object_construction"
    steps_count: int = measure("count", "analysed steps")
    window_us: float = us("summed step windows")
    modules_count: int = measure("count", "torch.nn.Module.__init__ calls")
    optimizers_count: int = measure("count", "torch.optim.Optimizer.__init__ calls")
    constructions_per_step: float = measure("count", "(modules_count + optimizers_count) / steps_count")
    construction_us: float = us("union of the outermost constructor frames around those calls")
    construction_ratio: float = ratio("construction_us / window_us")


class GcCollectCalls(Fact):
    """Explicit gc.collect() calls on the host threads inside the analysed steps (step = null): the
    built-in collect frame, so only with Python stacks. Only emitted when there is one."""

    kind: Literal["gc_collect_calls"] = "gc_collect_calls"
    steps_count: int = measure("count", "analysed steps")
    window_us: float = us("summed step windows")
    calls_count: int = measure("count", "gc.collect() calls")
    calls_per_step: float = measure("count", "calls_count / steps_count")
    steps_with_call_ratio: float = ratio("share of analysed steps with a call")
    collect_us: float = us("time inside the calls")
    longest_us: float = us("longest call")
    collect_ratio: float = ratio("collect_us / window_us")


# ---------------------------------------------------------------- framework operators (analyzers/host/dispatch.py, parallel_wrappers.py)


class ZeroGrad(Fact):
    """optimizer.zero_grad() over the analysed steps (step = null), from the profiler's
    'Optimizer.zero_grad#<Class>.zero_grad' annotations. Only emitted when there are such
    annotations in the steps."""

    kind: Literal["zero_grad"] = "zero_grad"
    optimizer: str = Field(description="optimizer class named in the annotation")
    steps_count: int = measure("count", "analysed steps")
    window_us: float = us("summed step windows")
    calls_count: int = measure("count", "zero_grad() calls in the steps")
    zero_grad_us: float = us("their summed duration")
    zero_grad_ratio: float = ratio("zero_grad_us / window_us")
    fill_ops_count: int = measure(
        "count", "top-level aten::zero_ / aten::fill_ / aten::_foreach_zero_ operators inside the calls: gradients "
        "overwritten with zeros instead of dropped",
    )
    fills_gradients: bool = Field(description="fill_ops_count > 0: zero_grad(set_to_none=False) (PyTorch < 2.0's default)")
    device_work_count: int = measure("count", "kernels and memsets launched inside the calls")
    accumulate_add_count: int = measure(
        "count", "AccumulateGrad nodes that added into an existing gradient (an aten::add_ inside) in the steps"
    )


class DdpBufferBroadcast(Fact):
    """DistributedDataParallel's buffer broadcast at the start of each forward
    (broadcast_buffers=True, the default) over the analysed steps (step = null): flattening the
    module's buffers, broadcasting them from rank 0, unflattening and copying them back. Only
    emitted when 'DistributedDataParallel.forward' annotations hold such a broadcast."""

    kind: Literal["ddp_buffer_broadcast"] = "ddp_buffer_broadcast"
    steps_count: int = measure("count", "analysed steps")
    window_us: float = us("summed step windows")
    forward_calls_count: int = measure("count", "DistributedDataParallel.forward calls with a buffer broadcast")
    broadcasts_count: int = measure("count", "c10d::broadcast_ operators in them")
    copies_count: int = measure("count", "aten::copy_ operators that write the broadcast values back into the buffers")
    broadcast_host_us: float = us(
        "host time of the broadcast phase: from the first flatten / broadcast to the last copy back, per call, on the "
        "forward's thread"
    )
    broadcast_ratio: float = ratio("broadcast_host_us / window_us")


class DataParallelReplication(Fact):
    """Single-process multi-device data parallelism (torch.nn.DataParallel) in the analysed steps
    (step = null): the Broadcast (replicate the module), Scatter, Gather and ReduceAddCoalesced
    (gradients back to the first device) autograd functions it runs every step. Only emitted when
    any is seen."""

    kind: Literal["data_parallel"] = "data_parallel"
    steps_count: int = measure("count", "analysed steps")
    window_us: float = us("summed step windows")
    replicate_calls_count: int = measure("count", "Broadcast operators (module replication)")
    scatter_gather_calls_count: int = measure("count", "Scatter and Gather operators")
    reduce_calls_count: int = measure("count", "ReduceAddCoalesced operators (gradients gathered to one device)")
    dp_host_us: float = us("union of those operators and their backward nodes on the host threads")
    dp_ratio: float = ratio("dp_host_us / window_us")
    threads_count: int = measure("count", "host threads with cpu operators in the steps (DataParallel runs one per device)")


class SyncBatchNormSync(Fact):
    """torch.nn.SyncBatchNorm layers in the analysed steps (step = null): their forward and
    backward autograd functions, and the host time blocked on the device inside them (its forward
    reads the gathered counts back to filter out empty inputs: one synchronisation per layer,
    pytorch/pytorch#78549). Only emitted when SyncBatchNorm operators are seen."""

    kind: Literal["sync_batchnorm"] = "sync_batchnorm"
    steps_count: int = measure("count", "analysed steps")
    window_us: float = us("summed step windows")
    forward_calls_count: int = measure("count", "SyncBatchNorm operators (one per layer per forward)")
    backward_calls_count: int = measure("count", "SyncBatchNormBackward operators")
    syncbn_us: float = us("union of those operators")
    blocking_us: float = us("host time in sync calls and blocking device-to-host copies inside them")
    blocking_calls_count: int = measure("count", "those calls")
    syncbn_ratio: float = ratio("syncbn_us / window_us")
    blocking_ratio: float = ratio("blocking_us / window_us")


# ---------------------------------------------------------------- runtime calls (analyzers/host/runtime_calls.py)


class DeviceAllocation(Fact):
    """CUDA / HIP memory allocation runtime calls inside the analysed steps (step = null): device
    memory the caching allocator requests from or returns to the driver (cudaMalloc, cudaFree,
    hipMalloc, hipFree, ...) and pinned host memory (cudaHostAlloc, cudaFreeHost,
    cudaHostRegister, hipHostMalloc, ...). Only emitted for Kineto traces with such calls in the
    steps."""

    kind: Literal["device_allocation"] = "device_allocation"
    steps_count: int = measure("count", "analysed steps")
    window_us: float = us("summed step windows")
    malloc_count: int = measure("count", "device allocation calls")
    free_count: int = measure("count", "device free calls (cudaFree synchronises the device)")
    alloc_us: float = us("host time in device allocation and free calls")
    alloc_ratio: float = ratio("alloc_us / window_us")
    steps_with_alloc_ratio: float = ratio("share of analysed steps with a device allocation or free call")
    host_alloc_count: int = measure("count", "pinned host memory allocation / registration / free calls")
    host_alloc_us: float = us("host time in them")
    host_alloc_ratio: float = ratio("host_alloc_us / window_us")
    empty_cache_calls_count: int | None = measure(
        "count", "torch.cuda.empty_cache() calls seen as Python frames (null without Python stacks)", default=None
    )


class GraphCapture(Fact):
    """CUDA / HIP graphs captured and instantiated inside the analysed steps (step = null):
    stream capture (BeginCapture to EndCapture: the host runs the captured code without the
    device executing it) and graph instantiation. Only emitted when a capture or instantiation
    starts in the steps."""

    kind: Literal["graph_capture"] = "graph_capture"
    steps_count: int = measure("count", "analysed steps")
    window_us: float = us("summed step windows")
    captures_count: int = measure("count", "stream captures (cudaStreamBeginCapture / hipStreamBeginCapture)")
    capture_us: float = us("host time from each capture's begin to its end")
    instantiations_count: int = measure("count", "cudaGraphInstantiate* / hipGraphInstantiate* calls")
    instantiate_us: float = us("host time in them")
    graph_launches_count: int = measure("count", "graph launches in the steps")
    capture_total_us: float = us("capture_us + instantiate_us")
    capture_ratio: float = ratio("capture_total_us / window_us")


class NpuTaskQueue(Fact):
    """torch_npu's task queue over the analysed steps (step = null): with it on (TASK_QUEUE_ENABLE
    1 or 2, the default) the Python thread enqueues each operator and a second thread dequeues
    and launches it; with it off the Python thread launches every operator itself. Only emitted
    for Ascend traces with operator launches in the steps."""

    kind: Literal["npu_task_queue"] = "npu_task_queue"
    steps_count: int = measure("count", "analysed steps")
    window_us: float = us("summed step windows")
    enqueue_count: int = measure("count", "Enqueue events in the steps")
    dequeue_count: int = measure("count", "Dequeue events in the steps")
    queue_enabled: bool = Field(description="the trace has Enqueue or Dequeue events: the task queue is on")
    launches_count: int = measure("count", "CANN operator launch calls (kind launch) in the steps")
    main_thread_launches_count: int = measure("count", "of those, launched on the Python (training) thread")
    main_thread_launch_ratio: float = ratio("main_thread_launches_count / launches_count")
    main_thread_cann_us: float = us("host time of CANN API calls on the training thread in the steps")
    main_thread_cann_ratio: float = ratio("main_thread_cann_us / window_us")


class StateCopies(Fact):
    """Deep copies of model or optimizer state made on the training thread inside the analysed
    steps (step = null): copy.deepcopy frames and nn.Module / Optimizer state_dict() and load_state_dict()
    frames, with the tensor clones inside them. Only emitted when the trace has Python stacks
    and such frames."""

    kind: Literal["state_copies"] = "state_copies"
    steps_count: int = measure("count", "analysed steps")
    window_us: float = us("summed step windows")
    deepcopy_calls_count: int = measure("count", "outermost copy.deepcopy calls")
    state_dict_calls_count: int = measure("count", "outermost state_dict() / load_state_dict() calls (of modules or optimizers)")
    clone_ops_count: int = measure("count", "aten::clone / aten::copy_ operators inside them (tensor data copied)")
    copies_per_step: float = measure("count", "(deepcopy_calls_count + state_dict_calls_count) / steps_count")
    copy_us: float = us("union of those frames")
    copy_ratio: float = ratio("copy_us / window_us")
