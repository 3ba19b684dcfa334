"""Facts of the compute analyzer (analyzers/compute.py; formulas in docs/analysis/compute.md)."""

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
    flops: float = measure("flops", "FLOPs of all calls (analyzers/flops.py)")
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
