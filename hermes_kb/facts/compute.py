"""Facts of the compute analyzer (analyzers/compute/compute.py; formulas in docs/analysis/compute.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .base import Fact, measure, ratio, us

KernelClass = Literal["gemm", "conv", "attention", "elementwise", "reduction", "norm", "memory", "communication", "other"]
RooflineClass = Literal["memory_bound", "compute_bound", "underutilised"]


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


class OperatorRoofline(Fact):
    """One operator + input shapes + dtype (aggregated over its calls): FLOPs, bytes, achieved rates
    and the paper's roofline class. At most 10 per rank, the longest first."""

    kind: Literal["operator_roofline"] = "operator_roofline"
    operator: str = Field(description="ATen operator name, e.g. aten::addmm")
    category: Literal["gemm", "conv", "attention", "elementwise", "reduction", "memory"]
    shape: str = Field(description="input tensor shapes, e.g. [16,559,1024]x[1024,1024]")
    dtype: str = Field(description="data type of the computation (widest float input): fp32, bf16, fp16, fp8, ...")
    time_source: Literal["device", "cpu"] = Field(description="device: kernel time attributed to the operator; "
                                                            "cpu: operator duration on a CPU-only trace")  # fmt: skip
    calls_count: int = measure("count", "operator calls aggregated")
    kernels_count: int = measure("count", "kernels attributed to these calls")
    time_us: float = us("device time of the attributed kernels (CPU duration on CPU-only traces)")
    share_of_time_ratio: float = ratio("time_us / all device activity time (CPU op self time on CPU-only traces)")
    flops: float = measure("flops", "FLOPs of all calls (analyzers/compute/flops.py)")
    bytes: float = measure("bytes", "bytes read and written by all calls (each operand once)")
    flops_exact: bool = Field(description="false when FLOPs/bytes rest on an assumption (conv stride, causal mask, ...)")
    achieved_flops_per_s: float = measure("flops_per_s", "flops / time")
    achieved_gbps: float = measure("gbps", "bytes / time")
    arithmetic_intensity_flop_per_byte: float | None = measure("flop_per_byte", "flops / bytes (null: no bytes)")
    peak_dtype: str | None = Field(default=None, description="which peak of the device table was used")
    peak_flops_per_s: float | None = measure("flops_per_s", "device peak FLOP/s for this dtype (null: unknown)")
    peak_gbps: float | None = measure("gbps", "device HBM bandwidth (null: unknown)")
    ridge_point_flop_per_byte: float | None = measure("flop_per_byte", "AI* = peak FLOP/s / peak bandwidth")
    compute_utilisation_ratio: float | None = ratio("achieved FLOP/s / peak (capped at 1)")
    bandwidth_utilisation_ratio: float | None = ratio("achieved bandwidth / peak (capped at 1)")
    roofline_class: RooflineClass | None = Field(
        description="memory_bound: AI <= AI* and B >= U_thr*B_peak; compute_bound: AI > AI* and "
        "P >= U_thr*P_peak; underutilised otherwise; null when the device peak is unknown or CPU-only"
    )
    utilisation_threshold_ratio: float = ratio("U_thr used")


class RooflineSummary(Fact):
    """How the time of recognised operators splits over the roofline classes on a rank."""

    kind: Literal["roofline_summary"] = "roofline_summary"
    time_source: Literal["device", "cpu"]
    device: str | None = Field(default=None, description="device from the peak table (null: unknown)")
    operators_count: int = measure("count", "distinct operator + shape + dtype groups with time")
    attributed_time_us: float = us("kernel time attributed to recognised operators")
    attributed_time_ratio: float = ratio("attributed_time_us / non-communication device time")
    memory_bound_time_us: float = us("time of memory-bound groups")
    compute_bound_time_us: float = us("time of compute-bound groups")
    underutilised_time_us: float = us("time of underutilised groups")
    unclassified_time_us: float = us("time of groups without a class (unknown peak)")
    memory_bound_ratio: float | None = ratio("of classified time")
    compute_bound_ratio: float | None = ratio("of classified time")
    underutilised_ratio: float | None = ratio("of classified time (the paper's 'underutilisation' share)")
    utilisation_threshold_ratio: float = ratio("U_thr used")


class ModelFlopsUtilization(Fact):
    """Model FLOPs utilisation of a rank over the analysed steps."""

    kind: Literal["model_flops_utilization"] = "model_flops_utilization"
    flops: float = measure("flops", "FLOPs of recognised operators in the analysed windows")
    flops_per_step: float = measure("flops", "flops / analysed steps")
    window_time_us: float = us("total analysed step window time")
    achieved_flops_per_s: float = measure("flops_per_s", "flops / window time")
    dominant_dtype: str = Field(description="dtype with the most matmul (GEMM/conv/attention) FLOPs")
    peak_dtype: str | None = Field(default=None, description="peak used: tf32 when FP32 matmuls ran on TF32 kernels")
    peak_flops_per_s: float | None = measure("flops_per_s", "device peak for the dominant dtype × devices")
    mfu_ratio: float | None = ratio("achieved_flops_per_s / peak_flops_per_s; null when the device is unknown")
    inexact_flops_ratio: float = ratio("share of the FLOPs that are estimates (conv without stride, attention "
                                       "without the causal flag, reductions)")  # fmt: skip
    device: str | None = None
    devices_count: int = measure("count", "devices with kernels on this rank")


class TensorCoreUsage(Fact):
    """Whether GEMM/convolution kernels use tensor (matrix) cores, from kernel names."""

    kind: Literal["tensor_core_usage"] = "tensor_core_usage"
    gemm_time_us: float = us("GEMM kernel time")
    conv_time_us: float = us("convolution kernel time")
    tensor_core_time_us: float = us("GEMM+conv kernels on tensor/matrix cores")
    non_tensor_core_time_us: float = us("GEMM+conv kernels on CUDA cores / SIMD (sgemm, simt, gemv, scudnn, ...)")
    fp32_non_tensor_core_time_us: float = us("FP32 GEMM+conv kernels not on tensor cores")
    tf32_time_us: float = us("FP32 GEMM+conv kernels on tensor cores (TF32)")
    tensor_core_ratio: float = ratio("tensor_core_time_us / (gemm + conv time)")
    fp32_non_tensor_core_gemm_ratio: float = ratio("FP32 non-tensor-core GEMM time / GEMM time")
    fp32_non_tensor_core_ratio: float = ratio("fp32_non_tensor_core_time_us / (gemm + conv time)")
    fp32_non_tensor_core_gemm_time_us: float = us("FP32 GEMM kernels not on tensor cores", default=0.0)
    tensor_core_removes_low_ratio: float | None = ratio(
        "share of the FP32 CUDA-core GEMM time that tensor-core math removes at the low end, from this device's "
        "peaks: 1 - 2 x FP32 peak / TF32 peak (FP16 where there is no TF32): the tensor-core kernels reaching "
        "half their peak advantage (small or odd shapes); null when the device is not known", default=None)
    tensor_core_removes_high_ratio: float | None = ratio(
        "the same at the high end: 1 - FP32 peak / BF16 (else FP16) tensor-core peak, large GEMMs under "
        "16-bit autocast; null when the device is not known", default=None)


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


class FusionSequence(BaseModel):
    """One repeated run of consecutive element-wise/reduction/normalisation kernels on a stream."""

    model_config = ConfigDict(extra="forbid")

    kernels: list[str] = Field(description="class:short name of each kernel, in launch order")
    length_count: int = measure("count", "kernels in the sequence")
    occurrences_count: int = measure("count", "times the sequence occurs")
    total_time_us: float = us("summed duration of all occurrences")
    mean_time_us: float = us("per occurrence")
    share_of_kernel_time_ratio: float = ratio("total_time_us / total kernel time")
    gap_us: float = us("idle device time between consecutive kernels inside the occurrences (each gap once)",
                       default=0.0)
    exec_ratio: float = ratio("total_time_us / (total_time_us + gap_us): share of the occurrences' span the "
                              "device computes", default=1.0)  # fmt: skip
    host_bound: bool = Field(default=False, description="exec_ratio below the host-bound threshold: the device "
                             "waits between these kernels longer than it runs them (dispatch-bound)")  # fmt: skip
    mte_us: float | None = us("Ascend: Σ over the kernels of max(aic_mte2, aiv_mte2) + max(aic_fixpipe, aiv_mte3) "
                              "pipe time; null without pipe metrics", default=None)  # fmt: skip
    mte_ratio: float | None = measure("ratio", "Ascend: mte_us / Σ (aicore_time + aiv_time); can exceed 1 (two "
                                      "transfer pipes run at once); null without pipe metrics", default=None, le=None)  # fmt: skip
    mte_bound: bool | None = Field(default=None, description="Ascend: mte_ratio above the MTE-bound threshold: "
                                   "memory transfers dominate, so fusing saves the intermediate round trips")  # fmt: skip


class FusionCandidates(Fact):
    """The most time-consuming repeated sequences of fusable kernels (top 5), and how many such
    sequences there are in all."""

    kind: Literal["fusion_candidates"] = "fusion_candidates"
    sequences: list[FusionSequence] = Field(description="at most 5, by total time")
    candidate_kernels_count: int = measure("count", "element-wise, reduction and normalisation kernels")
    candidate_time_us: float = us("their total duration")
    candidate_time_ratio: float = ratio("candidate_time_us / total kernel time")
    min_occurrences_count: int = measure("count", "a sequence must occur at least this often")
    sequences_count: int = measure("count", "distinct repeated sequences found (same runs counted once; at most "
                                   "100 counted)", default=0)  # fmt: skip
    sequences_time_us: float = us("kernel time covered by all of them, each kernel once", default=0.0)
    sequences_gap_us: float = us("idle device time between their consecutive kernels, each gap once", default=0.0)
    host_bound_count: int = measure("count", "of the sequences, those that are host bound", default=0)
    mte_bound_count: int = measure("count", "of the sequences, those that are MTE bound (Ascend pipe metrics)",
                                   default=0)  # fmt: skip
    host_bound_threshold_ratio: float = ratio("a sequence is host bound when exec_ratio is below this", default=0.4)
    mte_bound_threshold_ratio: float = ratio("a sequence is MTE bound when mte_ratio is above this", default=0.8)


class CpuThinMatmuls(Fact):
    """CPU-only trace: matrix multiplies with a thin dimension (a few rows, typically the batch) and
    what a larger batch would do to the per-sample time, over all analysed steps (step = null).
    Emitted when the analysed steps hold GEMMs whose smallest dimension is at most ``thin_max_rows``.

    Model (docs/analysis/compute.md): at ``batch_factor`` times the batch, the thin GEMMs do
    that many times their FLOPs at no less than their present time, at most the CPU's FMA peak
    (fast end) or ``attainable_ratio`` of the smaller peak the CPU flags allow (slow end); other
    GEMMs grow with the batch; everything else (optimizer, element-wise work on small tensors,
    Python) is taken as fixed per step. Peaks need the CPU model and clock the monitor records,
    so on a bare trace the peak and prediction fields are null."""

    kind: Literal["cpu_thin_matmuls"] = "cpu_thin_matmuls"
    steps_count: int = measure("count", "analysed steps")
    window_us: float = us("summed step windows")
    step_us: float = us("window_us / steps_count")
    gemm_us: float = us("time of all GEMM operators (outermost recognised operator, CPU duration)")
    thin_gemm_us: float = us("time of the GEMM groups whose smallest dimension is <= thin_max_rows")
    thin_gemm_ratio: float = ratio("thin_gemm_us / gemm_us")
    thin_share_of_step_ratio: float = ratio("thin_gemm_us / window_us")
    thin_max_rows: int = measure("count", "a GEMM is thin at or below this many rows")
    thin_rows: int = measure("count", "smallest GEMM dimension of the thin groups (time-weighted median)")
    target_rows: int = measure("count", "rows from which CPU GEMM kernels run near their peak")
    batch_factor: float = measure("x", "target_rows / thin_rows: the batch multiple the prediction is for")
    thin_gemm_flops: float = measure("FLOP", "FLOPs of the thin GEMMs in the window")
    thin_achieved_flops_per_s: float = measure("FLOP/s", "thin_gemm_flops / thin_gemm_us")
    other_gemm_us: float = us("time of the GEMMs that are not thin (grow with the batch)")
    cpu_model: str | None = Field(default=None, description="the CPU model the monitor recorded")
    threads_count: int | None = measure("count", "intra-op threads the GEMMs can use (torch threads, at most the usable cores)", default=None)
    attainable_ratio: float = ratio("share of the smaller peak the slow end assumes a 64-row GEMM reaches")
    peak_low_flops_per_s: float | None = measure("FLOP/s", "FP32 FMA peak of the threads, fewest FMA units the flags allow", default=None)
    peak_high_flops_per_s: float | None = measure("FLOP/s", "FP32 FMA peak of the threads, most FMA units the flags allow", default=None)
    thin_utilisation_max_ratio: float | None = ratio(
        "thin_achieved_flops_per_s / peak_low_flops_per_s, at most 1: the highest share of the peak the thin "
        "GEMMs can be reaching (the peak is known only within its range)", default=None
    )
    target_step_fast_us: float | None = us("predicted step at batch_factor x the batch, GEMMs at the high peak", default=None)
    target_step_slow_us: float | None = us("predicted step at batch_factor x the batch, GEMMs at attainable_ratio x the low peak", default=None)
    per_sample_saving_high_us: float | None = us(
        "step_us - target_step_fast_us / batch_factor: time saved per present batch's worth of samples", default=None
    )
    per_sample_saving_low_us: float | None = us("step_us - target_step_slow_us / batch_factor", default=None)


# --- per-kernel analysis (analyzers/compute/kernels.py; docs/analysis/compute.md "Per kernel") ---------------
CopyKind = Literal["dtype_cast", "strided_copy", "contiguous_copy", "concat", "fill", "index", "layout_transpose",
                   "host_transfer", "other"]  # fmt: skip


class KernelRoofline(Fact):
    """One kernel (by name) with the FLOPs and bytes it inherits from the operator calls that launched
    it: each call's cost split over its kernels by duration (matrix kernels take a matmul's FLOPs,
    helpers such as split-K reductions none). At most 10 per rank, the longest first."""

    kind: Literal["kernel_roofline"] = "kernel_roofline"
    kernel: str = Field(description="short kernel name (function, or functor of an ATen element-wise kernel)")
    kernel_name: str = Field(description="the kernel's full name (first 200 characters)")
    kernel_class: KernelClass
    operator: str = Field(description="the outermost recognised operator that launched most of its time")
    dtype: str = Field(description="data type of the launching calls (the one with the most time)")
    launches_count: int = measure("count", "launches with FLOPs/bytes attributed")
    time_us: float = us("duration of those launches")
    share_of_time_ratio: float = ratio("time_us / all device activity time")
    mean_duration_us: float = us("time_us / launches_count")
    flops: float = measure("flops", "FLOPs attributed to the launches")
    bytes: float = measure("bytes", "bytes attributed to the launches")
    flops_exact: bool = Field(description="false when a launching call's count rests on an assumption")
    achieved_flops_per_s: float = measure("flops_per_s", "flops / time")
    achieved_gbps: float = measure("gbps", "bytes / time")
    arithmetic_intensity_flop_per_byte: float | None = measure("flop_per_byte", "flops / bytes (null: no bytes)")
    peak_dtype: str | None = Field(default=None, description="which peak of the device table was used")
    peak_flops_per_s: float | None = measure("flops_per_s", "matrix peak of the dtype for GEMM/conv/attention "
                                             "kernels, vector FP32 peak otherwise (null: unknown)")  # fmt: skip
    peak_gbps: float | None = measure("gbps", "device HBM bandwidth (null: unknown)")
    ridge_point_flop_per_byte: float | None = measure("flop_per_byte", "AI* = peak FLOP/s / peak bandwidth")
    compute_utilisation_ratio: float | None = ratio("achieved FLOP/s / peak (capped at 1)")
    bandwidth_utilisation_ratio: float | None = ratio("achieved bandwidth / peak (capped at 1)")
    roofline_class: RooflineClass | None = Field(description="the paper's rule on this kernel's own rates (as "
                                                 "operator_roofline); null when a peak is unknown")  # fmt: skip
    grid_blocks: int | None = measure("count", "median thread blocks per launch (null: not recorded)", default=None)
    sm_fill_ratio: float | None = ratio("time-weighted min(1, blocks / SMs) (null: SM count or grid unknown, or "
                                        "an AMD trace)", default=None)  # fmt: skip
    utilisation_threshold_ratio: float = ratio("U_thr used")


class KernelRooflineSummary(Fact):
    """How the time of the kernels with attributed FLOPs/bytes splits over the roofline classes, judged
    per kernel, and how much of it is starved: long kernels below half of the roof they sit under."""

    kind: Literal["kernel_roofline_summary"] = "kernel_roofline_summary"
    device: str | None = Field(default=None, description="device from the peak table (null: unknown)")
    kernels_time_us: float = us("non-communication kernel time in the analysed windows")
    attributed_time_us: float = us("time of the kernels that inherit FLOPs/bytes from a recognised operator")
    attributed_time_ratio: float = ratio("attributed_time_us / kernels_time_us")
    kernel_names_count: int = measure("count", "distinct kernels with attributed FLOPs/bytes")
    memory_bound_time_us: float = us("time of memory-bound kernels")
    compute_bound_time_us: float = us("time of compute-bound kernels")
    underutilised_time_us: float = us("time of underutilised kernels")
    unclassified_time_us: float = us("time of kernels without a class (unknown peak)")
    memory_bound_ratio: float | None = ratio("of classified time")
    compute_bound_ratio: float | None = ratio("of classified time")
    underutilised_ratio: float | None = ratio("of classified time")
    min_kernel_us: float = us("kernels shorter than this on average are left out of the starved times "
                              "(launch latency, not the roofs, bounds them)")  # fmt: skip
    bandwidth_starved_time_us: float = us("kernels on the memory side (AI <= AI*) of mean duration >= min_kernel_us "
                                          "reaching less than U_thr of the HBM bandwidth")  # fmt: skip
    bandwidth_starved_ratio: float = ratio("bandwidth_starved_time_us / kernels_time_us")
    bandwidth_starved_utilisation_ratio: float | None = ratio(
        "their bytes / (their time x peak bandwidth): the share of the bandwidth they reach together", default=None
    )
    compute_starved_time_us: float = us("GEMM/conv/attention kernels on the compute side (AI > AI*) of mean "
                                        "duration >= min_kernel_us below U_thr of the matrix peak")  # fmt: skip
    compute_starved_ratio: float = ratio("compute_starved_time_us / kernels_time_us")
    utilisation_threshold_ratio: float = ratio("U_thr used")


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


class DeviceCopyKind(Fact):
    """Device time of one kind of data movement (one fact per kind present): memory-class kernels and
    memcpy/memset activities split by what produced them (kernel names, and the dtypes of the launching
    aten::copy_ when shapes were recorded)."""

    kind: Literal["device_copy_kind"] = "device_copy_kind"
    copy_kind: CopyKind = Field(description="dtype_cast: conversions between dtypes; strided_copy: same-dtype copies "
                                "of non-contiguous views (.contiguous(), reshape of a permuted tensor); "
                                "contiguous_copy: plain device copies; concat: torch.cat / stack; fill: zeros, "
                                "fill_, memset; index: gather / scatter / index_select; layout_transpose: "
                                "NCHW<->NHWC conversions around convolutions; host_transfer: host<->device copies")  # fmt: skip
    time_us: float = us("summed duration")
    count: int = measure("count", "activities")
    mean_duration_us: float = us("time_us / count")
    share_of_device_time_ratio: float = ratio("time_us / all device activity time")
    share_of_memory_time_ratio: float = ratio("time_us / memory-class device time")
    top_kernel: str = Field(description="the kernel (short name) with the most time of this kind")
    top_operator: str = Field(default="", description="top-level operator that launched most of this time "
                              "(empty when not known)")  # fmt: skip
    top_operator_shape: str = Field(default="", description="its input shapes, when recorded")
    conv_time_us: float | None = us("layout_transpose only: convolution kernel time beside them", default=None)
    layout_to_conv_ratio: float | None = ratio("layout_transpose only: time_us / (time_us + conv_time_us)",
                                               default=None)  # fmt: skip

    def scope(self) -> str:
        return f"{super().scope()}, {self.copy_kind}"  # one fact per kind: the kind is part of what it covers


class OptimizerDevice(Fact):
    """The device work launched inside optimizer.step() calls, and how the update is implemented there."""

    kind: Literal["optimizer_device"] = "optimizer_device"
    optimizer: str = Field(description="class from the Optimizer.step#<Class>.step annotation")
    implementation: Literal["fused", "foreach", "per_tensor"] = Field(
        description="fused: one fused kernel per tensor group (fused=True, apex FusedAdam); foreach: several "
        "multi-tensor kernels, one per arithmetic step; per_tensor: element-wise kernels parameter by parameter"
    )
    calls_count: int = measure("count", "optimizer.step() calls in the analysed steps")
    kernels_count: int = measure("count", "kernels and copies they launched")
    kernels_per_call: float = measure("count", "kernels_count / calls_count")
    device_us: float = us("summed duration of that device work")
    share_of_device_time_ratio: float = ratio("device_us / non-communication device time")
    mean_kernel_us: float = us("device_us / kernels_count")


class ActivationRecompute(Fact):
    """Forward layers computed again during the backward pass (activation checkpointing): module-level
    forward operators (conv, linear, norms, attention, ...) run under an autograd backward node."""

    kind: Literal["activation_recompute"] = "activation_recompute"
    recompute_calls_count: int = measure("count", "forward operator calls inside backward nodes")
    recompute_device_us: float = us("device time of the kernels they launched")
    forward_device_us: float = us("device time of the same operators' kernels outside the backward pass")
    recompute_to_forward_ratio: float = measure("ratio", "recompute_device_us / forward_device_us (1: every layer "
                                                "recomputed once)", le=None)  # fmt: skip
    device_compute_us: float = us("non-communication device time")
    share_of_device_time_ratio: float = ratio("recompute_device_us / device_compute_us")
    checkpoint_frames_count: int = measure("count", "Python frames in torch/utils/checkpoint.py (0 without with_stack)")
    peak_allocated_ratio: float | None = ratio("peak allocated device memory / device memory (null: profile_memory "
                                               "off or device memory unknown)", default=None)  # fmt: skip


class DecomposedNorm(Fact):
    """Normalisations written out as separate kernels (a hand-written RMSNorm/LayerNorm: cast, pow,
    mean, add, rsqrt, mul, cast, mul) instead of one fused normalisation kernel."""

    kind: Literal["decomposed_norm"] = "decomposed_norm"
    occurrences_count: int = measure("count", "normalisations found (a mean/variance reduction followed by a "
                                     "[r]sqrt within two kernels)")  # fmt: skip
    kernels_count: int = measure("count", "kernels in them (each counted once)")
    kernels_per_occurrence: float = measure("count", "kernels_count / occurrences_count")
    time_us: float = us("their summed duration")
    share_of_device_time_ratio: float = ratio("time_us / all device activity time")
    fused_norm_time_us: float = us("time of fused normalisation kernels on the rank (class norm)")
    example: list[str] = Field(description="kernels of one occurrence, in order (short names)")


class Fp64DeviceWork(Fact):
    """Kernels that compute in double precision (FP64) on the device."""

    kind: Literal["fp64_device_work"] = "fp64_device_work"
    kernels_count: int = measure("count", "FP64 kernels in the analysed windows")
    time_us: float = us("their summed duration")
    share_of_device_time_ratio: float = ratio("time_us / all device activity time")
    fp64_to_fp32_peak_ratio: float | None = measure("ratio", "the device's FP64 / FP32 vector peak (null: device "
                                                    "unknown)", default=None, le=None)  # fmt: skip
    top_kernel: str = Field(description="the FP64 kernel with the most time (short name)")
    top_operator: str = Field(default="", description="top-level operator that launched most of it")


class GemmAlignment(Fact):
    """Matrix multiplies whose dimensions are not multiples of what the tensor cores load at once
    (8 elements in 16 bit, 4 in FP32/TF32): cuBLAS/CUTLASS fall back to narrow-alignment kernels
    (``align1``/``align2`` in their names) that run far below the peak."""

    kind: Literal["gemm_alignment"] = "gemm_alignment"
    gemm_time_us: float = us("GEMM kernel time")
    misaligned_time_us: float = us("GEMM kernels with a narrow alignment in their name, or launched by a matmul "
                                   "whose K or N is not a multiple of the alignment")  # fmt: skip
    misaligned_count: int = measure("count", "such kernels")
    misaligned_by_name_us: float = us("the part found by kernel name")
    misaligned_by_shape_us: float = us("the part found from the recorded shapes")
    share_of_device_time_ratio: float = ratio("misaligned_time_us / all device activity time")
    share_of_gemm_time_ratio: float = ratio("misaligned_time_us / gemm_time_us")
    misaligned_utilisation_ratio: float | None = ratio("achieved / peak FLOP/s of the misaligned kernels with "
                                                       "attributed FLOPs (null: none)", default=None)  # fmt: skip
    aligned_utilisation_ratio: float | None = ratio("the same for the other GEMM kernels (null: none)", default=None)
    misaligned_slower: bool | None = Field(default=None, description="misaligned_utilisation_ratio < "
                                           "aligned_utilisation_ratio (null: one of them unknown)")  # fmt: skip
    example_kernel: str = Field(default="", description="the misaligned kernel with the most time")
    example_operator: str = Field(default="", description="a misaligned matmul call: operator")
    example_shape: str = Field(default="", description="its input shapes")
    example_dims: str = Field(default="", description="which dimension is off, e.g. 'K=3601'")


class EmbeddingBackward(Fact):
    """The backward pass of embedding lookups computed as a dense gradient of the whole table."""

    kind: Literal["embedding_backward"] = "embedding_backward"
    dense_calls_count: int = measure("count", "dense embedding backward calls")
    dense_device_us: float = us("device time of their kernels")
    share_of_device_time_ratio: float = ratio("dense_device_us / all device activity time")
    sparse_calls_count: int = measure("count", "sparse embedding backward calls (sparse=True)")
    weight_rows: int | None = measure("count", "rows of the largest embedding table (num_weights; null: shapes not "
                                      "recorded)", default=None)  # fmt: skip


class LargeVocabLoss(Fact):
    """Softmax cross-entropy over a language-model vocabulary: the logits tensor (tokens x vocabulary) is
    written, normalised and read again, usually in FP32."""

    kind: Literal["large_vocab_loss"] = "large_vocab_loss"
    vocab_size: int = measure("count", "last dimension of the log-softmax input")
    rows: int = measure("count", "tokens per call (product of the other dimensions)")
    dtype: str = Field(description="dtype of the log-softmax input")
    logits_bytes: float = measure("bytes", "rows x vocab_size x element size of one call")
    calls_count: int = measure("count", "log-softmax / cross-entropy calls in the analysed steps")
    device_us: float = us("device time of the loss kernels (log-softmax, NLL, their backward)")
    share_of_device_time_ratio: float = ratio("device_us / all device activity time")


class AttentionBackends(Fact):
    """Which fused attention kernels ran (from kernel names), and in which dtype the SDPA calls were
    made. Emitted when fused attention kernels ran."""

    kind: Literal["attention_backends"] = "attention_backends"
    attention_time_us: float = us("attention-class kernel time")
    share_of_device_time_ratio: float = ratio("attention_time_us / all device activity time")
    flash_us: float = us("FlashAttention kernels (flash_fwd / flash_bwd, pytorch_flash)")
    efficient_us: float = us("memory-efficient kernels (CUTLASS fmha_cutlassF/B, efficient_attention, xformers)")
    cudnn_us: float = us("cuDNN fused attention kernels")
    other_us: float = us("other attention kernels")
    efficient_share_ratio: float = ratio("efficient_us / attention_time_us")
    sdpa_dtype: str | None = Field(default=None, description="dtype of the SDPA calls with the most time, else the "
                                   "one in the memory-efficient kernels' names (null: unknown)")  # fmt: skip
    compute_capability: float | None = measure("version", "the GPU's compute capability (major.minor; null: not "
                                               "an NVIDIA trace)", default=None, le=None)  # fmt: skip
    sdpa_calls_count: int = measure("count", "aten::scaled_dot_product_attention calls in the analysed steps", default=0)
    masked_calls_count: int = measure("count", "of them, calls given an attention-mask tensor (4th argument)", default=0)
    masked_share_ratio: float = ratio("masked_calls_count / sdpa_calls_count", default=0.0)
    masked_us: float = us("attention kernel time in proportion to the masked calls (attention_time_us x "
                          "masked_share_ratio: forward and backward kernels alike)", default=0.0)
    masked_not_causal_count: int = measure("count", "masked calls with is_causal=False (the mask carries the causality, if any)",
                                         default=0)  # fmt: skip


class GradScalerKernels(Fact):
    """Loss-scaling kernels of torch.amp.GradScaler (unscale and inf check, scale update) and the
    precision of the matrix kernels beside them. Emitted when GradScaler kernels ran."""

    kind: Literal["grad_scaler_kernels"] = "grad_scaler_kernels"
    kernels_count: int = measure("count", "_amp_foreach_non_finite_check_and_unscale_ / _amp_update_scale_ kernels")
    time_us: float = us("their summed duration")
    share_of_device_time_ratio: float = ratio("time_us / all device activity time")
    bf16_matmul_ratio: float = ratio("share of GEMM/conv/attention kernel time in BF16 kernels (by name)")
    fp16_matmul_ratio: float = ratio("share of GEMM/conv/attention kernel time in FP16 kernels (by name)")


class ConvFallback(Fact):
    """Convolutions computed by PyTorch's own CUDA kernels instead of cuDNN / MIOpen: the native
    depthwise kernels (conv_depthwise2d/3d) and the im2col + GEMM path of the slow convolutions.
    Emitted when any ran."""

    kind: Literal["conv_fallback"] = "conv_fallback"
    depthwise_us: float = us("native depthwise convolution kernels (conv_depthwise2d/3d forward, backward, grad weight)")
    im2col_us: float = us("kernels of the im2col/col2im fallback (slow_conv2d, slow_conv_dilated, slow_conv_transpose)")
    fallback_us: float = us("depthwise_us + im2col_us")
    library_conv_us: float = us("convolution kernels of cuDNN / MIOpen beside them")
    share_of_device_time_ratio: float = ratio("fallback_us / all device activity time")
    share_of_conv_time_ratio: float = ratio("fallback_us / (fallback_us + library_conv_us)")
    top_kernel: str = Field(description="the fallback kernel with the most time (short name)")


class NpuCubeAlignment(Fact):
    """Ascend MatMul tasks on the AI Core whose inner axes are not multiples of 256 elements (the Cube
    unit's affinity rule of msprof-analyze's AI Core performance check), among the operator + shape
    groups that move at least ``min_group_mb`` of data (that check's filter)."""

    kind: Literal["npu_cube_alignment"] = "npu_cube_alignment"
    cube_time_us: float = us("time of MatMul tasks on the AI Core")
    checked_groups_count: int = measure("count", "operator + input/output shape groups moving at least min_group_mb")
    misaligned_groups_count: int = measure("count", "of them, those with an inner axis not a multiple of 256")
    misaligned_time_us: float = us("time of the misaligned groups' tasks")
    share_of_device_time_ratio: float = ratio("misaligned_time_us / all device activity time")
    share_of_cube_time_ratio: float = ratio("misaligned_time_us / cube_time_us")
    min_group_mb: float = measure("MB", "a group is checked from this much data (inputs + output x 2 bytes, summed)")
    example_operator: str = Field(default="", description="the misaligned group with the most time: task name")
    example_shapes: str = Field(default="", description="its input shapes")


class NpuFlashAttentionAlignment(Fact):
    """Ascend FlashAttentionScore (and its gradient) tasks whose head dimension or sequence length is
    not a multiple of 128 (the FlashAttention affinity rule of msprof-analyze's AI Core performance
    check)."""

    kind: Literal["npu_fa_alignment"] = "npu_fa_alignment"
    fa_time_us: float = us("time of FlashAttentionScore / FlashAttentionScoreGrad tasks")
    misaligned_time_us: float = us("time of the tasks whose head dimension or sequence length is not a multiple of 128")
    share_of_device_time_ratio: float = ratio("misaligned_time_us / all device activity time")
    share_of_fa_time_ratio: float = ratio("misaligned_time_us / fa_time_us")
    head_dim: int | None = measure("count", "head dimension of the misaligned calls with the most time", default=None)
    seq_len: int | None = measure("count", "their sequence length (null: variable-length layout)", default=None)
    example_shapes: str = Field(default="", description="their input shapes")


class SdpaMathFallback(Fact):
    """scaled_dot_product_attention calls that took PyTorch's unfused math path: the
    aten::_scaled_dot_product_attention_math operator it records when no fused backend accepts the
    inputs, and the kernels it launched (separate matmuls, softmax, dropout)."""

    kind: Literal["sdpa_math_fallback"] = "sdpa_math_fallback"
    calls_count: int = measure("count", "_scaled_dot_product_attention_math calls in the analysed steps")
    device_us: float = us("device time of the kernels they launched")
    share_of_device_time_ratio: float = ratio("device_us / all device activity time")
    dtype: str = Field(default="unknown", description="dtype of q in the call with the most time")
    head_dim: int | None = measure("count", "last dimension of q in that call (null: shapes not recorded)", default=None)
    shape: str = Field(default="", description="its input shapes")
    fused_attention_us: float = us("time of fused attention kernels (flash, memory-efficient, cuDNN) on the rank")


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


class StridedElementwise(Fact):
    """Arithmetic element-wise kernels on ATen's generic launch path (``elementwise_kernel<...>`` with
    an offset calculator per operand), which ATen takes when an operand is not contiguous (a
    transposed or broadcast view); contiguous operands get the vectorised kernel."""

    kind: Literal["strided_elementwise"] = "strided_elementwise"
    elementwise_time_us: float = us("element-wise class kernel time (copies and casts are memory class, not here)")
    generic_time_us: float = us("element-wise kernels on the generic (non-vectorised) path")
    generic_count: int = measure("count", "such kernels")
    vectorized_time_us: float = us("element-wise kernels on the vectorised / unrolled contiguous paths")
    generic_share_ratio: float = ratio("generic_time_us / elementwise_time_us")
    share_of_device_time_ratio: float = ratio("generic_time_us / non-communication device time")
    top_kernel: str = Field(default="", description="the generic-path kernel (short name) with the most time")
    top_operator: str = Field(default="", description="top-level operator that launched most of it")


class TrainModeInference(Fact):
    """A forward-only trace (no autograd backward node runs) whose forward still computes the
    training behaviour of its layers: dropout masks and batch-norm batch statistics, i.e. the model
    was not put in eval() mode for inference."""

    kind: Literal["train_mode_inference"] = "train_mode_inference"
    backward_nodes_count: int = measure("count", "backward operators in the analysed windows: autograd engine and "
                                        "function nodes (...Backward), ATen *_backward ops (0: forward-only)")
    dropout_calls_count: int = measure("count", "aten::native_dropout / aten::bernoulli_ calls that launched kernels")
    batchnorm_train_calls_count: int = measure("count", "batch-norm calls that launched batch-statistics kernels")
    train_mode_kernels_count: int = measure("count", "kernels of dropout masks and batch statistics")
    train_mode_time_us: float = us("their summed duration")
    share_of_device_time_ratio: float = ratio("train_mode_time_us / non-communication device time")
    top_kernel: str = Field(default="", description="the train-mode kernel (short name) with the most time")
    measured_on: Literal["kernels", "operators"] = Field(
        default="kernels", description="kernels: a device trace; operators: a CPU-only trace, where the operators "
        "stand for kernels (the counts and times are of the outermost dropout / batch-norm operators, the share "
        "is of the operators' self time)")


class GemmEpilogue(Fact):
    """Element-wise kernels (a bias or residual add, an activation) that run right after a GEMM on the
    same stream: work a GEMM epilogue applies to each output tile before it is stored, done instead
    as a separate pass that reads and writes the whole output again."""

    kind: Literal["gemm_epilogue"] = "gemm_epilogue"
    gemm_count: int = measure("count", "GEMM kernels (helpers such as split-K reductions excluded)")
    gemm_time_us: float = us("their summed duration")
    epilogue_count: int = measure("count", "element-wise kernels directly after a GEMM on the same stream that add, "
                                  "or apply an activation (gelu, relu, silu, tanh, sigmoid)")  # fmt: skip
    epilogue_time_us: float = us("their summed duration")
    add_time_us: float = us("the part in adds (bias, residual)")
    activation_time_us: float = us("the part in activations")
    share_of_device_time_ratio: float = ratio("epilogue_time_us / non-communication device time")
    epilogue_to_gemm_ratio: float = measure("ratio", "epilogue_time_us / gemm_time_us", le=None)
    top_kernel: str = Field(default="", description="the epilogue kernel (short name) with the most time")


class SortKernels(Fact):
    """Sorting and selection kernels (CUB radix sorts, ATen's bitonic / segmented sorts, top-k) in the
    step: torch.sort / argsort / unique / topk, and the sorts inside deterministic index_put / scatter
    and embedding backward."""

    kind: Literal["sort_kernels"] = "sort_kernels"
    kernels_count: int = measure("count", "sort and top-k kernels in the analysed windows")
    time_us: float = us("their summed duration")
    share_of_device_time_ratio: float = ratio("time_us / non-communication device time")
    top_kernel: str = Field(default="", description="the sort kernel (short name) with the most time")
    top_operator: str = Field(default="", description="top-level operator that launched most of it")
    operators: list[str] = Field(default_factory=list,
                                 description="top-level operators launching sorts, most time first")
